"""The inference fleet: the workers of a run, behind the SGLang Model Gateway or connected directly.

:class:`EngineFleet` is what ``train``, ``rollout``, ``serve``, ``doctor`` and the turn code talk
to, whether there is one engine or many; it answers the calls of one engine
(:class:`~relaxtrio.fleet.engine_api.EngineAPI`: ``generate``, ``abort``, pause / continue,
weight updates, ``close_session``, info) and adds routing, membership and fault handling. It
*has* its parts: the :class:`~relaxtrio.fleet.members.Membership` of its workers (each with
per-engine clients of one wire protocol), the :class:`~relaxtrio.fleet.gateway.Gateway` when
one is in front, the :class:`~relaxtrio.fleet.health.HealthMonitor` and the
:class:`~relaxtrio.fleet.routing.SessionRoutes` of direct mode.

Workers are reached through a gateway (``--sglang-router-url``; generations carry the Session id
as routing key, :mod:`relaxtrio.fleet.gateway`) or directly (``--engine-url``, or launched engines
without a gateway; the fleet routes, :mod:`relaxtrio.fleet.routing`). Control calls go to every
worker (:mod:`relaxtrio.fleet.control`).

Faults. A worker is removed, with a logged reason, when a connection to it is refused or it stops
answering health probes (:mod:`relaxtrio.fleet.health`). Its in-flight generations end at once as
if aborted with no output: the turn code resumes them through its partial-rollout path (new rid,
same lineage) on another worker, while the agent's HTTP request stays open. A generation that
fails through the gateway is handled the same way after the fleet re-read the listing and probed
every worker. Below ``min_healthy_engines`` every call raises :class:`~relaxtrio.BackendError`
and so does the fleet's nursery, which stops the run.

Weights (:meth:`EngineFleet.update_weights`): every worker is paused, loads the version, has it
confirmed and is continued; a worker that fails is removed. A worker that joins later
(:meth:`EngineFleet.readmit`) loads the current version before it gets traffic. With
``session_lifecycle``, :meth:`EngineFleet.session_ended` closes the Session on the worker that
served it (on every worker through a gateway, which does not say where a key is pinned).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import attrs
import httpx
import trio

from .._errors import BackendError
from ..config import FleetConfig
from ..sglang.client import open_connections as open_sglang_connections
from .engine_api import (
    EngineClientConfig,
    EngineConnections,
    GenerateResult,
    OpenConnections,
    PauseMode,
    SamplingParams,
)
from .gateway import ROUTING_KEY_HEADER, Gateway
from .control import ControlFanout
from .engine_metrics import EngineMetrics
from .health import HealthMonitor
from .members import Membership, WeightPaths, Worker, path_for
from .generations import Generations
from .routing import SessionRoutes, check_rid

__all__ = ["ROUTING_KEY_HEADER", "EngineFleet", "FleetStatistics", "Worker", "open_engine_fleet"]

log = logging.getLogger(__name__)

@attrs.frozen(kw_only=True)
class FleetStatistics:
    """A snapshot of the fleet.

    Attributes:
        workers: base URLs of the healthy workers, in join order.
        removed: base URL → why it was removed.
        sessions: base URL → Sessions routed there (direct mode; empty through a gateway).
        in_flight: generations running.
        weight_version: the last version loaded on every worker, or None.
    """

    workers: tuple[str, ...]
    removed: dict[str, str]
    sessions: dict[str, int]
    in_flight: int
    weight_version: str | None


class EngineFleet:
    """The workers of one run; open it with :func:`open_engine_fleet`.

    Attributes:
        config: membership, health and lifecycle settings.
        members: who serves (:class:`~relaxtrio.fleet.members.Membership`).
        gateway: the gateway in front, or None (direct mode).
        monitor: the health probes.
        control: the control calls to every worker.
        routes: where each Session's generations go (direct mode).
        generations: the generations in flight.
        engine_counters: each worker's own counters, read per step (``engine/...`` figures).
        on_remove: called with ``(url, reason)`` after a worker was removed (a launcher kills
            a removed engine that still runs), or None.

    Args:
        config: the fleet settings.
        connections: the pools of the per-engine clients (their wire protocol).
        client_config: timeouts and retries of the per-engine clients.
        nursery: where background calls (gateway deletes, session closes) run.
        worker_urls: the workers (direct mode; through a gateway its listing is read).
        gateway_url: the gateway, or None for direct mode.
        gateway_http: the client of the gateway's admin calls (gateway mode).
    """

    def __init__(self, config: FleetConfig, *, connections: EngineConnections,
                 client_config: EngineClientConfig, nursery: trio.Nursery,
                 worker_urls: Sequence[str] = (), gateway_url: str | None = None,
                 gateway_http: httpx.AsyncClient | None = None):
        self.config = config
        self.members = Membership(config, connections=connections, client_config=client_config,
                                  gateway_mode=gateway_url is not None)
        self.gateway: Gateway | None = None
        gateway_client = None
        if gateway_url is not None:
            assert gateway_http is not None
            self.gateway = Gateway(gateway_url, members=self.members, remove=self.remove,
                                   http=gateway_http, config=config, client_config=client_config,
                                   nursery=nursery)
            gateway_client = self.members.client(self.gateway.url, single_attempt=True)
        self.monitor = HealthMonitor(self.members, self.gateway, self.remove)
        self.control = ControlFanout(self.members, self.gateway, self.remove)
        self.routes = SessionRoutes()
        self.generations = Generations(members=self.members, routes=self.routes,
                                       monitor=self.monitor, abort=self.abort, nursery=nursery,
                                       gateway_client=gateway_client)
        self.engine_counters = EngineMetrics()
        self.on_remove: Callable[[str, str], None] | None = None
        self._nursery = nursery
        for url in worker_urls:
            self.members.add(url.rstrip("/"))

    # ------------------------------------------------------------------ membership
    @property
    def urls(self) -> tuple[str, ...]:
        """Base URLs of the healthy workers."""
        return self.members.urls

    @property
    def workers(self) -> tuple[Worker, ...]:
        """The healthy workers."""
        return self.members.workers

    @property
    def gateway_url(self) -> str | None:
        """The gateway's base URL, or None (direct mode)."""
        return self.gateway.url if self.gateway is not None else None

    @property
    def weights_lock(self) -> trio.Lock:
        """Held while weights are loaded; hold it while writing a version."""
        return self.members.weights_lock

    @property
    def weights(self) -> tuple[str | WeightPaths, str] | None:
        """``(model_path, version)`` every worker loaded last, or None."""
        return self.members.weights

    def remove(self, url: str, reason: str, *, restarting: bool = False) -> None:
        """Take a worker out of the fleet, with a logged reason.

        Its in-flight generations end at once as lost (their turns resume on another worker),
        its control calls are cancelled, and (gateway mode) it is deleted from the gateway.
        When fewer than ``min_healthy_engines`` workers remain (a worker being restarted
        counts until :meth:`restart_failed`), the fleet fails: every later call, and the
        monitor, raise :class:`~relaxtrio.BackendError`.

        Args:
            url: the worker's base URL (unknown URLs are ignored).
            reason: why, for the log and the final error.
            restarting: its launcher restarts it and will :meth:`readmit` it; generations with
                no other worker wait for it.
        """
        worker = self.members.take_out(url, reason, restarting=restarting)
        if worker is None:
            return
        if self.on_remove is not None:
            self.on_remove(url, reason)
        self.generations.worker_left(worker, reason)
        self.routes.worker_left(worker)
        if self.gateway is not None:
            self.gateway.worker_left(worker.url, worker.worker_id)

    async def readmit(self, url: str) -> None:
        """Add a (restarted) worker: it loads the current weights first, then gets traffic.

        Raises:
            BackendError: it could not load or confirm the current weight version, or the
                gateway could not register it.

        Cancellation:
            Shielded once the weights are being loaded.
        """
        url = url.rstrip("/")
        members = self.members
        async with members.weights_lock:
            if members.weights is not None:
                client = members.client(url)
                path, version = members.weights
                with trio.CancelScope(shield=True):
                    await client.update_weights_from_disk(path_for(path, url),
                                                          weight_version=version)
                    await members.verify_version(client, version)
            members.readmitted(url)
            if self.gateway is not None:
                await self.gateway.register(url)
        log.info("fleet: worker %s joined with weights %s (%d healthy)", url,
                 members.version or "as launched", len(members.live))

    async def refresh(self) -> None:
        """Re-read the gateway's listing and apply it (gateway mode; else a no-op).

        Raises:
            EngineUnavailableError: the gateway stayed away too long, or the fleet failed.

        Cancellation:
            A checkpoint.
        """
        if self.gateway is not None:
            await self.gateway.refresh()

    def statistics(self) -> FleetStatistics:
        """A snapshot of membership, routing and the loaded weight version."""
        return FleetStatistics(
            workers=self.urls, removed=dict(self.members.removed),
            sessions={w.url: len(w.sessions) for w in self.members.workers},
            in_flight=len(self.generations.flights), weight_version=self.members.version,
        )

    async def gateway_metrics(self) -> dict[str, float]:
        """The gateway's requests and failures per worker, and its errors, since the last call
        (:mod:`relaxtrio.fleet.gateway_metrics`); empty without a gateway or its metrics port."""
        return await self.gateway.step_metrics() if self.gateway is not None else {}

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
        prefix_key: str | None = None,
    ) -> GenerateResult:
        """Generate on the Session's worker.

        Args:
            input_ids: prompt ids, length >= 1.
            sampling: sampling parameters (SGLang's native form).
            rid: request id, the abort key: ends in ``#`` with no other ``#``, unique.
            return_logprob: request per-token logprobs.
            session_id: the engine's session key (with ``session_lifecycle`` the routing key is
                sent when this is None).
            routing_key: the Session id: all requests with one key go to one worker.
            image_data: the prompt's images in placeholder order, or None.
            prefix_key: the family of prompts this one belongs to (the Session id), for the
                request body's reuse (:meth:`EngineAPI.generate`).

        While no worker can serve and one is coming back (restarting, or readmitted and not
        yet listed healthy by the gateway: :meth:`Membership.wait_servable`), the call waits for it
        instead of failing (docs/inference-fleet.md).

        Returns:
            The engine's result. When the worker is lost mid-request the result is an abort
            with no output (``finish_type == "abort"``), which the caller resumes like any
            partial rollout.

        Raises:
            ValueError: ``rid`` could be a prefix of another rid, or is already in flight.
            ContextLengthExceededError: the engine refused the prompt as too long.
            EngineRejectedError: a 4xx answer (a problem of this request).
            EngineUnavailableError: a malformed answer, or the fleet can no longer serve.

        Cancellation:
            A checkpoint. Cancelling drops the HTTP request (abort the rid first to keep the
            partial output).
        """
        check_rid(rid)
        if rid in self.generations.flights:
            raise ValueError(f"request id {rid!r} is already in flight")
        key = routing_key if routing_key is not None else session_id
        if session_id is None and self.config.session_lifecycle:
            session_id = key
        return await self.generations.run(
            input_ids, sampling, rid=rid, key=key, session_id=session_id,
            return_logprob=return_logprob, image_data=image_data, prefix_key=prefix_key)

    async def abort(self, rid: str) -> None:
        """Ask every worker to abort ``rid`` (fire-and-forget; done when generate returns).

        Raises:
            EngineRejectedError: a reachable worker refused.
            EngineUnavailableError: too few workers remain.

        Cancellation:
            A checkpoint; workers already reached keep the abort.
        """
        await self.control.each(lambda w: w.client.abort(rid))

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """Pause every worker (``mode`` as :meth:`EngineAPI.pause_generation`'s); health probes
        stop until :meth:`continue_generation`.

        Raises:
            EngineRejectedError: a worker refused.
            EngineUnavailableError: too few workers remain.

        Cancellation:
            A checkpoint; workers already paused stay paused (call continue, shielded).
        """
        self.members.paused += 1
        await self.control.each(lambda w: w.client.pause_generation(mode))

    async def continue_generation(self) -> None:
        """Resume every worker after :meth:`pause_generation`.

        Raises:
            EngineRejectedError: a worker refused.
            EngineUnavailableError: too few workers remain.

        Cancellation:
            A checkpoint; workers already reached have resumed.
        """
        try:
            await self.control.each(lambda w: w.client.continue_generation())
        finally:
            self.members.paused = max(0, self.members.paused - 1)

    async def update_weights_from_disk(
        self, model_path: str, *, weight_version: str | None, abort_all_requests: bool = False,
        flush_cache: bool = True,
    ) -> None:
        """Load a checkpoint directory on every worker, without the pause bracket.

        Raises:
            EngineRejectedError: a worker answered ``success: false``.
            EngineUnavailableError: too few workers remain.

        Cancellation:
            A checkpoint; workers that started loading finish.
        """
        await self.control.each(lambda w: w.client.update_weights_from_disk(
            model_path, weight_version=weight_version, abort_all_requests=abort_all_requests,
            flush_cache=flush_cache))

    async def update_weights(self, model_path: str | WeightPaths, version: str) -> None:
        """Bring every worker to weight version ``version`` before any generates again
        (:meth:`~relaxtrio.fleet.control.ControlFanout.update_weights`: pause with ``retract``,
        load, confirm the version, continue; a worker that fails is removed).

        Args:
            model_path: what every worker loads (a directory they can all read, or a
                shared-memory manifest for embedded engines), or a function giving each
                worker's (by its base URL; a worker that joins later is asked too).
            version: the new version label.

        Raises:
            EngineUnavailableError: too few workers remain.

        Cancellation:
            Shielded: the workers are never left paused.
        """
        await self.control.update_weights(model_path, version)

    async def flush_cache(self) -> None:
        """Flush the prefix cache on every worker.

        Raises:
            EngineRejectedError: a worker refused (requests still running).
            EngineUnavailableError: too few workers remain.

        Cancellation:
            A checkpoint.
        """
        await self.control.each(lambda w: w.client.flush_cache())

    async def close_session(self, session_id: str) -> None:
        """Release a Session's engine-side state where it was served (see the module docs).

        Raises:
            EngineRejectedError: a reachable worker refused.
            EngineUnavailableError: too few workers remain.

        Cancellation:
            A checkpoint.
        """
        worker, through_gateway = self.routes.end(self.members, session_id)
        if worker is not None:
            await self.control.each(lambda w: w.client.close_session(session_id), [worker])
        elif through_gateway:
            await self.control.each(lambda w: w.client.close_session(session_id))

    def session_ended(self, session_id: str) -> None:
        """A Session ended: forget its routing; with ``session_lifecycle``, close it on the
        engine in the background (failures are logged, never raised)."""
        if not self.config.session_lifecycle:
            self.routes.end(self.members, session_id)
        elif self.routes.knows(session_id):
            self._nursery.start_soon(self._close_quietly, session_id)

    async def _close_quietly(self, session_id: str) -> None:
        try:
            await self.close_session(session_id)
        except BackendError as exc:
            log.warning("fleet: close_session %s failed: %s", session_id, exc)

    # ------------------------------------------------------------------ info
    async def model_info(self, url: str | None = None) -> dict[str, Any]:
        """:meth:`EngineAPI.model_info` of one worker (default: the first healthy one).

        Raises:
            BackendError: HTTP error, invalid JSON or unreachable worker.

        Cancellation:
            A checkpoint.
        """
        return await self.members.pick(url).model_info()

    async def server_info(self, url: str | None = None) -> dict[str, Any]:
        """:meth:`EngineAPI.server_info` of one worker (default: the first healthy one).

        Raises:
            BackendError: HTTP error, invalid JSON or unreachable worker.

        Cancellation:
            A checkpoint.
        """
        return await self.members.pick(url).server_info()


