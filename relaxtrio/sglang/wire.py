"""Wire model of SGLang's native ``sampling_params`` and the schema gate of ``POST /generate``.

Shared by the engine client (which builds :class:`SamplingParams`) and the embedded engine server
(which validates incoming bodies the way SGLang 0.5.23 does). Imports no torch.

Keys, types and value rules follow SGLang 0.5.23 (docs/client-quirks.md#strict-sampling-params). Two
kinds of 400 exist, with different envelopes (docs/client-quirks.md#three-error-envelopes):

- :class:`SchemaError`: the JSON contract failed (unknown ``sampling_params`` key, wrong JSON
  type); body ``{"error": "<serde-style message>"}``.
- :class:`RequestError`: a value was rejected while the request was handled (bad sampling value,
  context length, duplicate rid); body ``{"error": {"message": "<text>"}}``.
"""

from __future__ import annotations

import math
import re
from typing import Any, Final, Literal

import attrs

from .._validate import is_int, is_number, is_real

__all__ = [
    "SAMPLING_PARAM_KEYS",
    "RequestError",
    "SamplingParams",
    "SchemaError",
    "parse_sampling_params",
    "validate_sampling_values",
]

MAX_STOP_STRINGS: Final = 32
MAX_STOP_REGEX_BYTES: Final = 256


class SchemaError(Exception):
    """A body failed the JSON contract; rendered as HTTP 400 ``{"error": message}``."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def to_json(self) -> dict[str, Any]:
        return {"error": self.message}


class RequestError(Exception):
    """A request was rejected while handled; rendered as ``{"error": {"message": message}}``.

    Args:
        message: the SGLang-compatible text (clients match substrings of it).
        status: HTTP status, 400 unless stated.
    """

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message = message
        self.status = status

    def to_json(self) -> dict[str, Any]:
        return {"error": {"message": self.message}}


_Kind = Literal["int", "float", "bool", "str", "str_or_list", "int_list", "object"]

# Key order follows SGLang's SamplingParams; it is also the order of the "expected one of" list.
_SAMPLING_KINDS: Final[dict[str, _Kind]] = {
    "max_new_tokens": "int",
    "stop": "str_or_list",
    "stop_token_ids": "int_list",
    "stop_regex": "str_or_list",
    "temperature": "float",
    "top_p": "float",
    "top_k": "int",
    "min_p": "float",
    "frequency_penalty": "float",
    "presence_penalty": "float",
    "repetition_penalty": "float",
    "min_new_tokens": "int",
    "n": "int",
    "json_schema": "str",
    "regex": "str",
    "ebnf": "str",
    "structural_tag": "str",
    "ignore_eos": "bool",
    "skip_special_tokens": "bool",
    "spaces_between_special_tokens": "bool",
    "no_stop_trim": "bool",
    "custom_params": "object",
    "stream_interval": "int",
    "logit_bias": "object",
    "sampling_seed": "int",
}
SAMPLING_PARAM_KEYS: Final = tuple(_SAMPLING_KINDS)


@attrs.frozen(kw_only=True)
class SamplingParams:
    """SGLang native ``sampling_params``; ``None`` means "server default".

    :meth:`to_json` leaves ``None`` fields out, because a few SGLang fields reject ``null`` and the
    router drops keys it does not model (docs/client-quirks.md#strict-sampling-params). There is no
    ``seed`` / ``max_tokens`` here: the native API has neither.

    Attributes:
        max_new_tokens: cap on generated tokens (server default 128; silently clamped to the
            context, the clamped value is reported in ``finish_reason.length``).
        stop: stop strings matched on decoded text (at most 32).
        stop_token_ids: extra stop ids; EOS ids always stop unless ``ignore_eos``.
        stop_regex: stop patterns (at most 32, each at most 256 bytes).
        temperature: >= 0; below 1e-6 means greedy.
        top_p: in (0, 1].
        top_k: -1 (off) or >= 1.
        min_p: in [0, 1].
        frequency_penalty: in [-2, 2].
        presence_penalty: in [-2, 2].
        repetition_penalty: in (0, 2].
        min_new_tokens: EOS / stop ids are masked until this many tokens exist.
        n: parallel samples; relaxtrio always sends separate requests instead.
        json_schema: constrained decoding (not supported by the embedded engine).
        regex: constrained decoding (not supported by the embedded engine).
        ebnf: constrained decoding (not supported by the embedded engine).
        structural_tag: constrained decoding (not supported by the embedded engine).
        ignore_eos: do not stop on EOS ids nor on ``stop_token_ids``.
        skip_special_tokens: affects ``text`` only.
        spaces_between_special_tokens: affects ``text`` only.
        no_stop_trim: keep the stop string / token in ``text``.
        custom_params: custom logit processor parameters (not supported by the embedded engine).
        stream_interval: tokens per streamed chunk.
        logit_bias: ``{"<token id>": bias}`` added to the logits.
        sampling_seed: per-request seed (signed 64-bit).
    """

    max_new_tokens: int | None = None
    stop: str | tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    stop_regex: str | tuple[str, ...] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    min_new_tokens: int | None = None
    n: int | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    custom_params: dict[str, Any] | None = None
    stream_interval: int | None = None
    logit_bias: dict[str, float] | None = None
    sampling_seed: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the JSON object to send, without ``None`` values (tuples become lists)."""
        out: dict[str, Any] = {}
        for name in _SAMPLING_FIELD_NAMES:
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if isinstance(value, tuple) else value
        return out


_SAMPLING_FIELD_NAMES: Final = tuple(field.name for field in attrs.fields(SamplingParams))


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, list):
        return "sequence"
    if isinstance(value, dict):
        return "map"
    return "null"


