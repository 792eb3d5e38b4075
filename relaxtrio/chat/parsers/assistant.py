"""Decode rules: generated ids → the canonical assistant message that is committed and returned.

Order (docs/canonical-contract.md#decoding-a-reply):

1. empty output → :class:`~relaxtrio.BackendError`, nothing is committed;
2. finish type: an EOS sampled in the same step as an abort counts as ``stop``
   (docs/client-quirks.md#a-token-after-the-abort, :func:`effective_finish_type`); a remaining
   ``abort`` cannot be committed;
3. text: one trailing stop id is left out of the decoded text, and the text is cut where a
   matched stop string first starts (inside a token when the string starts there), so neither
   appears in ``content``; the ids themselves are never changed, so special
   tokens inside the output cannot shift ids or logprobs
   (docs/client-quirks.md#special-tokens-inside-the-output);
4. reasoning parser on the text, then the tool-call parser on the rest when the subtree has tools;
   a ``length`` finish skips tool-call parsing (a cut-off turn is not executed), which keeps the
   invariant "finish reason ``tool_calls`` if and only if calls are returned"
   (docs/client-quirks.md#tool-call-finish-reason);
5. no content, no reasoning and no calls → :class:`~relaxtrio.BackendError` (not a commit);
6. the message is canonical: ``content`` is ``""`` when only reasoning or calls remain, call ids
   come from :func:`~.tool_calls.tool_call_id`, arguments are canonical JSON text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import attrs

from ..._errors import BackendError, EmptyReplyError, InternalError
from ..._validate import is_int
from .reasoning import UnclosedThinkPolicy, parse_reasoning
from .tool_calls import AUTO, RejectedToolCall, call_id_for, parse_tool_calls_detailed

__all__ = [
    "DecodedAssistant",
    "FinishReason",
    "FinishType",
    "TokenDecoder",
    "decode_assistant",
    "effective_finish_type",
]

FinishType = Literal["stop", "length", "abort"]
FinishReason = Literal["stop", "length", "tool_calls"]


class TokenDecoder(Protocol):
    """Anything that turns ids into text with special tokens kept (a :class:`ChatCompiler`).

    A decoder that also has ``resolve_tool_call_parser(name) -> str | None`` (the compiler does)
    lets ``decode_assistant`` take the tool-call parser ``auto``.
    """

    def decode(self, token_ids: Sequence[int]) -> str: ...


@attrs.frozen
class DecodedAssistant:
    """The committed message plus what the parsers saw.

    Attributes:
        message: canonical assistant message (``role``, ``content``, optional ``reasoning_content``
            and ``tool_calls``).
        finish_reason: ``"stop"``, ``"length"`` or ``"tool_calls"``.
        finish_type: the engine finish type after :func:`effective_finish_type`.
        text: the decoded text the parsers received (stop id left out, cut at the stop string).
        rejected_tool_calls: call-shaped text left in the content (parse status for the node).
    """

    message: Mapping[str, Any]
    finish_reason: FinishReason
    finish_type: FinishType
    text: str
    rejected_tool_calls: tuple[RejectedToolCall, ...] = ()


def effective_finish_type(
    output_ids: Sequence[int], finish_type: str, stop_token_ids: Sequence[int]
) -> FinishType:
    """``stop`` for an abort whose last sampled id is a stop id, else unchanged.

    See docs/client-quirks.md#a-token-after-the-abort.

    Args:
        output_ids: generated ids of the attempt(s) (``(T,)``).
        finish_type: the engine's ``finish_reason.type``: ``stop``, ``length`` or ``abort``.
        stop_token_ids: EOS / end-of-turn ids plus the request's ``stop_token_ids``.

    Raises:
        ValueError: unknown finish type.
    """
    if finish_type not in ("stop", "length", "abort"):
        raise ValueError(f"unknown finish type {finish_type!r}")
    if finish_type == "abort" and output_ids and int(output_ids[-1]) in set(stop_token_ids):
        return "stop"
    return finish_type  # type: ignore[return-value]


def _resolved_parser(tool_call_parser: str | None, compiler: TokenDecoder) -> str | None:
    """``tool_call_parser`` with ``auto`` resolved from the compiler's chat template.

    Raises:
        ValueError: ``auto`` with a decoder that knows no template, or a template it cannot resolve.
    """
    if tool_call_parser != AUTO:
        return tool_call_parser
    resolve = getattr(compiler, "resolve_tool_call_parser", None)
    if resolve is None:
        raise ValueError("tool-call parser 'auto' needs a decoder that knows the chat template")
    resolved: str | None = resolve(tool_call_parser)
    return resolved


def _reply_text(ids: tuple[int, ...], compiler: TokenDecoder, stop_token_ids: Sequence[int],
                matched_stop: int | str | None) -> str:
    """The generated text without its closing stop token, cut where the matched stop string first
    starts (the agent never sees them; the token ids keep everything sampled).

    An engine stops after the token that completes a stop string, and that token may go on past
    it or the string may start inside it (``" "`` in a sampled ``" ~"``), so the cut is at a
    character, not at a token boundary."""
    stops = set(stop_token_ids)
    if is_int(matched_stop):
        stops.add(matched_stop)
    text = compiler.decode(ids[:-1] if ids[-1] in stops else ids)
    if isinstance(matched_stop, str) and matched_stop:
        cut = text.find(matched_stop)
        if cut >= 0:
            text = text[:cut]
    return text


def decode_assistant(
    output_ids: Sequence[int],
    finish_type: str,
    *,
    compiler: TokenDecoder,
    parent_state_hash: str,
    stop_token_ids: Sequence[int],
    reasoning_parser: str | None = None,
    tool_call_parser: str | None = None,
    tools: Sequence[Mapping[str, Any]] = (),
    matched_stop: int | str | None = None,
    prompt_opened_think: bool = False,
    unclosed_think: UnclosedThinkPolicy = "content",
) -> DecodedAssistant:
    """Builds the assistant message of one finished generation (see the module doc).

    Args:
        output_ids: every generated id of the turn, all attempts (``(T,)``); never modified.
        finish_type: engine finish type of the last attempt.
        compiler: decodes ids with special tokens kept.
        parent_state_hash: state hash of the node the turn was generated from (for call ids).
        stop_token_ids: EOS / end-of-turn ids plus the request's ``stop_token_ids``.
        reasoning_parser: ``--agentic-reasoning-parser`` name or None.
        tool_call_parser: ``--agentic-tool-call-parser`` name or None; ``auto`` is resolved with
            ``compiler.resolve_tool_call_parser``.
        tools: the subtree's canonical tools; calls are parsed only when non-empty.
        matched_stop: the engine's ``finish_reason.matched`` (a stop id or a stop string).
        prompt_opened_think: the generation prompt ended inside an opened think block.
        unclosed_think: policy for a stopped generation inside an unclosed think block.

    Raises:
        BackendError: no output ids.
        EmptyReplyError: the parsers leave nothing to return (no text, reasoning or call).
        InternalError: the finish type is still ``abort`` (an aborted attempt is resumed, not
            committed).
        ValueError: unknown parser name or finish type; ``auto`` that the template cannot resolve.
    """
    tool_call_parser = _resolved_parser(tool_call_parser, compiler)
    ids = tuple(int(i) for i in output_ids)
    if not ids:
        raise BackendError("Generation backend returned a terminal response without output tokens")
    finish = effective_finish_type(ids, finish_type, stop_token_ids)
    if finish == "abort":
        raise InternalError("an aborted generation cannot be turned into an assistant message; resume it first")
    text = _reply_text(ids, compiler, stop_token_ids, matched_stop)

    reasoning, rest = parse_reasoning(
        text,
        reasoning_parser,
        prompt_opened_think=prompt_opened_think,
        finish_type=finish,
        unclosed_think=unclosed_think,
    )
    parse = parse_tool_calls_detailed(rest, tool_call_parser if finish != "length" else None, tools)
    if not parse.content and reasoning is None and not parse.calls:
        raise EmptyReplyError(
            "Response parsers produced an empty assistant message "
            f"({len(ids)} output tokens, finish {finish}); nothing is committed"
        )

    message: dict[str, Any] = {"role": "assistant", "content": parse.content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if parse.calls:
        message["tool_calls"] = [
            {
                "id": call_id_for(tool_call_parser, call, parent_state_hash, ids, index),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for index, call in enumerate(parse.calls)
        ]
    reason: FinishReason = "length" if finish == "length" else "tool_calls" if parse.calls else "stop"
    return DecodedAssistant(message, reason, finish, text, parse.rejected)
