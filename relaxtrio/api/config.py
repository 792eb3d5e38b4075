"""Settings of the agent-facing API server (passed to :func:`~relaxtrio.api.app.create_app`)."""

from __future__ import annotations

import math
from typing import Any, Final

import attrs

DEFAULT_HEARTBEAT_S: Final = 15.0
"""Seconds between Buffered SSE heartbeats while a generation is pending (spec: 15 s)."""

DEFAULT_MAX_BODY_BYTES: Final = 256 * 1024 * 1024
"""Largest accepted request body in bytes; long agent contexts and images need far more than
Quart's 16 MiB default."""


def _positive_finite(instance: Any, attribute: attrs.Attribute, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{attribute.name} must be a positive finite number, got {value!r}")


def _positive_int(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{attribute.name} must be a positive integer, got {value!r}")


@attrs.frozen(kw_only=True)
class ApiConfig:
    """How the API serves agents.

    Attributes:
        heartbeat_s: seconds between Buffered SSE heartbeat frames while the generation is
            pending (trio clock; the first heartbeat comes ``heartbeat_s`` after the connection
            frame).
        max_body_bytes: largest accepted request body in bytes; larger bodies get a 413 in the
            protocol's JSON envelope.
        model_name: the id listed by ``/v1/models`` (requests' ``model`` is only echoed).
    """

    heartbeat_s: float = attrs.field(default=DEFAULT_HEARTBEAT_S, validator=_positive_finite)
    max_body_bytes: int = attrs.field(default=DEFAULT_MAX_BODY_BYTES, validator=_positive_int)
    model_name: str = "relaxtrio"