def _invalid_type(key: str, value: Any, expected: str) -> SchemaError:
    return SchemaError(f"invalid type: {_type_name(value)}, expected {expected} (field `{key}`)")


def _check_kind(key: str, kind: _Kind, value: Any) -> Any:
    """Check one non-null value against its JSON kind; return it in SamplingParams form."""
    if kind == "int":
        if not is_int(value):
            raise _invalid_type(key, value, "an integer")
        if key == "sampling_seed" and not -(2**63) <= value < 2**63:
            raise SchemaError(f"invalid value: integer `{value}`, expected i64 (field `{key}`)")
        return value
    if kind == "float":
        if not is_number(value):
            raise _invalid_type(key, value, "a number")
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise _invalid_type(key, value, "a boolean")
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise _invalid_type(key, value, "a string")
        return value
    if kind == "str_or_list":
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise _invalid_type(key, value, "a string or a sequence of strings")
    if kind == "int_list":
        if isinstance(value, list) and all(is_int(v) for v in value):
            return tuple(value)
        raise _invalid_type(key, value, "a sequence of integers")
    if not isinstance(value, dict):
        raise _invalid_type(key, value, "a map")
    return dict(value)


def parse_sampling_params(raw: Any) -> SamplingParams:
    """Apply SGLang 0.5.23's schema gate to a ``sampling_params`` JSON value.

    Args:
        raw: the decoded JSON value (``None`` / absent means ``{}``).

    Returns:
        The parsed parameters; ``null`` values stay ``None`` (server default).

    Raises:
        SchemaError: an unknown key (serde-style ``unknown field `x`, expected one of …``) or a
            value of the wrong JSON type (integers must be JSON integers; numbers accept ints).
    """
    if raw is None:
        return SamplingParams()
    if not isinstance(raw, dict):
        raise _invalid_type("sampling_params", raw, "struct SamplingParams")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        kind = _SAMPLING_KINDS.get(key)
        if kind is None:
            expected = ", ".join(f"`{k}`" for k in SAMPLING_PARAM_KEYS)
            raise SchemaError(f"unknown field `{key}`, expected one of {expected}")
        if value is not None:
            values[key] = _check_kind(key, kind, value)
    return SamplingParams(**values)


