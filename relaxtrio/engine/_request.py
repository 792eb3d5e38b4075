"""One generation request inside the embedded engine: its state, finish checks and response JSON.

Shapes follow SGLang 0.5.23's ``/generate`` replies:

- ``finish_reason``: ``{"type": "stop", "matched": <id | str>}``, ``{"type": "length",
  "length": n}``, ``{"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}``
  (running) or ``{"type": "abort", "message": "Abort in waiting queue"}`` (waiting);
- ``output_ids`` keep the matched stop / EOS id; ``text`` is trimmed as SGLang trims it (a
  matched stop id or string is left out unless ``no_stop_trim``; docs/client-quirks.md#lenient-engine-replies);
- a request aborted in the waiting queue gets a smaller ``meta_info`` (no ``prompt_tokens``).

Finish checks run in SGLang's order: length first, then stop ids, then stop strings, then stop
regexes. So a stop id sampled as the last allowed token reports ``length``.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs
import trio

from ..sglang.wire import RequestError, SamplingParams, stop_regexes, stop_strings, validate_sampling_values
from ._limits import EngineLimits, check_prompt_fits, resolve_max_new_tokens
from ._vision_inputs import EngineMedia
from .sampling import Choice, ResolvedSampling, RowSampler

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "LockedTokenizer",
    "Req",
    "abort_reason",
    "build_response",
    "check_finished",
    "error_reason",
    "waiting_abort_reason",
]

_TAIL_TOKENS_PER_CHAR: Final = 4  # a character is at most 4 UTF-8 bytes, a token at least 1 byte
_WAITING_ABORT: Final = {"type": "abort", "message": "Abort in waiting queue"}


class LockedTokenizer:
    """A tokenizer whose encode / decode calls are serialized by a lock.

    The worker thread decodes stop-string tails while the trio thread encodes text prompts and
    decodes responses; Hugging Face fast tokenizers may raise ``Already borrowed`` when one
    object is used from two threads at once, so every call goes through this lock (microseconds).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.inner = tokenizer
        self._lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        with self._lock:
            return list(self.inner.encode(text))

    def decode(self, token_ids: Sequence[int], **kwargs: Any) -> str:
        with self._lock:
            return self.inner.decode(list(token_ids), **kwargs)


def error_reason(message: str) -> dict[str, Any]:
    """``finish_reason`` of a request the engine failed (answered as HTTP 500).

    See docs/client-quirks.md#three-error-envelopes.
    """
    return {"type": "abort", "message": message, "status_code": 500,
            "err_type": "InternalServerError"}


