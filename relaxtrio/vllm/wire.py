"""Translation between relaxtrio's engine types and vLLM 0.32's token API JSON (no torch).

Requests: relaxtrio callers build SGLang-native :class:`~relaxtrio.sglang.wire.SamplingParams`
(the one sampling vocabulary of the project); :func:`vllm_sampling_params` renames them for
vLLM. Replies: :func:`parse_generate_response` turns a ``/inference/v1/generate`` answer into the
shared :class:`~relaxtrio.sglang._replies.GenerateResult`, with the same strictness as the SGLang
parser (every output id needs exactly one finite logprob when logprobs were asked for; a broken
reply is an :class:`~relaxtrio.EngineUnavailableError`, nothing is padded).

The shapes, as a vLLM 0.32.0 CPU server answered them (see :mod:`relaxtrio.vllm.client` for the
routes)::

    {"request_id": "generate-tokens-<rid>", "model": "<model dir>", "created": 1796428812,
     "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
               "prompt_tokens_details": null, "completion_tokens_details": null},
     "output_mode": "tokens", "prompt_token_ids": null, "metrics": null, ...,
     "choices": [{"index": 0, "finish_reason": "length", "stop_reason": null,
                  "token_ids": [198, 1, 4093, 198, 57],
                  "weight_versions": [{"version": "default", "start": 0, "end": 5}],
                  "logprobs": {"content": [{"token_id": 198, "logprob": -6.9e-05, "rank": 1,
                                            "top_logprobs": [{"token_id": 198, ...}]}, ...]},
                  "routed_experts": null, "sampling_mask": null}]}

- ``finish_reason`` is ``"stop"`` (EOS: ``stop_reason`` null; a ``stop_token_ids`` id: that
  int; a stop string: that string), ``"length"``, or ``"abort"`` (an abort, or a pause with
  mode ``abort``: the partial ``token_ids``, logprobs and spans are all there).
- ``weight_versions`` spans cover ``[start, end)`` of ``token_ids``; a request that outlived a
  weight update has one span per version.
- ``prompt_tokens_details.cached_tokens`` is filled only on a server started with
  ``--enable-prompt-tokens-details``; otherwise the prefix-cache hits are unknown here (the
  server's ``/metrics`` counts them: ``vllm:prefix_cache_hits_total``).
- Errors are ``{"error": {"message", "type", "param", "code"}}`` with HTTP 400 for a refused
  request (pydantic validation: empty or negative ``token_ids``, a value of the wrong JSON type;
  sampling values out of range; an id outside the vocabulary; a prompt of ``max_model_len``
  tokens or more: "... is longer than the maximum model length of N ..."). Unknown
  ``sampling_params`` keys are ignored, not refused. A prompt that fits but whose
  ``max_tokens`` does not is silently clamped: generation stops at ``max_model_len`` total
  tokens with ``finish_reason: "length"``.
"""

from __future__ import annotations

import math
from typing import Any, Final

from .._errors import (
    ContextLengthExceededError,
    EngineRejectedError,
    EngineUnavailableError,
    InvalidRequestError,
)
from .._validate import is_int, is_number
from ..forest import WeightSpan
from ..sglang._replies import (
    CONTEXT_LENGTH_MARKERS,
    FinishType,
    GenerateResult,
    error_message,
)
from ..sglang._replies import error_from_response as sglang_error_from_response
from ..sglang.wire import SamplingParams

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "VLLM_CONTEXT_LENGTH_MARKERS",
    "error_from_response",
    "parse_generate_response",
    "server_request_id",
    "vllm_sampling_params",
]

DEFAULT_MAX_NEW_TOKENS: Final = 128
"""Tokens generated when ``max_new_tokens`` is None: SGLang's server default. vLLM's token API
would otherwise generate up to the whole context."""

REQUEST_ID_PREFIX: Final = "generate-tokens-"
"""vLLM's token API prefixes every request id with this; abort takes only the prefixed id."""

