"""Strict checks for the scalar request fields the protocols share.

Each check raises :class:`~relaxtrio.InvalidRequestError` whose ``param`` is the field path, so
the client gets a 400 naming the field. Booleans are never accepted as integers. ``None`` (JSON
``null``) always means "absent". The shared kinds (objects, positive integers) come from
:mod:`relaxtrio._validate`, so they read the same as everywhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .._errors import InvalidRequestError
from .._validate import is_int, require_object, require_positive_int

SEED_MIN: Final = -(2**63)
SEED_MAX: Final = 2**64 - 1
"""Seeds outside this range cannot seed a torch or SGLang generator."""


def optional_positive_int(body: Mapping[str, Any], key: str) -> int | None:
    """``body[key]`` as a positive int, or None when absent/null."""
    value: int | None = require_positive_int(body.get(key), key, optional=True)
    return value


def required_positive_int(body: Mapping[str, Any], key: str) -> int:
    """``body[key]`` as a positive int; absent/null is an error (``<key> is required``)."""
    value = optional_positive_int(body, key)
    if value is None:
        raise InvalidRequestError(f"{key} is required", param=key)
    return value


def optional_seed(body: Mapping[str, Any], key: str = "seed") -> int | None:
    """``body[key]`` as a sampling seed in ``[-2**63, 2**64)``, or None."""
    value = body.get(key)
    if value is None:
        return None
    if not is_int(value):
        raise InvalidRequestError(f"{key} must be an integer", param=key)
    if not SEED_MIN <= value <= SEED_MAX:
        raise InvalidRequestError(f"{key} must be between {SEED_MIN} and {SEED_MAX}", param=key)
    seed: int = value
    return seed


def optional_bool(body: Mapping[str, Any], key: str, default: bool = False) -> bool:
    """``body[key]`` as a bool, ``default`` when absent/null."""
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{key} must be a boolean", param=key)
    return value


def check_text(value: str, param: str) -> str:
    """``value`` unchanged when UTF-8 can encode it (no lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequestError(f"{param} must be valid UTF-8 text", param=param) from None
    return value


def stop_strings(body: Mapping[str, Any], key: str, *, allow_string: bool = True) -> tuple[str, ...]:
    """``body[key]`` as a tuple of stop strings (a string or a list of strings).

    Empty strings are dropped (they cannot match anything useful).

    Args:
        body: the request body.
        key: ``stop`` (Chat: string or list) or ``stop_sequences`` (Messages: list only).
        allow_string: whether a single string is accepted.
    """
    value = body.get(key)
    if value is None:
        return ()
    if allow_string and isinstance(value, str):
        return (check_text(value, key),) if value else ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(check_text(v, f"{key}[{i}]") for i, v in enumerate(value) if v)
    kind = "a string or list of strings" if allow_string else "a list of strings"
    raise InvalidRequestError(f"{key} must be {kind}", param=key)


def optional_str(body: Mapping[str, Any], key: str) -> str | None:
    """``body[key]`` as a string, or None when absent/null."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequestError(f"{key} must be a string", param=key)
    return value


def optional_object(body: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    """``body[key]`` as a JSON object, or None when absent/null."""
    value: Mapping[str, Any] | None = require_object(body.get(key), key, optional=True)
    return value


def non_empty_str(value: Any, param: str) -> str:
    """``value`` when it is a non-empty string."""
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{param} must be a non-empty string", param=param)
    return value


def thinking_switch(value: Any, param: str, enabled_values: frozenset[str], off: str) -> dict[str, Any]:
    """``{"enable_thinking": value != off}`` for a known switch value, else ``{}``.

    Args:
        value: the request's switch (``reasoning.effort`` or ``thinking.type``), or None.
        param: its field path.
        enabled_values: every known value (including ``off``).
        off: the value that disables thinking.

    Raises:
        InvalidRequestError: the value is not a string.
    """
    if value is None:
        return {}
    if not isinstance(value, str):
        raise InvalidRequestError(f"{param} must be a string", param=param)
    if value not in enabled_values:
        return {}  # unknown values select nothing (docs/canonical-contract.md#template-kwargs)
    return {"enable_thinking": value != off}