def abort_reason() -> dict[str, Any]:
    """``finish_reason`` of a running request stopped by an abort."""
    return {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


@attrs.define(eq=False, kw_only=True)
class Req:
    """State of one ``/generate`` call from submission to its response.

    Mutated by the scheduler only: on the trio thread, or inside the single worker-thread call
    that runs the model. ``len(output_ids) == len(output_logprobs)`` at all times.
    """

    rid: str
    input_ids: tuple[int, ...]  # image placeholders already expanded
    sampling: ResolvedSampling
    sampler: RowSampler
    media: EngineMedia | None = None
    return_logprob: bool = False
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    arrival_s: float = attrs.field(factory=time.perf_counter)  # perf_counter seconds
    state: Literal["waiting", "running", "finished"] = "waiting"
    output_ids: list[int] = attrs.field(factory=list)
    output_logprobs: list[float] = attrs.field(factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = attrs.field(factory=list)
    spans: list[dict[str, Any]] = attrs.field(factory=list)  # {"version", "start", "end"}
    finish_reason: dict[str, Any] | None = None
    aborted_while_waiting: bool = False
    abort_requested: bool = False
    num_retractions: int = 0
    cached_tokens: int = 0  # prompt ids of the last prefill served by the prefix cache
    e2e_latency_s: float = 0.0
    done: trio.Event = attrs.field(factory=trio.Event)

    def append(self, choice: Choice, weight_version: str) -> None:
        """Record one sampled token generated under ``weight_version``."""
        index = len(self.output_ids)
        self.output_ids.append(choice.token_id)
        self.output_logprobs.append(choice.logprob)
        if choice.top is not None:
            self.output_top_logprobs.append(choice.top)
        if self.spans and self.spans[-1]["version"] == weight_version:
            self.spans[-1]["end"] = index + 1
        else:
            self.spans.append({"version": weight_version, "start": index, "end": index + 1})


def check_finished(req: Req, tokenizer: LockedTokenizer) -> dict[str, Any] | None:
    """Return the ``finish_reason`` the newest token triggers, or None to keep going."""
    cfg = req.sampling
    if len(req.output_ids) >= cfg.max_new_tokens:
        return {"type": "length", "length": cfg.max_new_tokens}
    last = req.output_ids[-1]
    if last in cfg.stop_ids:
        return {"type": "stop", "matched": last}
    if cfg.stop or cfg.stop_regex:
        longest = max(len(s) for s in cfg.stop + cfg.stop_regex)
        window = _TAIL_TOKENS_PER_CHAR * longest + 2
        tail = tokenizer.decode(req.output_ids[-window:], skip_special_tokens=False)
        for stop in cfg.stop:
            if stop in tail:
                return {"type": "stop", "matched": stop}
        for pattern in cfg.stop_regex:
            if re.search(pattern, tail):
                return {"type": "stop", "matched": pattern}
    return None


def _response_text(req: Req, tokenizer: LockedTokenizer) -> str:
    cfg = req.sampling
    reason = req.finish_reason or {}
    ids = req.output_ids
    matched = reason.get("matched") if reason.get("type") == "stop" else None
    if isinstance(matched, int) and not cfg.no_stop_trim and ids and ids[-1] == matched:
        ids = ids[:-1]
    text = tokenizer.decode(
        ids,
        skip_special_tokens=cfg.skip_special_tokens,
        spaces_between_special_tokens=cfg.spaces_between_special_tokens,
    )
    if isinstance(matched, str):
        if matched in cfg.stop:
            pos = text.find(matched)
            if pos != -1:
                text = text[: pos + len(matched)] if cfg.no_stop_trim else text[:pos]
        else:
            found = re.search(matched, text)
            if found is not None:
                text = text[: found.end()] if cfg.no_stop_trim else text[: found.start()]
    return text


def _logprob_rows(
    pairs: list[tuple[float, int]], tokenizer: LockedTokenizer, with_text: bool
) -> list[list[Any]]:
    return [
        [logprob, token_id, tokenizer.decode([token_id]) if with_text else None]
        for logprob, token_id in pairs
    ]


def build_response(
    req: Req, tokenizer: LockedTokenizer, *, current_weight_version: str
) -> dict[str, Any]:
    """Render a finished request as SGLang's non-streaming ``/generate`` JSON object."""
    assert req.finish_reason is not None
    spans = [dict(span) for span in req.spans]
    version = spans[-1]["version"] if spans else current_weight_version
    meta: dict[str, Any] = {"id": req.rid, "finish_reason": req.finish_reason}
    if not req.aborted_while_waiting:
        meta["prompt_tokens"] = len(req.input_ids)
    meta["weight_version"] = version
    if not req.aborted_while_waiting:
        meta["num_retractions"] = req.num_retractions
    if req.return_logprob:
        with_text = req.return_text_in_logprobs
        meta["input_token_logprobs"] = []
        meta["output_token_logprobs"] = _logprob_rows(
            list(zip(req.output_logprobs, req.output_ids, strict=True)), tokenizer, with_text
        )
        meta["output_token_logprobs_length"] = len(req.output_ids)
        if req.top_logprobs_num > 0:
            meta["input_top_logprobs"] = []
            meta["output_top_logprobs"] = [
                _logprob_rows(row, tokenizer, with_text) for row in req.output_top_logprobs
            ]
    if not req.aborted_while_waiting:
        meta["reasoning_tokens"] = 0
    meta["completion_tokens"] = len(req.output_ids)
    if not req.aborted_while_waiting:
        meta["cached_tokens"] = req.cached_tokens
    meta["weight_versions"] = spans
    meta["e2e_latency"] = req.e2e_latency_s
    meta["response_sent_to_client_ts"] = time.time()
    return {"text": _response_text(req, tokenizer), "output_ids": list(req.output_ids), "meta_info": meta}


def resolve_sampling(limits: EngineLimits, input_ids: Sequence[int], params: SamplingParams, *,
                     vocab_size: int, eos_ids: frozenset[int]) -> ResolvedSampling:
    """Checks one request against the engine's limits and vocabulary (SGLang's order and texts,
    :mod:`relaxtrio.engine._limits`) and resolves its sampling: ``max_new_tokens`` silently
    clamped, stop strings and regexes read from ``params``.

    Raises:
        RequestError: context overflow, out-of-vocabulary input ids, bad sampling values.
    """
    check_prompt_fits(limits, len(input_ids), params.max_new_tokens)
    if any(not 0 <= t < vocab_size for t in input_ids):
        raise RequestError(f"The input_ids contain values outside the vocabulary [0, {vocab_size}).")
    validate_sampling_values(params, vocab_size=vocab_size)
    max_new_tokens = resolve_max_new_tokens(limits, len(input_ids), params.max_new_tokens)
    return ResolvedSampling.from_params(params, max_new_tokens=max_new_tokens, eos_ids=eos_ids,
                                        stop=stop_strings(params), stop_regex=stop_regexes(params))


def waiting_abort_reason() -> dict[str, Any]:
    """``finish_reason`` of a request aborted while it waited in the queue."""
    return dict(_WAITING_ABORT)