VLLM_CONTEXT_LENGTH_MARKERS: Final = (
    *CONTEXT_LENGTH_MARKERS,
    "longer than the maximum model length",
)
"""Texts of a 400 that means "the prompt does not fit the context" (vLLM 0.32 and SGLang)."""

# SGLang-native names that vLLM spells differently; the rest pass through unchanged.
_RENAMED: Final = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "sampling_seed": "seed",
    "no_stop_trim": "include_stop_str_in_output",
}
_PASSED: Final = (
    "stop", "stop_token_ids", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
    "presence_penalty", "repetition_penalty", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "logit_bias",
)
# Fields with no vLLM token-API equivalent that this client implements (refused, never dropped).
_REFUSED: Final = ("stop_regex", "json_schema", "regex", "ebnf", "structural_tag", "custom_params")


def server_request_id(rid: str) -> str:
    """The id vLLM's token API gives request ``rid`` (``generate-tokens-<rid>``): abort's key."""
    return REQUEST_ID_PREFIX + rid


def vllm_sampling_params(sampling: SamplingParams, *, return_logprob: bool) -> dict[str, Any]:
    """The ``sampling_params`` object of a ``/inference/v1/generate`` body.

    Renames ``max_new_tokens`` → ``max_tokens`` (default :data:`DEFAULT_MAX_NEW_TOKENS`),
    ``min_new_tokens`` → ``min_tokens``, ``sampling_seed`` → ``seed``, ``no_stop_trim`` →
    ``include_stop_str_in_output``; asks for the sampled token's logprob (``logprobs: 0``) when
    ``return_logprob``; turns detokenization off unless stop strings need it (the token API
    returns ids only, and detokenizing costs engine CPU per token). ``stream_interval`` is
    dropped (replies are not streamed).

    Args:
        sampling: the SGLang-native parameters; ``max_new_tokens`` must be >= 1 here.
        return_logprob: ask for per-token logprobs.

    Raises:
        InvalidRequestError: a field vLLM's token API has no equivalent for (``stop_regex``,
            constrained decoding, ``custom_params``), or ``n`` > 1; ``param`` names the field.
    """
    wire = sampling.to_json()
    for name in _REFUSED:
        if name in wire:
            raise InvalidRequestError(
                f"sampling_params.{name} is not supported by the vLLM engine client",
                param=f"sampling_params.{name}")
    if wire.get("n", 1) != 1:
        raise InvalidRequestError("sampling_params.n must be 1 (send n separate requests)",
                                  param="sampling_params.n")
    out: dict[str, Any] = {"max_tokens": DEFAULT_MAX_NEW_TOKENS}
    for name, value in wire.items():
        if name in _RENAMED:
            out[_RENAMED[name]] = value
        elif name in _PASSED:
            out[name] = value
    if return_logprob:
        out["logprobs"] = 0
    if not out.get("stop"):
        out["detokenize"] = False
    return out


def error_from_response(
    status_code: int, content: bytes, *, engine_url: str, path: str
) -> ContextLengthExceededError | EngineRejectedError | EngineUnavailableError:
    """Map an HTTP error answer (status >= 400) of a vLLM server to the error that says whose
    fault it is: as :func:`relaxtrio.sglang._replies.error_from_response`, with vLLM's
    context-length text also read as :class:`~relaxtrio.ContextLengthExceededError`."""
    if status_code == 400:
        message = error_message(content)
        if any(marker in message for marker in VLLM_CONTEXT_LENGTH_MARKERS):
            return ContextLengthExceededError(message)
    return sglang_error_from_response(status_code, content, engine_url=engine_url, path=path)


def _bad(reason: str) -> EngineUnavailableError:
    return EngineUnavailableError(f"malformed /inference/v1/generate response from vLLM: {reason}")


