"""Tolerant parsing of SGLang engine responses for the engine client (no torch, no quart), and
the context limit an engine's ``/server_info`` implies (:func:`context_token_limit`).

Engine responses are read leniently (docs/client-quirks.md#lenient-engine-replies): unknown keys are
ignored and optional keys may be missing. Three things are strict, because training depends on them
(docs/client-quirks.md#logprob-and-id-counts): ``output_ids`` must be integers, every output id
needs exactly one finite logprob when logprobs were requested, and a ``finish_reason`` must be
present. A violation is an :class:`~relaxtrio.EngineUnavailableError` (an engine that breaks the
protocol is broken); nothing is ever padded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs

from .._errors import ContextLengthExceededError, EngineRejectedError, EngineUnavailableError
from .._validate import is_int, is_number
from ..forest import WeightSpan

__all__ = [
    "CONTEXT_LENGTH_MARKERS",
    "GenerateResult",
    "context_token_limit",
    "error_from_response",
    "error_message",
    "parse_generate_response",
]

# The texts of SGLang 0.5.23's length checks (docs/client-quirks.md#context-length-error-texts).
CONTEXT_LENGTH_MARKERS: Final = (
    "longer than the model's context length",
    "maximum context length",
    "Requested token count exceeds",
    "exceeds the maximum allowed length",
    "exceeds the KV memory budget",
    "too long after expanding",
)
_MAX_MESSAGE_CHARS: Final = 2000

FinishType = Literal["stop", "length", "abort"]


@attrs.frozen(kw_only=True)
class GenerateResult:
    """One finished (or aborted) ``/generate`` call, normalized.

    Attributes:
        output_ids: generated ids only (no prompt); ends with the stop / EOS id on a stop.
        output_logprobs: ``len == len(output_ids)`` when logprobs were requested, else empty;
            ``log_softmax(logits / T)`` of each sampled id (docs/client-quirks.md#logprob-convention).
        finish_type: ``stop``, ``length`` or ``abort``.
        finish_matched: the stop id / stop string (``stop``), the length (``length``), or None.
        prompt_tokens: prompt length the engine saw; None when the engine did not say
            (waiting-queue aborts).
        completion_tokens: generated token count.
        cached_tokens: prefix-cache hits; None when unknown.
        weight_version: version in force at the end of the request.
        weight_versions: spans over ``output_ids`` indices, one per weight version used.
        text: the engine's decoded text (informational; ids are the truth).
        meta_info: the raw ``meta_info`` object.
    """

    output_ids: tuple[int, ...] = attrs.field(converter=tuple)
    output_logprobs: tuple[float, ...] = attrs.field(converter=tuple)
    finish_type: FinishType
    finish_matched: int | str | None
    prompt_tokens: int | None
    completion_tokens: int
    cached_tokens: int | None
    weight_version: str
    weight_versions: tuple[WeightSpan, ...] = attrs.field(converter=tuple)
    text: str
    meta_info: dict[str, Any] = attrs.field(eq=False, repr=False)


def error_message(content: bytes) -> str:
    """Extract the message of any of SGLang's three error envelopes, else the raw text.

    See docs/client-quirks.md#three-error-envelopes.
    """
    text = content.decode("utf-8", errors="replace")
    try:
        body = json.loads(text)
    except ValueError:
        return text[:_MAX_MESSAGE_CHARS]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, str):
            return error[:_MAX_MESSAGE_CHARS]
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"][:_MAX_MESSAGE_CHARS]
        if isinstance(body.get("message"), str):
            return body["message"][:_MAX_MESSAGE_CHARS]
        if "detail" in body:
            return str(body["detail"])[:_MAX_MESSAGE_CHARS]
    return text[:_MAX_MESSAGE_CHARS]


def error_from_response(
    status_code: int, content: bytes, *, engine_url: str, path: str
) -> ContextLengthExceededError | EngineRejectedError | EngineUnavailableError:
    """Map an HTTP error answer (status >= 400) to the error type that says whose fault it is.

    Returns:
        :class:`~relaxtrio.ContextLengthExceededError` for a 400 carrying one of the
        context-length texts; :class:`~relaxtrio.EngineRejectedError` for any other 4xx (this
        request was refused); :class:`~relaxtrio.EngineUnavailableError` for a 5xx (the engine
        failed). Both engine errors carry ``engine_url`` and ``status_code``.
    """
    message = error_message(content)
    if status_code == 400 and any(marker in message for marker in CONTEXT_LENGTH_MARKERS):
        return ContextLengthExceededError(message)
    text = f"engine {engine_url}{path} answered HTTP {status_code}: {message}"
    if status_code < 500:
        return EngineRejectedError(text, engine_url=engine_url, status_code=status_code)
    return EngineUnavailableError(text, engine_url=engine_url, status_code=status_code)


def _bad(reason: str) -> EngineUnavailableError:
    return EngineUnavailableError(f"malformed /generate response from the engine: {reason}")


def _finish(meta: dict[str, Any]) -> tuple[FinishType, int | str | None]:
    reason = meta.get("finish_reason")
    if not isinstance(reason, dict):
        raise _bad("meta_info.finish_reason is missing (a non-final stream chunk?)")
    kind = reason.get("type")
    if kind == "stop":
        matched = reason.get("matched")
        if isinstance(matched, list) and matched and all(is_int(m) for m in matched):
            matched = matched[-1]
        return "stop", matched if is_int(matched) or isinstance(matched, str) else None
    if kind == "length":
        length = reason.get("length")
        return "length", length if is_int(length) else None
    if kind == "abort":
        return "abort", None
    raise _bad(f"unknown finish_reason type {kind!r}")


def _logprobs(meta: dict[str, Any], output_ids: list[int]) -> list[float]:
    rows = meta.get("output_token_logprobs")
    if not isinstance(rows, list):
        raise _bad("return_logprob was set but meta_info.output_token_logprobs is missing")
    if len(rows) != len(output_ids):
        raise _bad(
            f"{len(rows)} output logprobs for {len(output_ids)} output ids "
            "(see docs/client-quirks.md#logprob-and-id-counts)"
        )
    # What JSON gives, checked at C speed: [float, int, ...] rows whose ids are the output ids.
    try:
        if (all(type(row) is list and len(row) >= 2 and type(row[0]) is float for row in rows)
                and [row[1] for row in rows] == output_ids):
            logprobs = [row[0] for row in rows]
            if all(value == value for value in logprobs):  # no NaN (-inf is a valid logprob)
                return logprobs
    except TypeError:  # an id that does not compare with an int: the checks below name it
        pass
    logprobs = []
    for index, (row, token_id) in enumerate(zip(rows, output_ids, strict=True)):
        if not isinstance(row, list | tuple) or len(row) < 2:
            raise _bad(f"output_token_logprobs[{index}] is not a [logprob, id, text] entry")
        value, row_id = row[0], row[1]
        if row_id != token_id:
            raise _bad(f"output_token_logprobs[{index}] is for id {row_id}, output id {token_id}")
        if not is_number(value) or math.isnan(value):  # -inf is a valid logprob
            raise _bad(f"output_token_logprobs[{index}] has no logprob ({value!r})")
        logprobs.append(float(value))
    return logprobs


def _spans(meta: dict[str, Any], num_ids: int, version: str) -> list[WeightSpan]:
    raw = meta.get("weight_versions")
    if not isinstance(raw, list):  # older servers: one version for the whole response
        return [WeightSpan(version, 0, num_ids)] if num_ids else []
    spans = []
    for item in raw:
        if not isinstance(item, dict):
            raise _bad("weight_versions entries must be objects")
        start, end = item.get("start"), item.get("end")
        if not (is_int(start) and is_int(end) and 0 <= start <= end <= num_ids):
            raise _bad(f"weight_versions span {item!r} is outside the {num_ids} output ids")
        spans.append(WeightSpan(str(item.get("version", version)), start, end))
    return spans


def parse_generate_response(body: Any, *, return_logprob: bool) -> GenerateResult:
    """Normalize one non-streaming ``/generate`` response object.

    Args:
        body: the decoded JSON response.
        return_logprob: whether logprobs were requested (then they are required).

    Raises:
        EngineUnavailableError: the response breaks the protocol (see the module docstring).
    """
    if not isinstance(body, dict):
        raise _bad("expected a JSON object (single-form request)")
    meta = body.get("meta_info")
    if not isinstance(meta, dict):
        raise _bad("meta_info is missing")
    output_ids = body.get("output_ids")
    if not isinstance(output_ids, list) or not (
        all(type(t) is int for t in output_ids) or all(is_int(t) for t in output_ids)
    ):
        raise _bad("output_ids must be a list of integers")
    finish_type, matched = _finish(meta)
    logprobs = _logprobs(meta, output_ids) if return_logprob else []
    version_value = meta.get("weight_version")
    spans = _spans(meta, len(output_ids), str(version_value) if version_value is not None else "")
    if version_value is None:
        version_value = spans[-1].version if spans else "default"
    prompt_tokens = meta.get("prompt_tokens")
    cached_tokens = meta.get("cached_tokens")
    completion_tokens = meta.get("completion_tokens")
    text = body.get("text")
    return GenerateResult(
        output_ids=output_ids,
        output_logprobs=logprobs,
        finish_type=finish_type,
        finish_matched=matched,
        prompt_tokens=prompt_tokens if is_int(prompt_tokens) else None,
        completion_tokens=completion_tokens if is_int(completion_tokens) else len(output_ids),
        cached_tokens=cached_tokens if is_int(cached_tokens) else None,
        weight_version=str(version_value),
        weight_versions=spans,
        text=text if isinstance(text, str) else "",
        meta_info=meta,
    )


def context_token_limit(server_info: Mapping[str, Any]) -> int | None:
    """The most tokens one lineage can hold on an engine, prompt plus generation.

    SGLang refuses a request whose prompt plus explicit ``max_new_tokens`` *reaches* the context
    length (its tokenizer-stage "Requested token count exceeds ..."), then silently clamps
    ``max_new_tokens`` to ``max_req_len - prompt - 1`` with ``max_req_len = context_length - 1``
    (docs/client-quirks.md#silent-clamp-of-max_new_tokens). A budget clamped to
    ``context_length - prompt`` is therefore always refused; ``context_length - 2`` is the most
    that is both accepted and generated in full. Engines that report only ``max_req_input_len``
    (already below the context length) get that.

    Args:
        server_info: the engine's ``/server_info`` (``/get_server_info``) object.

    Returns:
        Tokens (>= 1), or None when the engine reports neither field.
    """
    context = server_info.get("context_length")
    if isinstance(context, int) and context > 2:
        return context - 2
    limit = server_info.get("max_req_input_len")
    return limit if isinstance(limit, int) and limit >= 1 else None
