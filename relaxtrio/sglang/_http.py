"""HTTP plumbing of the engine client: configuration, bounded retries, JSON bodies.

Retry policy (docs/client-quirks.md#transient-engine-errors): transport errors (including timeouts)
and HTTP 5xx / 408 / 409 / 425 / 429 are retried up to ``max_attempts`` times with ``retry_sleep_s``
between tries; any other status is returned to the caller at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import attrs
import httpx
import trio

from .._errors import BackendTimeoutError, EngineUnavailableError
from ..tracing import current_tracing
from ._pool import ConnectionPool, PoolResponse

__all__ = ["EngineClientConfig", "json_object", "send_with_retries"]

_RETRY_STATUSES: Final = frozenset({408, 409, 425, 429})
_JSON_HEADERS: Final = {"Content-Type": "application/json"}


@attrs.frozen(kw_only=True)
class EngineClientConfig:
    """Limits and timeouts of an :class:`EngineClient`.

    Attributes:
        max_generation_connections: connections of the ``/generate`` pool (all engines); keep it
            at or above the most generations in flight, so none waits inside the pool.
        max_control_connections: connections of the control pool (all engines).
        connect_timeout_s: seconds to open a TCP connection.
        control_timeout_s: seconds a quick control call (abort, health, info, continue, version
            relabel, flush, close_session) may take per attempt.
        weight_update_timeout_s: seconds pause / ``update_weights_from_disk`` may take per
            attempt (they wait for in-flight requests); None = no limit.
        max_attempts: tries per call for retryable failures (6).
        retry_sleep_s: pause between tries, in seconds.
    """

    max_generation_connections: int = 1024
    max_control_connections: int = 32
    connect_timeout_s: float = 10.0
    control_timeout_s: float = 30.0
    weight_update_timeout_s: float | None = 600.0
    max_attempts: int = 6
    retry_sleep_s: float = 1.0


async def send_with_retries(
    client: httpx.AsyncClient | ConnectionPool,
    method: str,
    url: str,
    path: str,
    body: dict[str, Any] | bytes | None,
    *,
    httpx_timeout: httpx.Timeout,
    config: EngineClientConfig,
    headers: dict[str, str] | None = None,
) -> httpx.Response | PoolResponse:
    """One call with bounded retries; returns the final response (any status).

    Inside a traced request or step (:mod:`relaxtrio.tracing`), the call is a
    ``relaxtrio.engine_call`` span and sends its W3C ``traceparent`` header.

    Args:
        client: the pool to use: the generation pool (:class:`~._pool.ConnectionPool`) or an
            ``httpx.AsyncClient`` (control calls, custom transports); both raise httpx's
            transport exceptions.
        method: HTTP method.
        url: engine base URL.
        path: route, e.g. ``/generate``.
        body: JSON body, UTF-8 JSON bytes (encoded already), or None for none.
        httpx_timeout: per-attempt httpx transport timeouts (connect/read), not a cancel scope.
        config: retry policy.
        headers: extra request headers (e.g. the gateway's routing key), or None.

    Raises:
        BackendTimeoutError: every attempt timed out (the last one is the ``__cause__``).
        EngineUnavailableError: every attempt failed at the transport level, or ``client`` (an
            ``httpx.AsyncClient``) was closed before an attempt.

    Cancellation:
        A checkpoint; cancelling drops the request in flight (the engine sees a disconnect).
    """
    tracing = current_tracing()
    if not tracing.enabled:  # the hot path: one context-variable read
        return await _send(client, method, url, path, body, httpx_timeout=httpx_timeout,
                           config=config, headers=headers)
    with tracing.engine_call(method, url, path) as trace_headers:
        if trace_headers is not None:
            headers = {**(headers or {}), **trace_headers}
        return await _send(client, method, url, path, body, httpx_timeout=httpx_timeout,
                           config=config, headers=headers)


async def _send(
    client: httpx.AsyncClient | ConnectionPool,
    method: str,
    url: str,
    path: str,
    body: dict[str, Any] | bytes | None,
    *,
    httpx_timeout: httpx.Timeout,
    config: EngineClientConfig,
    headers: dict[str, str] | None,
) -> httpx.Response | PoolResponse:
    """:func:`send_with_retries` without the span."""
    attempts = max(1, config.max_attempts)
    for attempt in range(1, attempts + 1):
        if isinstance(client, httpx.AsyncClient) and client.is_closed:
            # Its owner (the fleet) closed it while this call waited between attempts, e.g. a
            # restarted engine's readmission at the end of a run: httpx would raise RuntimeError.
            raise EngineUnavailableError(f"engine {url}{path}: the client was closed (shutting down)",
                                         engine_url=url)
        try:
            if isinstance(body, bytes):
                content, payload = body, None
            else:
                content, payload = None, body
            if isinstance(client, ConnectionPool):
                response = await client.request(method, url + path, json=payload, content=content,
                                                transport_timeout=httpx_timeout, headers=headers)
            elif content is not None:
                response = await client.request(method, url + path, content=content,
                                                headers={**_JSON_HEADERS, **(headers or {})},
                                                timeout=httpx_timeout)
            else:
                response = await client.request(method, url + path, json=payload,
                                                timeout=httpx_timeout, headers=headers)
        except httpx.TimeoutException as exc:
            if attempt == attempts:
                raise BackendTimeoutError(
                    f"engine {url}{path} did not answer in time after {attempts} attempts",
                    engine_url=url,
                ) from exc
        except httpx.TransportError as exc:
            if attempt == attempts:
                raise EngineUnavailableError(
                    f"engine {url}{path} unreachable after {attempts} attempts: {exc!r}",
                    engine_url=url,
                ) from exc
        else:
            status = response.status_code
            if attempt == attempts or not (status >= 500 or status in _RETRY_STATUSES):
                return response
        await trio.sleep(config.retry_sleep_s)
    raise AssertionError("unreachable")


def json_object(response: httpx.Response | PoolResponse, url: str) -> dict[str, Any]:
    """The response body as a JSON object.

    Raises:
        EngineUnavailableError: the body is not JSON or not an object.
    """
    try:
        payload = response.json()
    except ValueError as exc:
        raise EngineUnavailableError(f"engine {url} sent invalid JSON", engine_url=url) from exc
    if not isinstance(payload, dict):
        raise EngineUnavailableError(f"engine {url} sent {type(payload).__name__}, expected an object",
                                     engine_url=url)
    return payload


@asynccontextmanager
async def open_pools(
    cfg: EngineClientConfig, transport: httpx.AsyncBaseTransport | None = None
) -> AsyncIterator[tuple[httpx.AsyncClient | ConnectionPool, httpx.AsyncClient]]:
    """The generation and control pools every engine protocol's clients share, sized by ``cfg``.

    Without ``transport`` generation goes through a :class:`~._pool.ConnectionPool` (a small
    fraction of httpx's CPU per call); with one (tests: ``httpx.MockTransport``) both pools are
    ``httpx.AsyncClient`` s on it.

    Yields:
        ``(generation, control)``; both are closed on exit.
    """
    generation_limits = httpx.Limits(max_connections=cfg.max_generation_connections,
                                     max_keepalive_connections=cfg.max_generation_connections)
    control_limits = httpx.Limits(max_connections=cfg.max_control_connections,
                                  max_keepalive_connections=cfg.max_control_connections)
    generation_pool: httpx.AsyncClient | ConnectionPool = (
        ConnectionPool(max_connections=cfg.max_generation_connections) if transport is None
        else httpx.AsyncClient(limits=generation_limits, transport=transport)
    )
    async with (
        generation_pool as generation,
        httpx.AsyncClient(limits=control_limits, transport=transport) as control,
    ):
        yield generation, control
