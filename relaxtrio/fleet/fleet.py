"""The inference fleet: SGLang-API workers behind the SGLang Model Gateway, or connected directly.

:class:`EngineFleet` is what the turn code and the driver talk to; it answers the same calls as
:class:`~relaxtrio.sglang.client.EngineClient` (``generate``, ``abort``, pause / continue, weight
updates, ``close_session``, info) and adds routing, membership and fault handling.

Two ways to reach the workers:

- **Gateway** (``--sglang-router-url``): every ``/generate`` goes through the gateway with the
  header ``X-SMG-Routing-Key: <session id>``. With the gateway's ``manual`` policy that key is
  pinned to one worker until the worker leaves, so every turn of a Session reuses that worker's
  prefix cache. The gateway (sglang-router 0.3.2) has no abort, pause, continue or weight-update
  route (docs/client-quirks.md#no-abort-through-the-router), so control calls go to every
  worker of its ``GET /workers`` listing, which the health monitor re-reads, and so does every
  control call once the last reading is older than a second.
- **Direct** (``--engine-url``): the fleet routes itself. A Session's first request goes to the
  worker holding the fewest Sessions, and every later one to the same worker.

Request ids: the rollout's rids end in ``#`` and contain no other ``#``, so none is a prefix of
another (SGLang aborts by prefix: docs/client-quirks.md#abort-matches-rid-prefixes); they
contain the Session id, which is unique, so they are unique across workers. :meth:`EngineFleet.generate` refuses a rid that breaks either rule.

Faults. A worker is removed, with a logged reason, when a connection to it is refused, or when it
fails ``health_failures`` probes in a row (it stopped answering). Its in-flight generations end at
once as if aborted with no output: the turn code resumes them through its partial-rollout path
(new rid, same lineage), on another worker, while the agent's HTTP request stays open. A
generation that fails through the gateway (the gateway answers 5xx, or is unreachable) is
handled the same way after the fleet has re-read the gateway's listing and probed every worker;
an unreachable gateway is waited for up to ``gateway_wait_s`` (a restart is survived). When
fewer than ``min_healthy_engines`` workers remain, every call raises
:class:`~relaxtrio.BackendError` and the fleet's nursery raises it too, which stops the run.

Weights (:meth:`EngineFleet.update_weights`): pause every worker (``retract``), load the new
version on every worker, read back each worker's ``/model_info`` ``weight_version``, continue
every worker. A worker that reports another version is removed; so the next generation anywhere
runs on the new version. A worker that joins later (:meth:`EngineFleet.readmit`) loads the
current version before it gets traffic.

Session lifecycle (``session_lifecycle``): generations carry ``session_id``, and
:meth:`EngineFleet.session_ended` sends ``/close_session`` to the worker that served the Session
(direct mode), or to every worker (gateway mode: the gateway does not say which worker a key is
pinned to; the call is a no-op on the others).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final

import attrs
import httpx
import trio

from .._errors import BackendError, EngineUnavailableError
from ..config import FleetConfig
from ..sglang._http import EngineClientConfig
from .members import (
    GATEWAY_POLL_S,
    FleetMembers,
    WeightPaths,
    Worker,
    path_for,
    worker_failure,
)
from ..sglang._replies import GenerateResult
from ..sglang.client import PauseMode
from ..sglang.wire import SamplingParams

__all__ = ["ROUTING_KEY_HEADER", "EngineFleet", "FleetStatistics", "Worker", "open_engine_fleet"]

log = logging.getLogger(__name__)

ROUTING_KEY_HEADER: Final = "X-SMG-Routing-Key"
"""The gateway's routing-key header (sglang-router 0.3.2; ``--policy manual`` pins keys)."""

ABORT_GRACE_S: Final = 5.0


def check_rid(rid: str) -> None:
    """Refuse a request id that could be a prefix of another one (SGLang aborts by prefix).

    Raises:
        ValueError: ``rid`` does not end in ``#`` or has another ``#`` inside.
    """
    if not rid.endswith("#") or "#" in rid[:-1]:
        raise ValueError(f"request id {rid!r} must end in '#' and contain no other '#'")