def _finish(choice: dict[str, Any], output_ids: list[int]) -> tuple[FinishType, int | str | None]:
    """``finish_type`` and ``finish_matched`` in the SGLang parser's terms."""
    reason, matched = choice.get("finish_reason"), choice.get("stop_reason")
    if reason == "stop":
        if is_int(matched) or isinstance(matched, str):
            return "stop", matched
        return "stop", output_ids[-1] if output_ids else None  # EOS: the id that stopped it
    if reason == "length":
        return "length", len(output_ids)
    if reason == "abort":
        return "abort", None
    raise _bad(f"unknown finish_reason {reason!r}")


def _logprobs(choice: dict[str, Any], output_ids: list[int]) -> list[float]:
    block = choice.get("logprobs")
    rows = block.get("content") if isinstance(block, dict) else None
    if not isinstance(rows, list):
        raise _bad("logprobs were requested but choices[0].logprobs.content is missing")
    if len(rows) != len(output_ids):
        raise _bad(f"{len(rows)} output logprobs for {len(output_ids)} output ids")
    logprobs = []
    for index, (row, token_id) in enumerate(zip(rows, output_ids, strict=True)):
        if not isinstance(row, dict):
            raise _bad(f"logprobs.content[{index}] is not an object")
        if row.get("token_id") != token_id:
            raise _bad(f"logprobs.content[{index}] is for id {row.get('token_id')!r}, "
                       f"output id {token_id}")
        value = row.get("logprob")
        if not is_number(value) or math.isnan(value):  # -inf is a valid logprob
            raise _bad(f"logprobs.content[{index}] has no logprob ({value!r})")
        logprobs.append(float(value))
    return logprobs


def _spans(choice: dict[str, Any], num_ids: int) -> list[WeightSpan]:
    raw = choice.get("weight_versions")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _bad("weight_versions must be a list")
    spans = []
    for item in raw:
        if not isinstance(item, dict):
            raise _bad("weight_versions entries must be objects")
        start, end, version = item.get("start"), item.get("end"), item.get("version")
        if not (is_int(start) and is_int(end) and 0 <= start <= end <= num_ids):
            raise _bad(f"weight_versions span {item!r} is outside the {num_ids} output ids")
        if not isinstance(version, str):
            raise _bad(f"weight_versions span {item!r} has no version")
        spans.append(WeightSpan(version, start, end))
    return spans


def parse_generate_response(body: Any, *, return_logprob: bool, weight_version: str) -> GenerateResult:
    """Normalize one non-streaming ``/inference/v1/generate`` answer.

    Args:
        body: the decoded JSON answer.
        return_logprob: whether logprobs were requested (then they are required).
        weight_version: the label to report when the answer names none (no output tokens,
            hence no span): the last version this client saw the engine load.

    Returns:
        The result; ``text`` is empty (the token API returns ids only) and ``meta_info`` holds
        the answer without its ``choices``.

    Raises:
        EngineUnavailableError: the answer breaks the protocol (see the module docstring).
    """
    if not isinstance(body, dict):
        raise _bad("expected a JSON object")
    choices = body.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise _bad("expected exactly one choice")
    choice = choices[0]
    output_ids = choice.get("token_ids")
    if output_ids is None and choice.get("finish_reason") == "abort":
        output_ids = []  # aborted before its first token
    if not isinstance(output_ids, list) or not all(is_int(t) for t in output_ids):
        raise _bad("choices[0].token_ids must be a list of integers")
    finish_type, matched = _finish(choice, output_ids)
    logprobs = _logprobs(choice, output_ids) if return_logprob and output_ids else []
    spans = _spans(choice, len(output_ids))
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    prompt_tokens, completion_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return GenerateResult(
        output_ids=output_ids,
        output_logprobs=logprobs,
        finish_type=finish_type,
        finish_matched=matched,
        prompt_tokens=prompt_tokens if is_int(prompt_tokens) else None,
        completion_tokens=completion_tokens if is_int(completion_tokens) else len(output_ids),
        cached_tokens=cached if is_int(cached) else None,
        weight_version=spans[-1].version if spans else weight_version,
        weight_versions=spans,
        text="",
        meta_info={key: value for key, value in body.items() if key != "choices"},
    )
