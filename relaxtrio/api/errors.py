"""Error envelopes for the three protocols (one per protocol, never HTML).

* OpenAI (Chat Completions, Responses): ``{"error": {"message", "type", "param", "code"}}``
  (https://platform.openai.com/docs/guides/error-codes).
* Anthropic Messages: ``{"type": "error", "error": {"type", "message"}}``
  (https://docs.anthropic.com/en/api/errors).

Statuses and types come from the error class (:mod:`relaxtrio._errors`): 400
``invalid_request_error`` with ``param``, 401 ``authentication_error`` (an unknown Session:
code ``session_discarded``), 404 ``not_found_error``, 499 ``client_disconnect``, 500 ``internal_error`` (Anthropic
``api_error``; an empty reply: ``server_error`` code ``empty_reply``), overload 503 (OpenAI) / 529
``overloaded_error`` (Anthropic).

``x-should-retry: false`` (docs/agent-contract.md#errors) is set where a retry cannot succeed:
OpenAI for ``internal_error`` and discarded Sessions; Anthropic for 401, 404 and every 5xx except
overload (an overload exists to be retried) and an empty reply (a retry samples again).

A 5xx never reveals internals: its message is one of our fixed sentences; whatever an engine or
a bug said is only logged (by the caller).
"""

from __future__ import annotations

import logging
from typing import Any, Final

from quart import Response

from .._errors import (
    ClientDisconnectError,
    ContextLengthExceededError,
    EmptyReplyError,
    InvalidRequestError,
    NotFoundError,
    OverloadedError,
    RelaxError,
)
from .wire import Protocol, encode_json

log = logging.getLogger(__name__)

GENERIC_INTERNAL_MESSAGE: Final = "Internal error while handling agentic request."
RENDER_FAILED_MESSAGE: Final = "Internal error while rendering agentic response."
EMPTY_REPLY_MESSAGE: Final = ("The model's reply was empty (no text, reasoning or tool call); nothing "
                              "was committed. A retry samples again (the same reply when the "
                              "sampling is seeded).")
_PUBLIC_5XX_MESSAGES: Final = frozenset({GENERIC_INTERNAL_MESSAGE, RENDER_FAILED_MESSAGE})

CLIENT_DISCONNECT_BODY: Final = "client disconnected before agentic request body was read"
CLIENT_DISCONNECT_COMPLETION: Final = "client disconnected before agentic completion was produced"


def public_message(exc: RelaxError) -> str:
    """The text a client may see: the error's own message, except for unexpected 5xx."""
    if isinstance(exc, EmptyReplyError):
        return EMPTY_REPLY_MESSAGE
    if exc.http_status >= 500 and not isinstance(exc, OverloadedError):
        return exc.message if exc.message in _PUBLIC_5XX_MESSAGES else GENERIC_INTERNAL_MESSAGE
    return exc.message


def openai_error_body(exc: RelaxError) -> dict[str, Any]:
    """The OpenAI error envelope for ``exc``."""
    return {
        "error": {
            "message": public_message(exc),
            "type": exc.openai_type,
            "param": exc.param,
            "code": exc.code,
        }
    }


def anthropic_error_body(exc: RelaxError) -> dict[str, Any]:
    """The Anthropic error envelope for ``exc`` (a context overflow in Anthropic's wording)."""
    message = exc.anthropic_message() if isinstance(exc, ContextLengthExceededError) else public_message(exc)
    return {"type": "error", "error": {"type": exc.anthropic_type, "message": message}}


def error_body(exc: RelaxError, protocol: Protocol) -> dict[str, Any]:
    """The envelope of ``protocol`` for ``exc``."""
    return anthropic_error_body(exc) if protocol == "messages" else openai_error_body(exc)


def http_status(exc: RelaxError, protocol: Protocol) -> int:
    """HTTP status for ``exc``; Anthropic's overload status is 529."""
    if protocol == "messages" and isinstance(exc, OverloadedError):
        return 529
    return exc.http_status


def should_retry(exc: RelaxError, protocol: Protocol) -> bool:
    """Whether a client may usefully retry (False → header ``x-should-retry: false``)."""
    if protocol == "messages":
        if isinstance(exc, OverloadedError | EmptyReplyError):
            return True
        return not (exc.http_status >= 500 or exc.http_status in (401, 404))
    return not (exc.openai_type == "internal_error" or exc.code in ("internal_error", "session_discarded"))


def error_response(exc: RelaxError, protocol: Protocol) -> Response:
    """A JSON error response in the protocol's own envelope."""
    headers = {} if should_retry(exc, protocol) else {"x-should-retry": "false"}
    return Response(
        encode_json(error_body(exc, protocol)),
        status=http_status(exc, protocol),
        content_type="application/json",
        headers=headers,
    )


def log_rejected(protocol: Protocol, exc: RelaxError, session_id: str | None, *,
                 status: int | None = None, target: str | None = None) -> None:
    """Logs one line for a 4xx answer (a client mistake), so a harness that exits on it leaves
    its reason in relaxtrio's log (docs/agent-contract.md#errors).

    The line names only what is known: ``HTTP <status>``, then the request (``POST <path>``),
    the Session and the field path when there are any; never a literal ``None``.

    Args:
        protocol: the request's protocol.
        exc: the error answered.
        session_id: the request's Session, when it got that far (else ``exc.session_id``).
        status: the status sent, when it is not the error's own (405, 413 from the router).
        target: ``"<METHOD> <path>"`` of the request, when known.
    """
    log.warning("%s request rejected (%s): %s", protocol,
                describe_request(status or http_status(exc, protocol), target=target,
                                 session_id=session_id or exc.session_id, param=exc.param),
                exc.message)


def describe_request(status: int, *, target: str | None = None, session_id: str | None = None,
                     param: str | None = None) -> str:
    """``"HTTP 413, POST /v1/messages, session s1, param body"``, leaving out the unknown parts."""
    parts = [f"HTTP {status}"]
    if target:
        parts.append(target)
    if session_id:
        parts.append(f"session {session_id}")
    if param:
        parts.append(f"param {param}")
    return ", ".join(parts)


def client_disconnect(*, body_read: bool, session_id: str | None = None) -> ClientDisconnectError:
    """The 499 error recorded when a client goes away (nobody is left to receive it)."""
    return ClientDisconnectError(
        CLIENT_DISCONNECT_COMPLETION if body_read else CLIENT_DISCONNECT_BODY, session_id=session_id
    )


class RouteNotFoundError(NotFoundError):
    """No route for the request's path (404 ``not_found_error``, no Session code)."""

    code = None


class MethodNotAllowedError(InvalidRequestError):
    """The route exists but not for this HTTP method (405)."""

    http_status = 405


class RequestTooLargeError(InvalidRequestError):
    """The body exceeds ``ApiConfig.max_body_bytes`` (413; Anthropic ``request_too_large``)."""

    http_status = 413
    anthropic_type = "request_too_large"
