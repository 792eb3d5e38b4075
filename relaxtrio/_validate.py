"""One validation vocabulary: the checks that recur across wire models, configs and dataset rows.

Each ``require_*`` function returns the checked value or raises
:class:`~relaxtrio._errors.InvalidRequestError` (or the ``error`` class passed in) with one wording:
``"<path> must be <what>, got <type or value>"``. The ``attrs`` validators at the bottom apply the
same checks to config fields and raise ``ValueError`` naming the field, as attrs expects.

May import: the standard library, attrs and :mod:`relaxtrio._errors` only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from ._errors import InvalidRequestError, RelaxError

__all__ = [
    "is_int",
    "is_real",
    "non_negative_number",
    "optional_positive_int",
    "positive_int",
    "positive_number",
    "require_object",
    "require_real",
    "type_name",
]


def type_name(value: Any) -> str:
    """The JSON name of a value's type, for error messages (``object``, ``array``, ``string``...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    return type(value).__name__


def is_int(value: Any) -> bool:
    """True for an ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """True for a finite ``int`` or ``float`` that is not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def require_object(value: Any, path: str, *, error: type[RelaxError] = InvalidRequestError) -> Mapping[str, Any]:
    """Return ``value`` when it is a JSON object (a mapping with string keys).

    Raises:
        InvalidRequestError: (or ``error``) ``"<path> must be an object, got <type>"``, with
            ``param=path``.
    """
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise error(f"{path} must be an object, got {type_name(value)}.", param=path)
    return value


def require_real(value: Any, path: str, *, error: type[RelaxError] = InvalidRequestError) -> float:
    """Return ``value`` as a float when it is a finite real number (``bool`` is not a number).

    Raises:
        InvalidRequestError: (or ``error``) ``"<path> must be a finite number, got <value>"``,
            with ``param=path``.
    """
    if not is_real(value):
        raise error(f"{path} must be a finite number, got {value!r}.", param=path)
    return float(value)


def positive_number(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    """attrs validator: a finite real number > 0 (not bool)."""
    if not (is_real(value) and value > 0):
        raise ValueError(f"{attribute.name} must be a finite number > 0, got {value!r}")


def non_negative_number(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    """attrs validator: a finite real number >= 0 (not bool)."""
    if not (is_real(value) and value >= 0):
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


def positive_int(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    """attrs validator: an int >= 1 (not bool)."""
    if not (is_int(value) and value >= 1):
        raise ValueError(f"{attribute.name} must be an int >= 1, got {value!r}")


def optional_positive_int(instance: Any, attribute: attrs.Attribute, value: int | None) -> None:
    """attrs validator: None or an int >= 1."""
    if value is not None:
        positive_int(instance, attribute, value)
