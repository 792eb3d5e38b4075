"""Canonical JSON: the one serialization behind every state hash and every stored value.

Every value the forest keeps is plain JSON (dict with string keys, list, str, int, finite float,
bool, None) copied out of the caller's objects, so normalization never aliases its input and the
compact, key-sorted serialization is deterministic across processes and ``PYTHONHASHSEED``.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

from .._errors import InvalidRequestError
from .._validate import type_name

MAX_SAFE_INTEGER: Final = 2**53 - 1
"""Largest integral float turned into an int (JavaScript's ``Number.MAX_SAFE_INTEGER``)."""

_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False)


def dumps(value: Any) -> str:
    """Compact, key-sorted JSON text with non-ASCII characters kept (the hash serialization).

    Same text as ``json.dumps(value, ensure_ascii=False, separators=(",", ":"),
    sort_keys=True)``, with one shared (stateless) encoder.

    Raises:
        ValueError: a non-finite float. TypeError: a value JSON cannot represent.
    """
    return _ENCODER.encode(value)


class _BadJson(Exception):
    """A non-JSON value deep inside a structure; ``path`` is filled in while unwinding."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []


def _copy(value: Any, integral_to_int: bool) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _BadJson("numbers must be finite")
        if integral_to_int and value.is_integer() and abs(value) <= MAX_SAFE_INTEGER:
            return int(value)
        return value
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _BadJson("object keys must be strings")
            try:
                out[key] = _copy(item, integral_to_int)
            except _BadJson as exc:
                exc.path.append(f".{key}")
                raise
        return out
    if isinstance(value, (list, tuple)):
        items: list[Any] = []
        for index, item in enumerate(value):
            try:
                items.append(_copy(item, integral_to_int))
            except _BadJson as exc:
                exc.path.append(f"[{index}]")
                raise
        return items
    raise _BadJson(f"must contain only JSON values, got {type_name(value)}")


def copy_json(value: Any, param: str, *, integral_to_int: bool = False) -> Any:
    """Deep-copies a JSON value, checking that it holds only JSON types.

    Dicts keep their key order (the hash sorts keys itself); tuples become lists.

    Args:
        value: the value to copy.
        param: the request field path of ``value``, e.g. ``messages[2].content``.
        integral_to_int: turn integral floats with ``|x| <= 2**53 - 1`` into ints (the
            JavaScript ``JSON.stringify`` spelling, used for tool-call arguments).

    Returns:
        A fresh structure sharing nothing mutable with ``value``.

    Raises:
        InvalidRequestError: a non-string key, a non-finite number or a non-JSON value; ``param``
            is the path of the offending element (``messages[0].content[1].x``).
    """
    try:
        return _copy(value, integral_to_int)
    except _BadJson as exc:
        raise InvalidRequestError.at(param + "".join(reversed(exc.path)), exc.reason) from None


def canonical_arguments(arguments: Any, *, param: str) -> str:
    """Canonicalizes tool-call arguments to one compact, key-sorted JSON object string.

    A JSON string is parsed (duplicate keys, ``NaN``/``Infinity`` and invalid JSON rejected), a
    dict is taken as is; the object is re-serialized with sorted keys, compact separators and
    non-ASCII kept, integral floats written as ints. So Python's ``'{"c": "d", "a": 1.0}'`` and
    TypeScript's ``'{"a":1,"c":"d"}'`` are the same arguments.

    Args:
        arguments: a JSON object text or a dict.
        param: the field path, e.g. ``messages[2].tool_calls[0].function.arguments``.

    Returns:
        The canonical JSON object text.

    Raises:
        InvalidRequestError: invalid JSON, duplicate keys, non-finite numbers or not an object.
    """
    if isinstance(arguments, str):

        def reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
            parsed: dict[str, Any] = {}
            for key, item in pairs:
                if key in parsed:
                    raise InvalidRequestError.at(param, f"contains duplicate key: {key}")
                parsed[key] = item
            return parsed

        def reject_constant(name: str) -> None:
            raise InvalidRequestError.at(param, f"contains non-finite number: {name}")

        try:
            arguments = json.loads(
                arguments, object_pairs_hook=reject_duplicates, parse_constant=reject_constant
            )
        except json.JSONDecodeError:
            raise InvalidRequestError.at(param, "must be valid JSON") from None
    if not isinstance(arguments, dict):
        raise InvalidRequestError.at(
            param, f"must be a JSON object or a JSON string encoding an object, got {type_name(arguments)}"
        )
    try:
        return dumps(_copy(arguments, True))
    except _BadJson as exc:  # the path inside the JSON text is not a request field
        raise InvalidRequestError.at(param, exc.reason, subpath="".join(reversed(exc.path))) from None