@asynccontextmanager
async def open_engine_fleet(
    config: FleetConfig,
    *,
    worker_urls: Sequence[str] = (),
    gateway_url: str | None = None,
    expect_urls: Sequence[str] = (),
    client_config: EngineClientConfig | None = None,
    open_connections: OpenConnections = open_sglang_connections,
) -> AsyncIterator[EngineFleet]:
    """Open the fleet: pools, the worker listing, and the health monitor.

    Args:
        config: membership, health and lifecycle settings.
        worker_urls: workers without a gateway (direct mode).
        gateway_url: the gateway (gateway mode); its ``GET /workers`` is read before yielding.
        expect_urls: gateway mode: workers the gateway was started with (launched engines). The
            fleet opens once the gateway lists all of them, so the first Sessions (whose routing
            keys stick to the worker that served them first) spread over every engine instead
            of all landing on the first one registered; after ``gateway_wait_s`` it opens with
            what is listed, with a warning.
        client_config: timeouts and retries of the per-worker clients.
        open_connections: opens the pools of the workers' wire protocol (default: SGLang's
            native API, :func:`relaxtrio.sglang.client.open_connections`).

    Yields:
        The fleet; the monitor runs while inside.

    Raises:
        ValueError: both or neither of ``worker_urls`` and ``gateway_url``.
        EngineUnavailableError: no worker (empty listing or URL list), the gateway unreachable,
            or (from the monitor, cancelling the body) the fleet could no longer serve.

    Cancellation:
        Exiting stops the monitor and closes the pools.
    """
    cfg = client_config or EngineClientConfig()
    if (gateway_url is None) == (not worker_urls):
        raise ValueError("give either worker_urls or gateway_url")
    async with AsyncExitStack() as stack:
        connections = await stack.enter_async_context(open_connections(cfg))
        gateway_http = None
        if gateway_url is not None:
            limits = httpx.Limits(max_connections=cfg.max_control_connections,
                                  max_keepalive_connections=cfg.max_control_connections)
            gateway_http = await stack.enter_async_context(httpx.AsyncClient(limits=limits))
        nursery = await stack.enter_async_context(trio.open_nursery())
        fleet = EngineFleet(config, connections=connections, client_config=cfg, nursery=nursery,
                            worker_urls=worker_urls, gateway_url=gateway_url,
                            gateway_http=gateway_http)
        if fleet.gateway is not None:
            await fleet.gateway.await_listing(config.gateway_wait_s, expect_urls)
        log.info("fleet: %d worker(s)%s: %s", len(fleet.urls),
                 f" behind gateway {gateway_url}" if gateway_url else "", ", ".join(fleet.urls))
        await nursery.start(fleet.monitor.run)
        try:
            yield fleet
        finally:
            nursery.cancel_scope.cancel()
