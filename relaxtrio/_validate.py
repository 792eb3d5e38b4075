"""One validation vocabulary: the checks that recur across wire models, configs, rows and outputs.

Every check that fails says it one way: ``"<path> must be <what>, got <what it was>"``, where
``<what it was>`` is the JSON type name (:func:`type_name`: ``object``, ``array``, ``string``,
``integer``, ``number``, ``boolean``, ``null``) for a value of the wrong kind, and the value
itself (``0``, ``nan``) for a number out of range. The kinds are ``an object`` (a JSON object,
i.e. a ``dict``), ``a list``, ``a finite number`` (``bool`` is never a number) and ``a positive
integer``. The error is built with :meth:`~relaxtrio.RelaxError.at`, so it carries ``param=path``
and can be re-reported at another path (a protocol's own field, a command-line flag).

* ``require_*`` functions return the checked value or raise ``error``: by default
  :class:`~relaxtrio.InvalidRequestError` (a client's request); pass
  :class:`~relaxtrio.ConfigError` for flags and dataset rows, :class:`~relaxtrio.ExportError`
  for agent output, or ``ValueError`` for plain programming contracts. With ``optional=True``
  a ``None`` (JSON ``null``) is "absent" and returned as is.
* ``is_*`` predicates are the same tests without an error, for callers whose message names
  something other than a field path ("custom advantage for session 2 context 'main'").
* :func:`loads_utf8_json` decodes a request body (the agent API's and the embedded engine's):
  UTF-8 only, each caller wrapping its ``ValueError`` in its own envelope.
* :func:`count` words a number of things the way every message and summary line does
  (``"1 sample"``, ``"3 samples"``); the run summary, the CLI and ``serve`` share it.
* The ``attrs`` validators at the bottom apply the checks to config fields; they raise
  :class:`~relaxtrio.ConfigError` (a ``ValueError``, as attrs expects) with ``param`` set to the
  field name.

Out of scope on purpose: the embedded engine and the SGLang wire parser answer in SGLang's own
wording (``invalid type: ..., expected ... (field `x`)``) so clients see what a real SGLang server
says; they use the predicates here but keep their messages.

Decision (issue 9): relaxtrio does not use cattrs. The request models and configs are validated by
these few helpers; the ``cattrs`` pin, which nothing imported, was dropped from ``pyproject.toml``.
One hand-written vocabulary keeps every message naming the request path the client sent, which a
structuring library would have to be taught field by field anyway.

May import: the standard library, attrs and :mod:`relaxtrio._errors` only (``relaxtrio.forest``
uses it, and the forest stays pure).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, Final

import attrs

from ._errors import ConfigError, InvalidRequestError, RelaxError

__all__ = [
    "count",
    "is_int",
    "is_number",
    "is_real",
    "loads_utf8_json",
    "non_negative_number",
    "one_of",
    "optional_non_negative_int",
    "optional_positive_int",
    "positive_int",
    "positive_number",
    "require_list",
    "require_object",
    "require_positive_int",
    "require_real",
    "type_name",
]

_JSON_TYPE_NAMES: dict[type, str] = {
    dict: "object",
    list: "array",
    tuple: "array",
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    type(None): "null",
}


def type_name(value: Any) -> str:
    """The JSON name of ``value``'s type (``object``, ``string``, ...), else its Python type name."""
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def count(n: int, noun: str) -> str:
    """``"1 <noun>"``, ``"<n> <noun>s"`` (``count(0, "sample") == "0 samples"``)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def is_int(value: Any) -> bool:
    """True for an ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """True for an ``int`` or ``float`` that is not a ``bool`` (``nan`` and ``inf`` included)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """True for a finite ``int`` or ``float`` that is not a ``bool`` (an int too large for a float
    is not finite)."""
    if not is_number(value):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


NOT_UTF8_JSON: Final = ("the body is not valid UTF-8 JSON (JSON exchanged between systems must be "
                        "UTF-8: RFC 8259, section 8.1)")


def loads_utf8_json(raw: bytes, loads: Callable[[bytes], Any] = json.loads) -> Any:
    """``loads(raw)`` for a body in UTF-8, the only encoding JSON on the wire may use.

    :func:`json.loads` guesses the encoding of bytes (:func:`json.detect_encoding`): a body that
    starts with ``\\xff\\xfe``, or has a NUL among its first four bytes, is decoded as UTF-16 or
    UTF-32, and garbage is reported as a UTF-16 codec error. Such a body, and one holding a byte
    sequence that is not UTF-8, is refused here with one message. A UTF-8 body parses exactly as
    with ``loads``: a leading UTF-8 BOM is skipped and a UTF-8-encoded lone surrogate passes, as
    :func:`json.loads` does.

    Args:
        raw: the body bytes.
        loads: decodes UTF-8 bytes (``json.loads`` or a drop-in such as the agent API's
            ``BodyMemo.loads``).

    Raises:
        ValueError: not UTF-8 (the message is :data:`NOT_UTF8_JSON`, with the byte offset of
            the first invalid byte when the body claims UTF-8), or whatever ``loads`` raises
            (``json.JSONDecodeError``, a rejected constant, ``RecursionError``).
    """
    encoding = json.detect_encoding(raw)
    if encoding not in ("utf-8", "utf-8-sig"):
        raise ValueError(NOT_UTF8_JSON)
    try:
        return loads(raw)
    except UnicodeDecodeError as exc:
        offset = exc.start + (3 if encoding == "utf-8-sig" else 0)  # the BOM was cut first
        raise ValueError(f"{NOT_UTF8_JSON}; byte {offset} is not UTF-8") from None


def _shown(value: Any) -> str:
    """What a value was, for ``got ...``: a number as written, anything else by its type."""
    return repr(value) if is_number(value) else type_name(value)


def _fail(error: type[Exception], path: str, problem: str) -> Exception:
    if issubclass(error, RelaxError):
        return error.at(path, problem)
    return error(f"{path} {problem}")


def require_object(
    value: Any, path: str, *, optional: bool = False, error: type[Exception] = InvalidRequestError
) -> Any:
    """Return ``value`` when it is a JSON object (a ``dict``), or None when optional and absent.

    Raises:
        InvalidRequestError: (or ``error``) ``"<path> must be an object, got <type>"``.
    """
    if value is None and optional:
        return None
    if not isinstance(value, dict):
        raise _fail(error, path, f"must be an object, got {type_name(value)}")
    return value


def require_list(
    value: Any, path: str, *, optional: bool = False, error: type[Exception] = InvalidRequestError
) -> Any:
    """Return ``value`` when it is a list (or a tuple), or None when optional and absent.

    Raises:
        InvalidRequestError: (or ``error``) ``"<path> must be a list, got <type>"``.
    """
    if value is None and optional:
        return None
    if not isinstance(value, (list, tuple)):
        raise _fail(error, path, f"must be a list, got {type_name(value)}")
    return value


def require_real(
    value: Any, path: str, *, optional: bool = False, error: type[Exception] = InvalidRequestError
) -> Any:
    """Return ``value`` as a float when it is a finite number (``bool`` is not a number).

    Returns:
        ``float(value)``, or None when ``optional`` and ``value`` is None.

    Raises:
        InvalidRequestError: (or ``error``) ``"<path> must be a finite number, got <value>"``.
    """
    if value is None and optional:
        return None
    if not is_real(value):
        raise _fail(error, path, f"must be a finite number, got {_shown(value)}")
    return float(value)


def require_positive_int(
    value: Any, path: str, *, optional: bool = False, error: type[Exception] = InvalidRequestError
) -> Any:
    """Return ``value`` when it is an int >= 1 (``bool`` is not an int), or None when optional.

    Raises:
        InvalidRequestError: (or ``error``) ``"<path> must be a positive integer, got <value>"``.
    """
    if value is None and optional:
        return None
    if not (is_int(value) and value >= 1):
        raise _fail(error, path, f"must be a positive integer, got {_shown(value)}")
    return value


# -- attrs validators (config fields) -----------------------------------------------------------


def positive_number(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    """attrs validator: a finite real number > 0 (not bool)."""
    if not (is_real(value) and value > 0):
        raise ConfigError.at(attribute.name, f"must be a finite number > 0, got {_shown(value)}")


def non_negative_number(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    """attrs validator: a finite real number >= 0 (not bool)."""
    if not (is_real(value) and value >= 0):
        raise ConfigError.at(attribute.name, f"must be a finite number >= 0, got {_shown(value)}")


def positive_int(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    """attrs validator: an int >= 1 (not bool)."""
    require_positive_int(value, attribute.name, error=ConfigError)


def optional_positive_int(instance: Any, attribute: attrs.Attribute, value: int | None) -> None:
    """attrs validator: None or an int >= 1."""
    require_positive_int(value, attribute.name, optional=True, error=ConfigError)


def one_of(choices: tuple[str, ...]) -> Callable[[Any, attrs.Attribute, Any], None]:
    """attrs validator factory: the value is one of ``choices``."""

    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value not in choices:
            raise ConfigError.at(attribute.name, f"must be one of {', '.join(choices)}, got {value!r}")

    return check


def optional_non_negative_int(instance: Any, attribute: attrs.Attribute, value: int | None) -> None:
    """attrs validator: None or an int >= 0 (not bool)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigError.at(attribute.name, f"must be None or an int >= 0, got {value!r}")
