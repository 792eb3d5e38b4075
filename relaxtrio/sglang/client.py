"""The client of one SGLang server, or of relaxtrio's embedded CPU engine (same API).

It speaks SGLang's native HTTP API (https://docs.sglang.io/basic_usage/native_api.html):
``/generate`` with input ids and logprobs, ``/abort_request``, pause / continue, weight updates,
health and info. :class:`EngineClient` is SGLang's implementation of the per-engine interface
:class:`relaxtrio.fleet.engine_api.EngineAPI`; it talks to exactly one engine (routing, fan-out
and failover over several are the fleet's: :mod:`relaxtrio.fleet`).

Design points:

- **Two connection pools** (docs/client-quirks.md#control-calls-behind-generations): generation
  traffic and control traffic (abort, pause, continue, weight updates, health, info) use separate
  ``httpx.AsyncClient`` instances with their own connection limits, so a control call never waits
  behind generations that fill every slot.
- **Timeouts**: ``/generate`` has no read timeout (a generation may run for minutes) but a bounded
  connect timeout; control calls are bounded by :attr:`EngineClientConfig.control_timeout_s`,
  except pause and weight updates, which may legitimately wait for in-flight requests to drain and
  use :attr:`EngineClientConfig.weight_update_timeout_s`.
- **Retries** (docs/client-quirks.md#transient-engine-errors): transport errors and HTTP 5xx / 408 /
  409 / 425 / 429 are retried up to :attr:`EngineClientConfig.max_attempts` times with a short
  sleep; other 4xx fail at once.
- **Shared pools**: :func:`open_connections` opens the two pools once; every client it makes
  (one per engine of a fleet) shares them. :func:`open_engine_client` opens pools for one client.
- **Errors** say whose fault a failure is, by type: a 400 whose text matches one of the six
  context-length messages (docs/client-quirks.md#context-length-error-texts) becomes
  :class:`~relaxtrio.ContextLengthExceededError`; any other 4xx
  :class:`~relaxtrio.EngineRejectedError` (this request was refused); a 5xx, a transport failure
  or a response that breaks the protocol :class:`~relaxtrio.EngineUnavailableError` (the engine is
  broken), with timeouts as its subclass :class:`~relaxtrio.BackendTimeoutError`. Both engine
  errors carry ``engine_url`` and ``status_code``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import attrs
import httpx

from .._errors import EngineRejectedError, EngineUnavailableError, RelaxError
from ._http import EngineClientConfig, json_object, open_pools, send_with_retries
from ._ids_json import IdsJsonEncoder
from ._pool import ConnectionPool
from ._replies import (
    CONTEXT_LENGTH_MARKERS,
    GenerateResult,
    context_token_limit,
    error_from_response,
    parse_generate_response,
)
from .wire import SamplingParams

__all__ = [
    "CONTEXT_LENGTH_MARKERS",
    "EngineClient",
    "EngineClientConfig",
    "GenerateResult",
    "PauseMode",
    "SGLangConnections",
    "SamplingParams",
    "context_token_limit",
    "open_connections",
    "open_engine_client",
]

PauseMode = Literal["abort", "retract", "in_place"]


class EngineClient:
    """Client of one SGLang-compatible engine; build it with :func:`open_engine_client`, or
    with :meth:`SGLangConnections.client` for engines that share pools (a fleet).

    Args:
        url: the engine's base URL (``http://host:port``; a trailing slash is dropped).
        generation: the pool of generation traffic (an :class:`~._pool.ConnectionPool`, or an
            ``httpx.AsyncClient`` when a custom transport is in use).
        control: the ``httpx.AsyncClient`` of control traffic.
        config: limits and timeouts.
    """

    def __init__(
        self,
        url: str,
        *,
        generation: httpx.AsyncClient | ConnectionPool,
        control: httpx.AsyncClient,
        config: EngineClientConfig,
    ):
        if not url:
            raise ValueError("an engine URL is required")
        self.url: str = url.rstrip("/")
        self.config = config
        self._generation = generation
        self._control = control
        self._ids_json = IdsJsonEncoder()
        # /generate: no read limit (a generation may run for minutes), a bounded connect.
        self._generate_timeout = httpx.Timeout(None, connect=config.connect_timeout_s)

    # ------------------------------------------------------------------ transport
    async def _call(
        self,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        method: str = "POST",
        slow: bool = False,
    ) -> httpx.Response:
        """A control call; raises on an HTTP error status (see :func:`error_from_response`).

        Raises:
            EngineRejectedError: a 4xx answer. EngineUnavailableError: a 5xx answer after
                retries, or the engine could not be reached.
        """
        response = await self._send(method, path, body, slow=slow)
        if response.status_code >= 400:
            raise error_from_response(
                response.status_code, response.content, engine_url=self.url, path=path
            )
        return response

    async def _send(self, method: str, path: str, body: dict[str, Any] | None, *,
                    slow: bool = False) -> httpx.Response:
        """A control call with retries; returns the final answer whatever its status."""
        timeout = httpx.Timeout(
            self.config.weight_update_timeout_s if slow else self.config.control_timeout_s,
            connect=self.config.connect_timeout_s,
        )
        return await send_with_retries(
            self._control, method, self.url, path, body, httpx_timeout=timeout, config=self.config
        )

    # ------------------------------------------------------------------ generation
    async def generate(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        rid: str,
        return_logprob: bool = True,
        session_id: str | None = None,
        image_data: Sequence[str] | None = None,
        headers: dict[str, str] | None = None,
        prefix_key: str | None = None,
    ) -> GenerateResult:
        """Generate from token ids (``POST /generate``, single form).

        Args:
            input_ids: prompt ids, length >= 1; with images, one placeholder token per image
                (the engine expands them).
            sampling: SGLang native sampling parameters.
            rid: request id, the abort key; no rid may be a prefix of another
                (docs/client-quirks.md#abort-matches-rid-prefixes).
            return_logprob: request per-token logprobs (required for training).
            session_id: passed through as SGLang's top-level ``session_id``.
            image_data: the prompt's images in placeholder order (``data:`` URLs), sent as
                SGLang's ``image_data``; None or empty sends none.
            headers: extra HTTP headers of this request (the gateway's routing key), or None.
            prefix_key: the family of prompts this one belongs to (the Session id): the body
                reuses the JSON text of the longest recent prompt of that family that is a
                prefix of this one (:mod:`._ids_json`); None compares with all recent prompts.

        Returns:
            The normalized result; ``len(output_logprobs) == len(output_ids)`` when
            ``return_logprob``. An aborted request returns normally with ``finish_type ==
            "abort"`` and its partial output.

        Raises:
            ContextLengthExceededError: the engine refused the prompt / budget as too long.
            EngineRejectedError: any other 4xx answer (this request was refused).
            BackendTimeoutError: connecting timed out on every attempt.
            EngineUnavailableError: a 5xx answer after retries, a transport failure, or a
                response that breaks the protocol.

        Cancellation:
            A checkpoint. Cancelling drops the HTTP request; SGLang notices the disconnect and
            aborts the request, but its partial output is lost. To keep partial output, call
            :meth:`abort` and let this call return.
        """
        url = self.url
        fields: dict[str, Any] = {
            "rid": rid,
            "sampling_params": sampling.to_json(),
            "return_logprob": return_logprob,
        }
        if session_id is not None:
            fields["session_id"] = session_id
        if image_data:
            fields["image_data"] = list(image_data)
        body = self._ids_json.body(input_ids, fields, prefix_key)
        response = await send_with_retries(
            self._generation, "POST", url, "/generate", body,
            httpx_timeout=self._generate_timeout, config=self.config, headers=headers,
        )
        if response.status_code >= 400:
            raise error_from_response(
                response.status_code, response.content, engine_url=url, path="/generate"
            )
        try:
            payload = response.json()
        except ValueError as exc:
            raise EngineUnavailableError(f"engine {url}/generate sent invalid JSON",
                                         engine_url=url) from exc
        return parse_generate_response(payload, return_logprob=return_logprob)

    # ------------------------------------------------------------------ control
    async def abort(self, rid: str) -> None:
        """Ask the engine to abort ``rid`` (fire-and-forget: 200 means "received").

        The abort is complete only when the matching :meth:`generate` call returns
        (docs/client-quirks.md#abort-is-acknowledged-early). Aborting a rid the engine does not
        hold is a harmless no-op.

        Raises:
            BackendError: the engine could not be reached (after retries) or refused.

        Cancellation:
            A checkpoint; an abort that reached the engine stays.
        """
        await self._call("/abort_request", {"rid": rid})

    async def abort_all(self) -> None:
        """Abort every request on the engine.

        Raises:
            BackendError: the engine could not be reached (after retries) or refused.

        Cancellation:
            A checkpoint; an abort that reached the engine stays.
        """
        await self._call("/abort_request", {"abort_all": True})

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """Pause the engine; new generations block there until continue.

        Raises:
            BackendError: the engine failed or could not be reached.

        Cancellation:
            A checkpoint; a pause that reached the engine stays: call
            :meth:`continue_generation` (shielded) to undo.
        """
        await self._call("/pause_generation", {"mode": mode}, slow=True)

    async def continue_generation(self) -> None:
        """Resume the engine after :meth:`pause_generation`.

        Raises:
            BackendError: the engine failed or could not be reached.

        Cancellation:
            A checkpoint.
        """
        await self._call("/continue_generation", {})

    async def update_weights_from_disk(
        self,
        model_path: str,
        *,
        weight_version: str | None,
        abort_all_requests: bool = False,
        flush_cache: bool = True,
    ) -> None:
        """Load a checkpoint directory (or a shared-memory manifest, embedded engine).

        Without a pause the engine waits for all its in-flight requests first
        (docs/client-quirks.md#weight-update-waits-for-in-flight-requests); pause
        with ``retract`` before calling this for a fast, loss-free update.

        Args:
            model_path: checkpoint directory visible to the engine.
            weight_version: new version label (None keeps the old label).
            abort_all_requests: abort in-flight requests first.
            flush_cache: flush the prefix cache after loading.

        Raises:
            EngineRejectedError: the engine answered ``success: false`` (HTTP 400). On SGLang
                the weights may already be loaded when only the cache flush failed.
            EngineUnavailableError: the engine failed or could not be reached.

        Cancellation:
            A checkpoint; an engine that already started loading finishes doing so.
        """
        body: dict[str, Any] = {
            "model_path": model_path,
            "abort_all_requests": abort_all_requests,
            "flush_cache": flush_cache,
        }
        if weight_version is not None:
            body["weight_version"] = weight_version
        response = await self._call("/update_weights_from_disk", body, slow=True)
        payload = json_object(response, self.url)
        if payload.get("success") is not True:
            raise EngineRejectedError(
                f"engine {self.url} failed to update weights: {payload.get('message')}",
                engine_url=self.url,
                status_code=response.status_code,
            )

    async def update_weight_version(self, new_version: str, *, abort_all_requests: bool = False) -> None:
        """Relabel the weights; always sends ``abort_all_requests``.

        See docs/client-quirks.md#version-relabel-aborts-by-default.

        Raises:
            BackendError: the engine failed or could not be reached.

        Cancellation:
            A checkpoint.
        """
        body = {"new_version": new_version, "abort_all_requests": abort_all_requests}
        await self._call("/update_weight_version", body)

    async def weight_version(self) -> str | None:
        """The label of the weights the engine serves now (``/model_info`` ``weight_version``).

        Returns:
            The label, or None when the engine reports none.

        Raises:
            BackendError: HTTP error, invalid JSON or unreachable engine.

        Cancellation:
            A checkpoint.
        """
        version = (await self.model_info()).get("weight_version")
        return version if isinstance(version, str) else None

    async def close_session(self, session_id: str) -> None:
        """Release a session's engine-side state (a no-op where unknown).

        Raises:
            BackendError: the engine could not be reached.

        Cancellation:
            A checkpoint.
        """
        await self._call("/close_session", {"session_id": session_id})

    async def flush_cache(self) -> None:
        """Flush the engine's prefix cache.

        Raises:
            EngineRejectedError: the engine refused (requests still running).
            EngineUnavailableError: the engine failed or could not be reached.

        Cancellation:
            A checkpoint.
        """
        await self._call("/flush_cache", {})

    # ------------------------------------------------------------------ health / info
    async def health_status(self) -> int:
        """``GET /health`` (with the config's retries); the HTTP status of the last answer.

        Don't use it while the engine is paused (SGLang's probe generation blocks:
        docs/client-quirks.md#health-checks-while-paused).

        Raises:
            BackendTimeoutError: no answer in time on any attempt.
            EngineUnavailableError: the engine could not be reached; ``__cause__`` is the
                ``httpx.TransportError`` (``httpx.ConnectError`` when the connection was refused).

        Cancellation:
            A checkpoint.
        """
        return (await self._send("GET", "/health", None)).status_code

    async def health(self) -> bool:
        """True when the engine answers ``GET /health`` with 200; never raises.

        Cancellation:
            A checkpoint.
        """
        try:
            return await self.health_status() == 200
        except RelaxError:
            return False

    async def model_info(self) -> dict[str, Any]:
        """``GET /model_info``: ``model_path``, ``weight_version``, the served config...

        Raises:
            BackendError: HTTP error, invalid JSON or unreachable engine.

        Cancellation:
            A checkpoint.
        """
        return json_object(await self._call("/model_info", method="GET"), self.url)

    async def server_info(self) -> dict[str, Any]:
        """``GET /server_info``: ``context_length``, ``max_req_input_len``, ``frontend``...

        Raises:
            BackendError: HTTP error, invalid JSON or unreachable engine.

        Cancellation:
            A checkpoint.
        """
        return json_object(await self._call("/server_info", method="GET"), self.url)


@attrs.define(eq=False)
class SGLangConnections:
    """The two connection pools of SGLang-API clients, shared by every client made here
    (SGLang's :class:`relaxtrio.fleet.engine_api.EngineConnections`); open it with
    :func:`open_connections`.

    Attributes:
        generation: the pool of ``/generate`` traffic (all engines).
        control: the ``httpx.AsyncClient`` of control traffic (all engines).
        config: the default limits and timeouts of the clients.
    """

    generation: httpx.AsyncClient | ConnectionPool
    control: httpx.AsyncClient
    config: EngineClientConfig

    def client(self, url: str, config: EngineClientConfig | None = None) -> EngineClient:
        """A client of the engine at ``url`` on these pools (``config``: its timeouts and
        retries; the pool sizes are the pools'). Cheap: no I/O."""
        return EngineClient(url, generation=self.generation, control=self.control,
                            config=config or self.config)


@asynccontextmanager
async def open_connections(
    config: EngineClientConfig | None = None,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AsyncIterator[SGLangConnections]:
    """Open the generation and control pools that SGLang-API clients share.

    Args:
        config: pool sizes, timeouts and retry policy; defaults as in
            :class:`EngineClientConfig`.
        transport: custom transport for both pools (tests use ``httpx.MockTransport``);
            then both are ``httpx.AsyncClient`` s. Without one, ``/generate`` goes through a
            :class:`~._pool.ConnectionPool` (a small fraction of httpx's CPU per call) and
            control calls an ``httpx.AsyncClient``.

    Yields:
        The pools; both are closed on exit.

    Cancellation:
        Exiting closes the pools; in-flight calls must have finished or been cancelled.
    """
    cfg = config or EngineClientConfig()
    async with open_pools(cfg, transport) as (generation, control):
        yield SGLangConnections(generation=generation, control=control, config=cfg)


@asynccontextmanager
async def open_engine_client(
    url: str,
    *,
    max_generation_connections: int | None = None,
    max_control_connections: int | None = None,
    config: EngineClientConfig | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AsyncIterator[EngineClient]:
    """Open an :class:`EngineClient` of one engine with pools of its own.

    Args:
        url: the engine's base URL (an SGLang server or an embedded engine).
        max_generation_connections: size of the generation pool (default: ``config``'s, 1024).
        max_control_connections: size of the control pool (default: ``config``'s, 32).
        config: timeouts and retry policy; defaults as in :class:`EngineClientConfig`.
        transport: custom transport for both pools (see :func:`open_connections`).

    Yields:
        The client; both pools are closed on exit.

    Cancellation:
        Exiting closes the pools; in-flight calls must have finished or been cancelled.
    """
    cfg = config or EngineClientConfig()
    if max_generation_connections is not None:
        cfg = attrs.evolve(cfg, max_generation_connections=max_generation_connections)
    if max_control_connections is not None:
        cfg = attrs.evolve(cfg, max_control_connections=max_control_connections)
    async with open_connections(cfg, transport=transport) as connections:
        yield connections.client(url)