def _as_tuple(value: str | tuple[str, ...] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def validate_sampling_values(params: SamplingParams, *, vocab_size: int) -> None:
    """Check value ranges the way SGLang's ``SamplingParams.verify`` does.

    Args:
        params: output of :func:`parse_sampling_params`.
        vocab_size: number of token ids the model accepts (``logit_bias`` keys are checked).

    Raises:
        RequestError: the first value out of range, with a message naming the key and value.
    """
    p = params
    if p.temperature is not None and (p.temperature < 0 or not math.isfinite(p.temperature)):
        raise RequestError(f"temperature must be a non-negative finite number, got {p.temperature}.")
    if p.top_p is not None and not 0 < p.top_p <= 1:
        raise RequestError(f"top_p must be in (0, 1], got {p.top_p}.")
    if p.min_p is not None and not 0 <= p.min_p <= 1:
        raise RequestError(f"min_p must be in [0, 1], got {p.min_p}.")
    if p.top_k is not None and p.top_k < 1 and p.top_k != -1:
        raise RequestError(f"top_k must be -1 (disable), or at least 1, got {p.top_k}.")
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(p, name)
        if value is not None and not -2 <= value <= 2:
            raise RequestError(f"{name} must be in [-2, 2], got {value}.")
    if p.repetition_penalty is not None and not 0 < p.repetition_penalty <= 2:
        raise RequestError(f"repetition_penalty must be in (0, 2], got {p.repetition_penalty}.")
    if p.max_new_tokens is not None and p.max_new_tokens < 0:
        raise RequestError(f"max_new_tokens must be at least 0, got {p.max_new_tokens}.")
    if p.min_new_tokens is not None:
        upper = p.max_new_tokens if p.max_new_tokens is not None else math.inf
        if not 0 <= p.min_new_tokens <= upper:
            raise RequestError(
                f"min_new_tokens must be in [0, max_new_tokens], got {p.min_new_tokens}."
            )
    if p.n is not None and p.n < 1:
        raise RequestError(f"n must be at least 1, got {p.n}.")
    if p.n is not None and p.n > 1:
        raise RequestError(
            f"n > 1 is not supported by the relaxtrio embedded engine (got {p.n}); "
            "send n separate requests with their own rids."
        )
    if len(_as_tuple(p.stop)) > MAX_STOP_STRINGS:
        raise RequestError(f"stop may contain at most {MAX_STOP_STRINGS} strings.")
    regexes = _as_tuple(p.stop_regex)
    if len(regexes) > MAX_STOP_STRINGS or any(
        len(r.encode()) > MAX_STOP_REGEX_BYTES for r in regexes
    ):
        raise RequestError(
            f"stop_regex may contain at most {MAX_STOP_STRINGS} patterns of at most "
            f"{MAX_STOP_REGEX_BYTES} bytes each."
        )
    for pattern in regexes:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise RequestError(f"stop_regex {pattern!r} is not a valid pattern: {exc}.") from exc
    if p.stream_interval is not None and p.stream_interval < 1:
        raise RequestError(f"stream_interval must be at least 1, got {p.stream_interval}.")
    for name in ("json_schema", "regex", "ebnf", "structural_tag", "custom_params"):
        if getattr(p, name) is not None:
            raise RequestError(f"{name} is not supported by the relaxtrio embedded engine.")
    for key, bias in (p.logit_bias or {}).items():
        if not key.lstrip("-").isdigit() or not 0 <= int(key) < vocab_size:
            raise RequestError(f"logit_bias key {key!r} is not a token id in [0, {vocab_size}).")
        if not is_real(bias):
            raise RequestError(f"logit_bias value for {key} must be a finite number, got {bias!r}.")
    if any(not 0 <= t < vocab_size for t in p.stop_token_ids or ()):
        raise RequestError(f"stop_token_ids must be token ids in [0, {vocab_size}).")


def stop_strings(params: SamplingParams) -> tuple[str, ...]:
    """``stop`` as a tuple of non-empty strings."""
    return tuple(s for s in _as_tuple(params.stop) if s)


def stop_regexes(params: SamplingParams) -> tuple[str, ...]:
    """``stop_regex`` as a tuple of non-empty patterns."""
    return tuple(s for s in _as_tuple(params.stop_regex) if s)
