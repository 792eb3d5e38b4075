"""Client-facing logprobs: the generated tokens that make up ``message.content``.

See docs/client-quirks.md#logprobs-of-the-content-only.

The committed response keeps a logprob for every sampled id (reasoning, tool-call markup, the
EOS) for training. OpenAI's ``choices[0].logprobs.content`` describes the returned ``content``
only, so a client lining logprobs up with the text must not see the think block, the tool-call
markup or the stop token. The span is found on the decoded text: each token covers the characters
its prefix decode adds; tokens overlapping the content's place in the decoded text are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..nursery.turns import TokenLogprob


class _Decoder(Protocol):
    def decode(self, token_ids: Sequence[int]) -> str: ...


def content_logprobs(
    decoder: _Decoder, token_ids: Sequence[int], logprobs: Sequence[float], content: str
) -> tuple[TokenLogprob, ...]:
    """Logprob entries of the tokens that produced ``content``.

    Args:
        decoder: decodes ids with special tokens kept (a ChatCompiler).
        token_ids: the turn's generated ids, ``(T,)``.
        logprobs: their rollout logprobs, ``len == T``.
        content: the committed ``content`` text ("" when the turn is only reasoning / calls).

    Returns:
        One entry per content token, in order; empty when ``content`` is empty or cannot be
        located in the decoded text.
    """
    if not content:
        return ()
    ends = [len(decoder.decode(token_ids[: i + 1])) for i in range(len(token_ids))]
    text = decoder.decode(token_ids)
    start = text.find(content)
    if start < 0:
        return ()
    stop = start + len(content)
    out = []
    begin = 0
    for tid, lp, end in zip(token_ids, logprobs, ends, strict=True):
        if end > start and begin < stop:
            out.append(TokenLogprob(token=decoder.decode([tid]), logprob=lp))
        begin = end
    return tuple(out)
