"""The one error hierarchy of relaxtrio.

::

    RelaxError(Exception)                        500 internal_error / api_error
    ├── InvalidRequestError(RelaxError, ValueError)   400 invalid_request_error (carries ``param``)
    │   └── ContextLengthExceededError               400 code context_length_exceeded
    ├── AuthenticationError                      401 authentication_error
    ├── NotFoundError                            404 not_found_error (code session_discarded)
    ├── SessionAbortedError                      404 the Session ended while a request waited
    ├── ClientDisconnectError                    499 client_disconnect
    ├── BackendError                             500 the generation engine failed
    │   └── BackendTimeoutError                  500 the engine did not answer in time
    ├── OverloadedError                          503 (OpenAI) / 529 overloaded_error (Anthropic)
    ├── InternalError                            500 a bug; never reveals details to clients
    ├── AgentExecutionError                      an agent process timed out, crashed or wrote bad output
    └── ExportError                              a Session's output cannot become training samples

Each class declares ``http_status``, ``openai_type``, ``anthropic_type`` and ``code`` (the
openai-python pattern), so the API layer renders any of them without a lookup table. Errors carry
data: ``param`` (the request field path, e.g. ``messages[3].content``) and ``session_id``.
"""

from __future__ import annotations

from typing import ClassVar


class RelaxError(Exception):
    """Base class of every error relaxtrio raises on purpose.

    Args:
        message: human-readable text; safe to show to a client for 4xx classes.
        param: the request field path that caused the error, or None.
        session_id: the Session the error belongs to, or None.
    """

    http_status: ClassVar[int] = 500
    openai_type: ClassVar[str] = "internal_error"
    anthropic_type: ClassVar[str] = "api_error"
    code: ClassVar[str | None] = None

    def __init__(self, message: str, *, param: str | None = None, session_id: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.session_id = session_id

    def __str__(self) -> str:
        return self.message


class InvalidRequestError(RelaxError, ValueError):
    """A client mistake in a request body or an agent's output (HTTP 400)."""

    http_status = 400
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"
    code = None


class ContextLengthExceededError(InvalidRequestError):
    """The lineage plus the new observation (or the requested completion) does not fit the context."""

    code = "context_length_exceeded"


class AuthenticationError(RelaxError):
    """Missing or malformed ``Authorization: Bearer <RELAX_SESSION_ID>`` header (HTTP 401)."""

    http_status = 401
    openai_type = "authentication_error"
    anthropic_type = "authentication_error"


class NotFoundError(RelaxError):
    """Unknown or discarded Session, or an unknown route (HTTP 404)."""

    http_status = 404
    openai_type = "not_found_error"
    anthropic_type = "not_found_error"
    code = "session_discarded"


class SessionAbortedError(RelaxError):
    """The Session finished or was dropped while this request was still waiting (HTTP 404)."""

    http_status = 404
    openai_type = "not_found_error"
    anthropic_type = "not_found_error"
    code = "session_discarded"


class ClientDisconnectError(RelaxError):
    """The client went away before the body was read or the answer was produced (HTTP 499)."""

    http_status = 499
    openai_type = "client_disconnect"
    anthropic_type = "invalid_request_error"
    code = "client_disconnect"


class BackendError(RelaxError):
    """The generation engine answered with an error or broke the protocol (HTTP 500 to agents)."""

    http_status = 500
    openai_type = "internal_error"
    anthropic_type = "api_error"
    code = "internal_error"


class BackendTimeoutError(BackendError):
    """The generation engine did not answer within its bounded wait."""


class OverloadedError(RelaxError):
    """Temporarily unable to serve; the client may retry (503 OpenAI, 529 Anthropic)."""

    http_status = 503
    openai_type = "server_error"
    anthropic_type = "overloaded_error"


class InternalError(RelaxError):
    """A bug or an unexpected state. Rendered as a generic 500 that reveals no internals."""

    http_status = 500
    openai_type = "internal_error"
    anthropic_type = "api_error"
    code = "internal_error"


class AgentExecutionError(RelaxError):
    """An agent process timed out, exited non-zero, or wrote output that cannot be parsed.

    The message ends with the last 8 KiB of the agent's combined stdout and stderr.
    """


class ExportError(RelaxError):
    """A Session's output cannot be turned into training samples (the Session is dropped)."""