def lost_result(rid: str, reason: str, weight_version: str) -> GenerateResult:
    """The answer of a generation whose worker went away: an abort with no output."""
    meta = {"id": rid, "finish_reason": {"type": "abort", "message": reason},
            "completion_tokens": 0, "weight_version": weight_version}
    return GenerateResult(
        output_ids=(), output_logprobs=(), finish_type="abort", finish_matched=None,
        prompt_tokens=None, completion_tokens=0, cached_tokens=None,
        weight_version=weight_version, weight_versions=(), text="", meta_info=meta,
    )


@attrs.define(eq=False)
class _Flight:
    rid: str
    worker: Worker | None  # None: sent through the gateway
    started: float
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    lost: str | None = None

    def lose(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
            self.scope.cancel()


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


class EngineFleet(FleetMembers):
    """The workers of one run; build it with :func:`open_engine_fleet`.

    Takes the arguments of :class:`~relaxtrio.fleet.members.FleetMembers` (config, worker
    URLs or gateway, the two connection pools, client config, a nursery for background calls).
    """

    def __init__(self, config: FleetConfig, **kwargs: Any):
        super().__init__(config, **kwargs)
        self._flights: dict[str, _Flight] = {}
        self._session_worker: dict[str, str] = {}
        self._gateway_keys: set[str] = set()
        self._gateway_client = (
            self._client(self.gateway_url, self._generate_config) if self.gateway_url else None
        )

    def _worker_removed(self, worker: Worker, reason: str) -> None:
        for flight in list(self._flights.values()):
            if flight.worker is worker:
                flight.lose(f"worker {worker.url} removed: {reason}")
        for session_id in worker.sessions:
            self._session_worker.pop(session_id, None)
        orphans = [f for f in self._flights.values() if f.worker is None]
        if orphans:  # through the gateway we do not know which worker ran them
            self._nursery.start_soon(self._reclaim, orphans, worker.url)

    def statistics(self) -> FleetStatistics:
        """A snapshot of membership, routing and the loaded weight version."""
        return FleetStatistics(
            workers=self.urls, removed=dict(self._removed),
            sessions={w.url: len(w.sessions) for w in self._live.values()},
            in_flight=len(self._flights),
            weight_version=self.weights[1] if self.weights else None,
        )

    async def _reclaim(self, flights: Sequence[_Flight], removed_url: str) -> None:
        """Gateway mode: end the generations that may have been on a removed worker.

        They are aborted on every remaining worker (those return their partial output and
        resume there); whichever is still running after ``ABORT_GRACE_S`` was on the removed
        worker and is ended as lost.
        """
        rids = [f.rid for f in flights if f.lost is None]
        for rid in rids:
            try:
                await self.abort(rid)
            except BackendError as exc:
                log.warning("fleet: abort of %s failed: %s", rid, exc)
        await trio.sleep(ABORT_GRACE_S)
        for flight in flights:
            if self._flights.get(flight.rid) is flight:
                flight.lose(f"its worker may have been {removed_url}, which was removed")

    # ------------------------------------------------------------------ generation
    def _route(self, key: str | None) -> Worker:
        if not self._live:
            self._check_quorum()
            raise EngineUnavailableError("no healthy engine to generate on")
        if key is None:
            load = {url: 0 for url in self._live}
            for flight in self._flights.values():
                if flight.worker is not None and flight.worker.url in load:
                    load[flight.worker.url] += 1
            return self._live[min(load, key=load.__getitem__)]
        url = self._session_worker.get(key)
        if url is not None and url in self._live:
            return self._live[url]
        worker = min(self._live.values(), key=lambda w: len(w.sessions))
        worker.sessions.add(key)
        self._session_worker[key] = worker.url
        return worker

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
        """Generate on the Session's worker (``POST /generate``, single form).

        Args:
            input_ids: prompt ids, length >= 1.
            sampling: SGLang native sampling parameters.
            rid: request id, the abort key: ends in ``#`` with no other ``#``, unique.
            return_logprob: request per-token logprobs.
            session_id: sent as SGLang's top-level ``session_id`` (with ``session_lifecycle`` the
                routing key is sent when this is None).
            routing_key: the Session id: all requests with one key go to one worker.
            image_data: the prompt's images in placeholder order, or None.
            prefix_key: the family of prompts this one belongs to (the Session id), for the
                request body's JSON reuse (:meth:`EngineClient.generate`).

        While no worker can serve and one is coming back (restarting, or readmitted and not
        yet listed healthy by the gateway: ``FleetMembers.wait_servable``), the call waits for
        it instead of failing: a restarting worker until its supervisor readmits it or gives it
        up, a readmitted one at most ``JOIN_GRACE_S`` (docs/inference-fleet.md).

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
        if rid in self._flights:
            raise ValueError(f"request id {rid!r} is already in flight")
        if self._fatal is not None:
            raise self._fatal
        key = routing_key if routing_key is not None else session_id
        if session_id is None and self.config.session_lifecycle:
            session_id = key
        headers = None
        await self.wait_servable()  # every worker is being restarted (or re-registered)
        if self._fatal is not None:
            raise self._fatal
        if self._gateway_client is not None:
            worker, client = None, self._gateway_client
            if key is not None:
                headers = {ROUTING_KEY_HEADER: key}
                self._gateway_keys.add(key)
        else:
            worker = self._route(key)
            client = worker.generation_client
        flight = _Flight(rid=rid, worker=worker, started=trio.current_time())
        self._flights[rid] = flight
        failure: BackendError | None = None
        try:
            with flight.scope:
                try:
                    return await client.generate(
                        input_ids, sampling, rid=rid, return_logprob=return_logprob,
                        session_id=session_id, image_data=image_data, headers=headers,
                        prefix_key=prefix_key)
                except BackendError as exc:
                    if not worker_failure(exc):
                        raise
                    failure = exc
        finally:
            del self._flights[rid]
        if flight.lost is None:
            assert failure is not None
            where = worker.url if worker is not None else f"gateway {self.gateway_url}"
            log.warning("fleet: generation %s failed on %s: %s", rid, where, failure)
            await self._recover(worker, failure, flight.started)
            with trio.CancelScope(shield=True), trio.move_on_after(ABORT_GRACE_S):
                try:
                    await self.abort(rid)  # it may still run somewhere; free that worker
                except BackendError:
                    pass
            flight.lost = f"generation failed: {failure}"
        if self._fatal is not None:
            raise self._fatal
        log.warning("fleet: request %s resumes on %s (%s)", rid,
                    "another worker" if self.urls else "the next worker available", flight.lost)
        version = self.weights[1] if self.weights else "default"
        return lost_result(rid, flight.lost, version)

    # ------------------------------------------------------------------ control fan-out
    async def _each(self, call: Callable[[Worker], Awaitable[object]],
                    workers: Sequence[Worker] | None = None) -> None:
        """Run ``call`` on every worker concurrently.

        A worker that cannot be reached (after the client's retries) is removed, and a call on a
        worker that gets removed meanwhile is cancelled: neither fails the call. Any other
        failure (an HTTP error answer) is raised after every worker was tried.
        """
        if workers is None:
            await self._fresh_listing()
            workers = self.workers
        errors: list[BackendError] = []

        async def one(worker: Worker) -> None:
            if worker.url not in self._live:
                return
            scope = trio.CancelScope()
            worker.calls.add(scope)
            try:
                with scope:
                    await call(worker)
            except BackendError as exc:
                if worker.url not in self._live:
                    return
                if isinstance(exc.__cause__, httpx.TransportError):
                    self.remove(worker.url, f"unreachable: {exc}")
                    return
                errors.append(exc)
            finally:
                worker.calls.discard(scope)

        async with trio.open_nursery() as nursery:
            for worker in workers:
                nursery.start_soon(one, worker)
        self._check_quorum()
        if errors:
            raise errors[0]

    async def abort(self, rid: str) -> None:
        """Ask every worker to abort ``rid`` (fire-and-forget; done when generate returns).

        Raises:
            EngineRejectedError: a reachable worker refused.
            EngineUnavailableError: too few workers remain.

        Cancellation:
            A checkpoint; workers already reached keep the abort.
        """
        await self._each(lambda w: w.client.abort(rid))

    async def abort_all(self) -> None:
        """Abort every request on every worker.

        Raises:
            EngineRejectedError: a reachable worker refused.
            EngineUnavailableError: too few workers remain.

        Cancellation:
            A checkpoint; workers already reached keep the abort.
        """
        await self._each(lambda w: w.client.abort_all())

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """Pause every worker (``mode`` as SGLang's); health probes stop until :meth:`continue_generation`.

        Raises:
            EngineRejectedError: a worker refused.
            EngineUnavailableError: too few workers remain.

        Cancellation:
            A checkpoint; workers already paused stay paused (call continue, shielded).
        """
        self._paused += 1
        await self._each(lambda w: w.client.pause_generation(mode))

    async def continue_generation(self) -> None:
        """Resume every worker after :meth:`pause_generation`.

        Raises:
            EngineRejectedError: a worker refused.
            EngineUnavailableError: too few workers remain.

        Cancellation:
            A checkpoint; workers already reached have resumed.
        """
        try:
            await self._each(lambda w: w.client.continue_generation())
        finally:
            self._paused = max(0, self._paused - 1)

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
        await self._each(lambda w: w.client.update_weights_from_disk(
            model_path, weight_version=weight_version, abort_all_requests=abort_all_requests,
            flush_cache=flush_cache))

    async def update_weights(self, model_path: str | WeightPaths, version: str) -> None:
        """Bring every worker to weight version ``version`` before any generates again.

        Pause every worker (``retract``: in-flight requests keep their tokens and continue on
        the new weights), load ``model_path`` on every worker, confirm each worker's
        ``/model_info`` ``weight_version``, continue every worker. A worker that fails to load
        or reports another version is continued (not left paused) and removed (it must not
        serve stale weights to this run).

        Args:
            model_path: what every worker's ``/update_weights_from_disk`` loads (a directory
                they can all read, or a shared-memory manifest for embedded engines), or a
                function giving each worker's (by its base URL; a worker that joins later
                is asked too).
            version: the new version label.

        Raises:
            EngineUnavailableError: too few workers remain.

        Cancellation:
            Shielded: the workers are never left paused.
        """
        async with self.weights_lock:
            with trio.CancelScope(shield=True):
                await self._fresh_listing()
                workers = self.workers
                self._paused += 1
                try:
                    await self._each(lambda w: w.client.pause_generation("retract"), workers)

                    async def load(worker: Worker) -> None:
                        try:
                            await worker.client.update_weights_from_disk(
                                path_for(model_path, worker.url), weight_version=version)
                            await self._verify_version(worker.client, worker.url, version)
                        except BackendError as exc:  # refused, failed, or another version
                            # Removed ones are not continued below; one that is still up must not
                            # stay paused for whoever uses it next (a connected engine outlives
                            # this run).
                            with contextlib.suppress(BackendError):
                                await worker.client.continue_generation()
                            self.remove(worker.url, f"weight update to {version} failed: {exc}")

                    await self._each(load, workers)
                    self.weights = (model_path, version)
                finally:
                    try:
                        await self._each(lambda w: w.client.continue_generation(), workers)
                    finally:
                        self._paused -= 1
        log.info("fleet: %d worker(s) at weight version %s", len(self._live), version)

    async def update_weight_version(self, new_version: str, *, abort_all_requests: bool = False
                                    ) -> None:
        """Relabel the weights on every worker (always sends ``abort_all_requests``).

        Raises:
            EngineRejectedError: a worker refused.
            EngineUnavailableError: too few workers remain.

        Cancellation:
            A checkpoint.
        """
        await self._each(lambda w: w.client.update_weight_version(
            new_version, abort_all_requests=abort_all_requests))

    async def flush_cache(self) -> None:
        """Flush the prefix cache on every worker.

        Raises:
            EngineRejectedError: a worker refused (requests still running).
            EngineUnavailableError: too few workers remain.

        Cancellation:
            A checkpoint.
        """
        await self._each(lambda w: w.client.flush_cache())

    async def close_session(self, session_id: str) -> None:
        """Release a Session's engine-side state where it was served (see the module docs).

        Raises:
            EngineRejectedError: a reachable worker refused.
            EngineUnavailableError: too few workers remain.

        Cancellation:
            A checkpoint.
        """
        url = self._session_worker.pop(session_id, None)
        routed_here = session_id in self._gateway_keys
        self._gateway_keys.discard(session_id)
        if url is not None:
            worker = self._live.get(url)
            if worker is not None:
                worker.sessions.discard(session_id)
                await self._each(lambda w: w.client.close_session(session_id), [worker])
        elif routed_here:
            await self._each(lambda w: w.client.close_session(session_id))

    def session_ended(self, session_id: str) -> None:
        """A Session ended: forget its routing; with ``session_lifecycle``, close it on the
        engine in the background (failures are logged, never raised)."""
        if not self.config.session_lifecycle:
            url = self._session_worker.pop(session_id, None)
            if url is not None and url in self._live:
                self._live[url].sessions.discard(session_id)
            self._gateway_keys.discard(session_id)
            return
        if session_id in self._session_worker or session_id in self._gateway_keys:
            self._nursery.start_soon(self._close_quietly, session_id)

    async def _close_quietly(self, session_id: str) -> None:
        try:
            await self.close_session(session_id)
        except BackendError as exc:
            log.warning("fleet: close_session %s failed: %s", session_id, exc)


async def _await_listing(fleet: EngineFleet, wait_s: float, expect_urls: Sequence[str]) -> None:
    """Poll the gateway's listing until it has every URL of ``expect_urls`` (at least one
    worker when empty); past ``wait_s`` go on with a non-empty listing (warned).

    Raises:
        EngineUnavailableError: nothing listed within ``wait_s`` (or the gateway unreachable
            that long).
    """
    expected = {u.rstrip("/") for u in expect_urls}
    with trio.move_on_after(wait_s):
        while True:
            await fleet.refresh()
            if fleet.urls and expected <= set(fleet.urls):
                return
            await trio.sleep(GATEWAY_POLL_S)
    if not fleet.urls:
        raise EngineUnavailableError(f"the gateway {fleet.gateway_url} listed no worker within "
                                     f"{wait_s:g} s")
    log.warning("fleet: after %g s the gateway lists %d of the %d launched workers (missing: %s); "
                "opening with those listed", wait_s, len(expected & set(fleet.urls)), len(expected),
                ", ".join(sorted(expected - set(fleet.urls))))


@asynccontextmanager
async def open_engine_fleet(
    config: FleetConfig,
    *,
    worker_urls: Sequence[str] = (),
    gateway_url: str | None = None,
    expect_urls: Sequence[str] = (),
    client_config: EngineClientConfig | None = None,
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

    Yields:
        The fleet; the monitor runs while inside.

    Raises:
        EngineUnavailableError: no worker (empty listing or URL list), the gateway unreachable, or (from
            the monitor, cancelling the body) the fleet could no longer serve.

    Cancellation:
        Exiting stops the monitor and closes the pools.
    """
    cfg = client_config or EngineClientConfig()
    if (gateway_url is None) == (not worker_urls):
        raise ValueError("give either worker_urls or gateway_url")
    limits = httpx.Limits(max_connections=cfg.max_generation_connections,
                          max_keepalive_connections=cfg.max_generation_connections)
    control_limits = httpx.Limits(max_connections=cfg.max_control_connections,
                                  max_keepalive_connections=cfg.max_control_connections)
    async with (
        httpx.AsyncClient(limits=limits) as generation,
        httpx.AsyncClient(limits=control_limits) as control,
        trio.open_nursery() as nursery,
    ):
        fleet = EngineFleet(config, worker_urls=worker_urls, gateway_url=gateway_url,
                            generation=generation, control=control, client_config=cfg,
                            nursery=nursery)
        if gateway_url is not None:
            await _await_listing(fleet, config.gateway_wait_s, expect_urls)
        log.info("fleet: %d worker(s)%s: %s", len(fleet.urls),
                 f" behind gateway {gateway_url}" if gateway_url else "", ", ".join(fleet.urls))
        await nursery.start(fleet.run_monitor)
        try:
            yield fleet
        finally:
            nursery.cancel_scope.cancel()
