"""How the agent API serves agents: :class:`ApiConfig` and its defaults."""

from __future__ import annotations

from typing import Final

import attrs

from .._validate import positive_int, positive_number

__all__ = [
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "ApiConfig",
]


DEFAULT_HEARTBEAT_S: Final = 15.0
"""Seconds between Buffered SSE heartbeats while a generation is pending.

See docs/agent-contract.md#buffered-sse.
"""

DEFAULT_MAX_BODY_BYTES: Final = 256 * 1024 * 1024
"""Largest accepted request body in bytes; long agent contexts and images need far more than
Quart's 16 MiB default."""


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
        strict_request_fields: refuse with a 400 the request options that do not alter
            generation (``n`` above 1, a forced ``tool_choice``, a schema, server tools, ...)
            instead of ignoring and counting them (``--agentic-strict-request-fields``;
            docs/agent-contract.md#ignored-request-fields).
    """

    heartbeat_s: float = attrs.field(default=DEFAULT_HEARTBEAT_S, validator=positive_number)
    max_body_bytes: int = attrs.field(default=DEFAULT_MAX_BODY_BYTES, validator=positive_int)
    model_name: str = "relaxtrio"
    strict_request_fields: bool = False
