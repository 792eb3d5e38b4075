"""Strict JSON helpers shared by the tool-call parsers.

Arguments leave the parsers in the canonical form (docs/canonical-contract.md#tool-calls-and-arguments):
a JSON object serialized with sorted keys, compact separators and ``ensure_ascii=False``, with
integral floats of magnitude at most 2**53 - 1 written as integers (what JavaScript's
``JSON.stringify`` does). NaN, infinities and duplicate keys make a call malformed rather than
producing JSON other tools cannot read.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

MAX_SAFE_INTEGER: Final[int] = 2**53 - 1


class _DuplicateKeyError(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKeyError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_DECODER: Final = json.JSONDecoder(object_pairs_hook=_unique_pairs, parse_constant=_reject_constant)


def loads_strict(text: str) -> Any:
    """Parses one JSON value that fills ``text`` (surrounding whitespace allowed).

    Raises:
        ValueError: invalid JSON, trailing data, a duplicate key, NaN or an infinity.
    """
    return _DECODER.decode(text)


def raw_decode_strict(text: str, index: int) -> tuple[Any, int]:
    """Parses one JSON value starting at ``text[index]``; returns it and the end index.

    Raises:
        ValueError: as :func:`loads_strict`.
    """
    return _DECODER.raw_decode(text, index)


def _normalized(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("non-finite number")
        if value.is_integer() and abs(value) <= MAX_SAFE_INTEGER:
            return int(value)
        return value
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise ValueError("object keys must be strings")
        return {key: _normalized(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalized(item) for item in value]
    raise ValueError(f"{type(value).__name__} is not a JSON value")


def canonical_arguments(arguments: Any) -> str:
    """Canonical JSON object text of tool-call arguments.

    Args:
        arguments: a mapping of JSON values.

    Raises:
        ValueError: ``arguments`` is not a dict of JSON values, or holds a non-finite number.
    """
    if not isinstance(arguments, dict):
        raise ValueError("arguments must be a JSON object")
    normalized = _normalized(arguments)
    return json.dumps(normalized, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
