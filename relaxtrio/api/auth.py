"""The agent's credential: its Session id, sent as a bearer token (or an Anthropic API key).

Every model endpoint authenticates with ``Authorization: Bearer <RELAX_SESSION_ID>``
(docs/agent-contract.md#authentication). The anthropic SDK sends its API key as ``x-api-key``
instead, so that header is accepted as the same credential when no ``Authorization`` header is
present (docs/client-quirks.md#anthropic-api-key-header).
"""

from __future__ import annotations

from typing import Protocol

from .._errors import AuthenticationError


class Headers(Protocol):
    """Request headers, looked up by name (a mapping, or werkzeug's ``Headers``)."""

    def get(self, key: str) -> str | None:
        """The header's value, or None when absent."""
        ...


def session_token(headers: Headers) -> str:
    """The bearer token of a request.

    Args:
        headers: the request headers: a case-insensitive mapping (werkzeug's ``Headers``) or
            one keyed by lower-cased names (:attr:`relaxtrio.api.asgi.ModelCall.headers`).

    Returns:
        The token (a Session id if the agent is well-behaved).

    Raises:
        AuthenticationError: no credential (``Missing Authorization header``), or an
            ``Authorization`` header that is not ``Bearer <token>``.
    """
    header = headers.get("authorization")
    if header is None:
        api_key = (headers.get("x-api-key") or "").strip()
        if api_key:
            return api_key
        raise AuthenticationError("Missing Authorization header")
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationError("Authorization header must be 'Bearer <token>'")
    return token
