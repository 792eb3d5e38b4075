"""The one client relaxtrio uses for SGLang servers and for the embedded CPU engine.

It speaks SGLang's native HTTP API (https://docs.sglang.io/basic_usage/native_api.html):
``/generate`` with input ids and logprobs, ``/abort_request``, pause / continue, weight updates,
health and info.

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
- **Fan-out** (docs/client-quirks.md#no-abort-through-the-router): abort, pause, continue, weight
  updates and ``close_session`` go to every engine URL, because an abort must reach the engine that
  holds the rid, and the router has no abort route. Aborting a rid an engine does not hold is a
  harmless no-op there.
- **Errors** say whose fault a failure is, by type: a 400 whose text matches one of the six
  context-length messages (docs/client-quirks.md#context-length-error-texts) becomes
  :class:`~relaxtrio.ContextLengthExceededError`; any other 4xx
  :class:`~relaxtrio.EngineRejectedError` (this request was refused); a 5xx, a transport failure
  or a response that breaks the protocol :class:`~relaxtrio.EngineUnavailableError` (the engine is
  broken), with timeouts as its subclass :class:`~relaxtrio.BackendTimeoutError`. Both engine
  errors carry ``engine_url`` and ``status_code``.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import attrs
import httpx
import trio

from .._errors import EngineRejectedError, EngineUnavailableError, RelaxError
from ._http import EngineClientConfig, json_object, send_with_retries
from ._ids_json import IdsJsonEncoder
from ._pool import ConnectionPool
from ._replies import (
    CONTEXT_LENGTH_MARKERS,
    GenerateResult,
    error_from_response,
    parse_generate_response,
)
from .wire import SamplingParams

__all__ = [
    "CONTEXT_LENGTH_MARKERS",
    "EngineClient",
    "EngineClientConfig",
    "GenerateResult",
    "SamplingParams",
    "context_token_limit",
    "open_engine_client",
]

PauseMode = Literal["abort", "retract", "in_place"]


def context_token_limit(server_info: Mapping[str, Any]) -> int | None:
    """The most tokens one lineage can hold on an engine, prompt plus generation.

    SGLang refuses a request whose prompt plus explicit ``max_new_tokens`` *reaches* the context
    length (its tokenizer-stage "Requested token count exceeds ..."), then silently clamps
    ``max_new_tokens`` to ``max_req_len - prompt - 1`` with ``max_req_len = context_length - 1``
    (docs/client-quirks.md#silent-clamp-of-max_new_tokens). A budget clamped to
    ``context_length - prompt`` is therefore always refused; ``context_length - 2`` is the most
    that is both accepted and generated in full. Engines that report only ``max_req_input_len``
    (already below the context length) get that.

    Args:
        server_info: the engine's ``/server_info`` (``/get_server_info``) object.

    Returns:
        Tokens (>= 1), or None when the engine reports neither field.
    """
    context = server_info.get("context_length")
    if isinstance(context, int) and context > 2:
        return context - 2
    limit = server_info.get("max_req_input_len")
    return limit if isinstance(limit, int) and limit >= 1 else None


def _stable_hash(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


class EngineClient:
    """Client of one or more SGLang-compatible engines; build it with :func:`open_engine_client`.

    Args:
        urls: engine base URLs (``http://host:port``), without a trailing slash.
        generation: the pool of generation traffic (an :class:`~._pool.ConnectionPool`, or an
            ``httpx.AsyncClient`` when a custom transport is in use).
        control: the ``httpx.AsyncClient`` of control traffic.
        config: limits and timeouts.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        generation: httpx.AsyncClient | ConnectionPool,
        control: httpx.AsyncClient,
        config: EngineClientConfig,
    ):
        if not urls:
            raise ValueError("at least one engine URL is required")
        self.urls: tuple[str, ...] = tuple(u.rstrip("/") for u in urls)
        self.config = config
        self._generation = generation
        self._control = control
        self._in_flight = dict.fromkeys(self.urls, 0)
        self._ids_json = IdsJsonEncoder()
        # /generate: no read limit (a generation may run for minutes), a bounded connect.
        self._generate_timeout = httpx.Timeout(None, connect=config.connect_timeout_s)

    # ------------------------------------------------------------------ transport
    async def _call(
        self,
        url: str,
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
        timeout = httpx.Timeout(
            self.config.weight_update_timeout_s if slow else self.config.control_timeout_s,
            connect=self.config.connect_timeout_s,
        )
        response = await send_with_retries(
            self._control, method, url, path, body, httpx_timeout=timeout, config=self.config
        )
        if response.status_code >= 400:
            raise error_from_response(
                response.status_code, response.content, engine_url=url, path=path
            )
        return response

    async def _fan_out(self, call: Callable[[str], Awaitable[object]]) -> None:
        """Run ``call(url)`` on every engine concurrently; re-raise the first failure."""
        errors: list[RelaxError] = []

        async def one(url: str) -> None:
            try:
                await call(url)
            except RelaxError as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            for url in self.urls:
                nursery.start_soon(one, url)
        if errors:
            raise errors[0]

    def _pick(self, routing_key: str | None) -> str:
        if len(self.urls) == 1:
            return self.urls[0]
        if routing_key is not None:
            return self.urls[_stable_hash(routing_key) % len(self.urls)]
        return min(self.urls, key=lambda u: self._in_flight[u])

    # ------------------------------------------------------------------ generation
    async def generate(
        self,
        input_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        rid: str,
        return_logprob: bool = True,
        session_id: str | None = None,
        routing_key: str | None = None,
        image_data: Sequence[str] | None = None,
        headers: dict[str, str] | None = None,
        prefix_key: str | None = None,
    ) -> GenerateResult:
        """Generate from token ids on one engine (``POST /generate``, single form).

        Args:
            input_ids: prompt ids, length >= 1; with images, one placeholder token per image
                (the engine expands them).
            sampling: SGLang native sampling parameters.
            rid: request id, the abort key; no rid may be a prefix of another
                (docs/client-quirks.md#abort-matches-rid-prefixes).
            return_logprob: request per-token logprobs (required for training).
            session_id: passed through as SGLang's top-level ``session_id``.
            routing_key: engines are chosen by a stable hash of this key (sticky); when None,
                the engine with the fewest in-flight generations from this client is used.
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
        url = self._pick(routing_key)
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
        self._in_flight[url] += 1
        try:
            response = await send_with_retries(
                self._generation, "POST", url, "/generate", body,
                httpx_timeout=self._generate_timeout, config=self.config, headers=headers,
            )
        finally:
            self._in_flight[url] -= 1
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

    # ------------------------------------------------------------------ control (fan-out)
    async def abort(self, rid: str) -> None:
        """Ask every engine to abort ``rid`` (fire-and-forget: 200 means "received").

        The abort is complete only when the matching :meth:`generate` call returns
        (docs/client-quirks.md#abort-is-acknowledged-early).

        Raises:
            BackendError: an engine could not be reached (after retries).

        Cancellation:
            A checkpoint; engines already reached keep the abort.
        """
        await self._fan_out(lambda url: self._call(url, "/abort_request", {"rid": rid}))

    async def abort_all(self) -> None:
        """Abort every request on every engine.

        Raises:
            BackendError: an engine could not be reached (after retries).

        Cancellation:
            A checkpoint; engines already reached keep the abort.
        """
        await self._fan_out(lambda url: self._call(url, "/abort_request", {"abort_all": True}))

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """Pause every engine; new generations block there until continue.

        Raises:
            BackendError: an engine failed or could not be reached.

        Cancellation:
            A checkpoint; engines already reached stay paused — call
            :meth:`continue_generation` (shielded) to undo.
        """
        await self._fan_out(
            lambda url: self._call(url, "/pause_generation", {"mode": mode}, slow=True)
        )

    async def continue_generation(self) -> None:
        """Resume every engine after :meth:`pause_generation`.

        Raises:
            BackendError: an engine failed or could not be reached.

        Cancellation:
            A checkpoint; engines already reached have resumed.
        """
        await self._fan_out(lambda url: self._call(url, "/continue_generation", {}))

    async def update_weights_from_disk(
        self,
        model_path: str,
        *,
        weight_version: str | None,
        abort_all_requests: bool = False,
        flush_cache: bool = True,
    ) -> None:
        """Load a checkpoint directory on every engine.

        Without a pause an engine waits for all its in-flight requests first
        (docs/client-quirks.md#weight-update-waits-for-in-flight-requests); pause
        with ``retract`` before calling this for a fast, loss-free update.

        Args:
            model_path: checkpoint directory visible to every engine.
            weight_version: new version label (None keeps the old label).
            abort_all_requests: abort in-flight requests first.
            flush_cache: flush the prefix cache after loading.

        Raises:
            EngineRejectedError: an engine answered ``success: false`` (HTTP 400). On SGLang
                the weights may already be loaded when only the cache flush failed.
            EngineUnavailableError: an engine failed or could not be reached.

        Cancellation:
            A checkpoint; engines that already started loading finish doing so.
        """
        body: dict[str, Any] = {
            "model_path": model_path,
            "abort_all_requests": abort_all_requests,
            "flush_cache": flush_cache,
        }
        if weight_version is not None:
            body["weight_version"] = weight_version

        async def one(url: str) -> None:
            response = await self._call(url, "/update_weights_from_disk", body, slow=True)
            payload = json_object(response, url)
            if payload.get("success") is not True:
                raise EngineRejectedError(
                    f"engine {url} failed to update weights: {payload.get('message')}",
                    engine_url=url,
                    status_code=response.status_code,
                )

        await self._fan_out(one)

    async def update_weight_version(self, new_version: str, *, abort_all_requests: bool = False) -> None:
        """Relabel the weights on every engine; always sends ``abort_all_requests``.

        See docs/client-quirks.md#version-relabel-aborts-by-default.

        Raises:
            BackendError: an engine failed or could not be reached.

        Cancellation:
            A checkpoint; engines already reached keep the new label.
        """
        body = {"new_version": new_version, "abort_all_requests": abort_all_requests}
        await self._fan_out(lambda url: self._call(url, "/update_weight_version", body))

    async def close_session(self, session_id: str) -> None:
        """Release a session's engine-side state on every engine (no-op where unknown).

        Raises:
            BackendError: an engine could not be reached.

        Cancellation:
            A checkpoint.
        """
        await self._fan_out(
            lambda url: self._call(url, "/close_session", {"session_id": session_id})
        )

    async def flush_cache(self) -> None:
        """Flush the prefix cache on every engine.

        Raises:
            EngineRejectedError: an engine refused (requests still running).
            EngineUnavailableError: an engine failed or could not be reached.

        Cancellation:
            A checkpoint.
        """
        await self._fan_out(lambda url: self._call(url, "/flush_cache", {}))

    # ------------------------------------------------------------------ health / info
    async def health(self) -> bool:
        """True when every engine answers ``GET /health`` with 200; never raises.

        Don't use it while engines are paused (SGLang's probe generation blocks:
        docs/client-quirks.md#health-checks-while-paused).

        Cancellation:
            A checkpoint.
        """
        results: list[bool] = []

        async def one(url: str) -> None:
            try:
                response = await self._call(url, "/health", method="GET")
            except RelaxError:
                results.append(False)
            else:
                results.append(response.status_code == 200)

        async with trio.open_nursery() as nursery:
            for url in self.urls:
                nursery.start_soon(one, url)
        return all(results)

    async def model_info(self, url: str | None = None) -> dict[str, Any]:
        """``GET /model_info`` of one engine (default: the first).

        Raises:
            BackendError: HTTP error, invalid JSON or unreachable engine.

        Cancellation:
            A checkpoint.
        """
        target = url or self.urls[0]
        return json_object(await self._call(target, "/model_info", method="GET"), target)

    async def server_info(self, url: str | None = None) -> dict[str, Any]:
        """``GET /server_info`` of one engine (default: the first).

        Raises:
            BackendError: HTTP error, invalid JSON or unreachable engine.

        Cancellation:
            A checkpoint.
        """
        target = url or self.urls[0]
        return json_object(await self._call(target, "/server_info", method="GET"), target)


@asynccontextmanager
async def open_engine_client(
    urls: Sequence[str],
    *,
    max_generation_connections: int | None = None,
    max_control_connections: int | None = None,
    config: EngineClientConfig | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AsyncIterator[EngineClient]:
    """Open an :class:`EngineClient` with separate generation and control connection pools.

    Args:
        urls: engine base URLs (SGLang servers or embedded engines).
        max_generation_connections: size of the generation pool (default: ``config``'s, 1024).
        max_control_connections: size of the control pool (default: ``config``'s, 32).
        config: timeouts and retry policy; defaults as in :class:`EngineClientConfig`.
        transport: custom transport for both pools (tests use ``httpx.MockTransport``);
            then both are ``httpx.AsyncClient`` s. Without one, ``/generate`` goes through a
            :class:`~._pool.ConnectionPool` (a small fraction of httpx's CPU per call) and
            control calls an ``httpx.AsyncClient``.

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
    generation_limits = httpx.Limits(
        max_connections=cfg.max_generation_connections,
        max_keepalive_connections=cfg.max_generation_connections,
    )
    control_limits = httpx.Limits(
        max_connections=cfg.max_control_connections,
        max_keepalive_connections=cfg.max_control_connections,
    )
    generation_pool: httpx.AsyncClient | ConnectionPool = (
        ConnectionPool(max_connections=cfg.max_generation_connections) if transport is None
        else httpx.AsyncClient(limits=generation_limits, transport=transport)
    )
    async with (
        generation_pool as generation,
        httpx.AsyncClient(limits=control_limits, transport=transport) as control,
    ):
        yield EngineClient(urls, generation=generation, control=control, config=cfg)
