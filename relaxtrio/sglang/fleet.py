"""The inference fleet: SGLang-API workers behind the SGLang Model Gateway, or connected directly.

:class:`EngineFleet` is what the turn code and the driver talk to; it answers the same calls as
:class:`~relaxtrio.sglang.client.EngineClient` (``generate``, ``abort``, pause / continue, weight
updates, ``close_session``, info) and adds routing, membership and fault handling.

Two ways to reach the workers:

- **Gateway** (``--sglang-router-url``): every ``/generate`` goes through the gateway with the
  header ``X-SMG-Routing-Key: <session id>``. With the gateway's ``manual`` policy that key is
  pinned to one worker until the worker leaves, so every turn of a Session reuses that worker's
  prefix cache. The gateway (sglang-router 0.3.2) has no abort, pause, continue or weight-update
  route, so control calls go to every worker of its ``GET /workers`` listing, which is re-read by
  the health monitor and before control calls once it is older than a second.
- **Direct** (``--engine-url``): the fleet routes itself. A Session's first request goes to the
  worker holding the fewest Sessions, and every later one to the same worker.

Request ids: the rollout's rids end in ``#`` and contain no other ``#``, so none is a prefix of
another (SGLang aborts by prefix, §7 P-4); they contain the Session id, which is unique, so they
are unique across workers. :meth:`EngineFleet.generate` refuses a rid that breaks either rule.

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

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final

import attrs
import httpx
import trio

from .._errors import BackendError
from ..config import FleetConfig
from ._http import EngineClientConfig, json_object, send_with_retries
from ._replies import EngineStatusError, GenerateResult
from .client import EngineClient, PauseMode
from .wire import SamplingParams

__all__ = ["ROUTING_KEY_HEADER", "EngineFleet", "FleetStatistics", "open_engine_fleet"]

log = logging.getLogger(__name__)

ROUTING_KEY_HEADER: Final = "X-SMG-Routing-Key"
"""The gateway's routing-key header (sglang-router 0.3.2; ``--policy manual`` pins keys)."""

LISTING_MAX_AGE_S: Final = 1.0
ABORT_GRACE_S: Final = 5.0
JOIN_GRACE_S: Final = 30.0
_GATEWAY_POLL_S: Final = 0.5


def _worker_failure(exc: BackendError) -> bool:
    """Whether a failed call says something about the worker rather than about the request.

    5xx answers and transport failures (refused, reset, timed out) do; a 4xx answer or a
    malformed response is about the request and goes back to the caller.
    """
    if isinstance(exc, EngineStatusError):
        return exc.status_code >= 500
    return isinstance(exc.__cause__, httpx.TransportError)


def _refused(exc: BaseException) -> bool:
    return isinstance(exc.__cause__, httpx.ConnectError) and not isinstance(
        exc.__cause__, httpx.ConnectTimeout
    )


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


@attrs.define(eq=False, kw_only=True)
class Worker:
    """One SGLang-API server of the fleet.

    Attributes:
        url: base URL, ``http://host:port``.
        client: an :class:`EngineClient` of this worker alone (shares the fleet's pools).
        generation_client: the same with a single attempt per generation (a failed generation
            moves to another worker rather than retrying a dead one).
        worker_id: the gateway's id of the worker (gateway mode), else None.
        sessions: Session ids routed to this worker (direct mode).
        failures: consecutive failed health probes.
        calls: cancel scopes of control calls running on it (cancelled when it is removed).
    """

    url: str
    client: EngineClient
    generation_client: EngineClient
    worker_id: str | None = None
    sessions: set[str] = attrs.field(factory=set)
    failures: int = 0
    calls: set[trio.CancelScope] = attrs.field(factory=set)


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


class EngineFleet:
    """The workers of one run; build it with :func:`open_engine_fleet`.

    Args:
        config: membership, health and lifecycle settings.
        worker_urls: the initial workers (direct mode; through a gateway its listing is read).
        gateway_url: the gateway, or None for direct mode.
        generation: the ``httpx.AsyncClient`` of generation traffic.
        control: the ``httpx.AsyncClient`` of control traffic.
        client_config: timeouts and retries of the per-worker clients.
        nursery: where background calls (session closes, orphan reclaims) run.
    """

    def __init__(
        self,
        config: FleetConfig,
        *,
        worker_urls: Sequence[str],
        gateway_url: str | None,
        generation: httpx.AsyncClient,
        control: httpx.AsyncClient,
        client_config: EngineClientConfig,
        nursery: trio.Nursery,
    ):
        self.config = config
        self.gateway_url = gateway_url.rstrip("/") if gateway_url else None
        self._generation = generation
        self._control = control
        self._client_config = client_config
        # Generation fails over to another worker instead of retrying a dead one.
        self._generate_config = attrs.evolve(client_config, max_attempts=1)
        self._nursery = nursery
        self._live: dict[str, Worker] = {}
        self._removed: dict[str, str] = {}
        self._flights: dict[str, _Flight] = {}
        self._session_worker: dict[str, str] = {}
        self._gateway_keys: set[str] = set()
        self._gateway_client = (
            self._client(self.gateway_url, self._generate_config) if self.gateway_url else None
        )
        self._listed_at = -math.inf
        self._joining: dict[str, float] = {}  # readmitted URL -> trio time it was added
        self._forgetting: set[str] = set()
        self._swept_at = -math.inf
        self._gateway_down_since: float | None = None
        self._paused = 0
        self._sweep_lock = trio.Lock()
        self.weights_lock = trio.Lock()
        self._fatal: BackendError | None = None
        self._restarting: set[str] = set()
        self._restartable: set[str] = set()
        self.on_remove: Callable[[str, str], None] | None = None
        self._membership = trio.Event()
        self.weights: tuple[str, str] | None = None
        for url in worker_urls:
            self._add(url.rstrip("/"))

    # ------------------------------------------------------------------ membership
    def _client(self, url: str, config: EngineClientConfig) -> EngineClient:
        return EngineClient([url], generation=self._generation, control=self._control,
                            config=config)

    def _worker(self, url: str, worker_id: str | None = None) -> Worker:
        return Worker(url=url, client=self._client(url, self._client_config),
                      generation_client=self._client(url, self._generate_config),
                      worker_id=worker_id)

    def _add(self, url: str, worker_id: str | None = None) -> Worker:
        worker = self._worker(url, worker_id)
        self._live[url] = worker
        return worker

    @property
    def urls(self) -> tuple[str, ...]:
        """Base URLs of the healthy workers."""
        return tuple(self._live)

    @property
    def workers(self) -> tuple[Worker, ...]:
        """The healthy workers."""
        return tuple(self._live.values())

    def statistics(self) -> FleetStatistics:
        """A snapshot of membership, routing and the loaded weight version."""
        return FleetStatistics(
            workers=self.urls, removed=dict(self._removed),
            sessions={w.url: len(w.sessions) for w in self._live.values()},
            in_flight=len(self._flights),
            weight_version=self.weights[1] if self.weights else None,
        )

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
        if restarting or url in self._restartable:
            self._restarting.add(url)
        worker = self._live.pop(url, None)
        if worker is None:
            return
        self._removed[url] = reason
        if self.on_remove is not None:
            self.on_remove(url, reason)
        self._joining.pop(url, None)
        log.warning("fleet: worker %s removed: %s (%d healthy left)", url, reason, len(self._live))
        for flight in list(self._flights.values()):
            if flight.worker is worker:
                flight.lose(f"worker {url} removed: {reason}")
        for scope in worker.calls:
            scope.cancel()
        for session_id in worker.sessions:
            self._session_worker.pop(session_id, None)
        if self.gateway_url is not None:
            self._nursery.start_soon(self._gateway_forget, worker)
            orphans = [f for f in self._flights.values() if f.worker is None]
            if orphans:
                self._nursery.start_soon(self._reclaim, orphans, url)
        self._update_quorum()
        self._notify()

    def set_restartable(self, url: str, restartable: bool) -> None:
        """Whether a launcher restarts ``url`` when it dies (then its removal waits for the
        restart, see :meth:`remove`)."""
        if restartable:
            self._restartable.add(url.rstrip("/"))
        else:
            self._restartable.discard(url.rstrip("/"))

    def restart_failed(self, url: str, reason: str) -> None:
        """The launcher gave up restarting ``url``: it no longer counts towards the quorum."""
        self._restartable.discard(url)
        self._restarting.discard(url)
        self._removed[url] = reason
        self._update_quorum()
        self._notify()

    def _notify(self) -> None:
        self._membership.set()
        self._membership = trio.Event()

    def _update_quorum(self) -> None:
        healthy = len(self._live) + len(self._restarting)
        if self._fatal is None and healthy < self.config.min_healthy_engines:
            reasons = "; ".join(f"{u}: {why}" for u, why in self._removed.items())
            self._fatal = BackendError(
                f"only {len(self._live)} healthy engine(s) left, fewer than "
                f"--min-healthy-engines {self.config.min_healthy_engines} ({reasons})"
            )
            log.error("fleet: %s", self._fatal)

    def _check_quorum(self) -> None:
        self._update_quorum()
        if self._fatal is not None:
            raise self._fatal

    async def readmit(self, url: str) -> None:
        """Add a (restarted) worker: it loads the current weights first, then gets traffic.

        Raises:
            BackendError: it could not load or confirm the current weight version.

        Cancellation:
            Shielded once the weights are being loaded.
        """
        url = url.rstrip("/")
        async with self.weights_lock:
            client = self._client(url, self._client_config)
            if self.weights is not None:
                path, version = self.weights
                with trio.CancelScope(shield=True):
                    await client.update_weights_from_disk(path, weight_version=version)
                    await self._verify_version(client, url, version)
            self._removed.pop(url, None)
            self._restarting.discard(url)
            self._add(url)
            self._notify()
            if self.gateway_url is not None:
                self._joining[url] = trio.current_time()
                await self._gateway_call("POST", "/workers", {"url": url})
        log.info("fleet: worker %s joined (%d healthy)", url, len(self._live))

    # ------------------------------------------------------------------ gateway listing
    async def _gateway_call(self, method: str, path: str, body: dict[str, Any] | None = None
                            ) -> httpx.Response:
        assert self.gateway_url is not None
        timeout = httpx.Timeout(self._client_config.control_timeout_s,
                                connect=self._client_config.connect_timeout_s)
        return await send_with_retries(
            self._control, method, self.gateway_url, path, body, httpx_timeout=timeout,
            config=attrs.evolve(self._client_config, max_attempts=1),
        )

    async def refresh(self) -> None:
        """Re-read the gateway's ``GET /workers`` and apply what changed (gateway mode only).

        New URLs join; URLs it no longer lists leave; a removed worker it lists again (a
        restarted gateway reads its launch flags) is deleted from it again. An unreachable
        gateway keeps the current membership; past ``gateway_wait_s`` the fleet fails.

        Raises:
            BackendError: the gateway has been unreachable for longer than ``gateway_wait_s``,
                or too few workers remain.

        Cancellation:
            A checkpoint; membership changes are applied atomically after the read.
        """
        if self.gateway_url is None:
            return
        try:
            response = await self._gateway_call("GET", "/workers")
            listing = json_object(response, self.gateway_url).get("workers")
            if response.status_code != 200 or not isinstance(listing, list):
                raise BackendError(f"gateway {self.gateway_url}/workers answered "
                                   f"HTTP {response.status_code}")
        except BackendError as exc:
            self._gateway_unreachable(exc)
            return
        if self._gateway_down_since is not None:
            log.warning("fleet: gateway %s is back", self.gateway_url)
            self._gateway_down_since = None
        self._listed_at = trio.current_time()
        listed: dict[str, str | None] = {}
        for entry in listing:
            if isinstance(entry, dict):
                url = entry.get("dp_base_url") or entry.get("url")
                if isinstance(url, str):
                    listed.setdefault(url.rstrip("/"), entry.get("id"))
        for url, worker_id in listed.items():
            if url in self._removed:
                if url not in self._forgetting:
                    self._nursery.start_soon(self._gateway_forget, self._worker(url, worker_id))
            elif url in self._live:
                self._live[url].worker_id = worker_id
                self._joining.pop(url, None)
            else:
                self._add(url, worker_id)
                log.info("fleet: gateway lists worker %s (%d healthy)", url, len(self._live))
        now = trio.current_time()
        for url in [u for u in self._live if u not in listed]:
            if now - self._joining.get(url, -math.inf) > JOIN_GRACE_S:
                self.remove(url, "the gateway no longer lists it")

    def _gateway_unreachable(self, exc: BackendError) -> None:
        now = trio.current_time()
        if self._gateway_down_since is None:
            self._gateway_down_since = now
            log.warning("fleet: gateway %s unreachable (%s); waiting up to %g s for it",
                        self.gateway_url, exc, self.config.gateway_wait_s)
        elif now - self._gateway_down_since > self.config.gateway_wait_s and self._fatal is None:
            self._fatal = BackendError(
                f"the gateway {self.gateway_url} has been unreachable for more than "
                f"{self.config.gateway_wait_s:g} s: {exc}")
        if self._fatal is not None:
            raise self._fatal

    async def _gateway_forget(self, worker: Worker) -> None:
        """Delete a removed worker from the gateway, so its keys are pinned elsewhere (a worker
        without a known id is found by the next listing, which calls this again)."""
        if worker.worker_id is None or worker.url in self._forgetting:
            return
        self._forgetting.add(worker.url)
        try:
            await self._gateway_call("DELETE", f"/workers/{worker.worker_id}")
        except BackendError as exc:
            log.warning("fleet: could not delete worker %s from the gateway: %s", worker.url, exc)
        finally:
            self._forgetting.discard(worker.url)

    async def _fresh_listing(self) -> None:
        if self.gateway_url is not None and trio.current_time() - self._listed_at > LISTING_MAX_AGE_S:
            await self.refresh()

    # ------------------------------------------------------------------ health
    async def _probe(self, worker: Worker) -> None:
        """One ``/health`` probe; removes the worker when it is gone or keeps failing."""
        timeout = httpx.Timeout(self.config.health_timeout_s,
                                connect=self._client_config.connect_timeout_s)
        try:
            response = await send_with_retries(
                self._control, "GET", worker.url, "/health", None, httpx_timeout=timeout,
                config=attrs.evolve(self._client_config, max_attempts=1))
        except BackendError as exc:
            if _refused(exc):
                self.remove(worker.url, f"connection refused ({exc.__cause__!r})")
                return
            failure = f"no /health answer within {self.config.health_timeout_s:g} s ({exc})"
        else:
            if response.status_code == 200:
                worker.failures = 0
                return
            failure = f"/health answered HTTP {response.status_code}"
        worker.failures += 1
        if worker.failures >= self.config.health_failures:
            self.remove(worker.url, f"{failure}, {worker.failures} probes in a row")

    async def sweep(self) -> None:
        """Re-read the listing (gateway mode) and probe every worker once, concurrently.

        Skipped while the fleet holds the workers paused (SGLang's ``/health`` generation waits
        behind a pause, §7 P-10).

        Raises:
            BackendError: too few workers remain, or the gateway stayed away too long.

        Cancellation:
            A checkpoint; probes already answered keep their effect.
        """
        if self._paused:
            return
        await self._sweep_since(trio.current_time())

    async def _sweep_since(self, since: float) -> None:
        """One sweep, unless another one started at or after ``since`` (trio clock time)."""
        async with self._sweep_lock:
            if self._swept_at >= since:
                self._check_quorum()
                return
            self._swept_at = trio.current_time()
            await self.refresh()
            async with trio.open_nursery() as nursery:
                for worker in self.workers:
                    nursery.start_soon(self._probe, worker)
            self._check_quorum()

    async def run_monitor(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                          ) -> None:
        """Probe the fleet every ``health_interval_s`` until cancelled.

        Raises:
            BackendError: the fleet can no longer serve (see :meth:`sweep`).

        Cancellation:
            Runs until cancelled.
        """
        task_status.started()
        while True:
            await trio.sleep(self.config.health_interval_s)
            await self.sweep()

    async def _recover(self, worker: Worker | None, exc: BackendError, failed_at: float) -> None:
        """After a failed generation: check its worker, or (through the gateway) wait for the
        gateway and probe every worker once.

        Raises:
            BackendError: the fleet can no longer serve.
        """
        if worker is not None:
            if _refused(exc):
                self.remove(worker.url, f"connection refused ({exc.__cause__!r})")
            elif worker.url in self._live:
                await self._probe(worker)
            self._check_quorum()
            return
        while True:
            await self.refresh()
            if self._gateway_down_since is None:
                break
            await trio.sleep(_GATEWAY_POLL_S)
        await self._sweep_since(failed_at)

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
            raise BackendError("no healthy engine to generate on")
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

        Returns:
            The engine's result. When the worker is lost mid-request the result is an abort
            with no output (``finish_type == "abort"``), which the caller resumes like any
            partial rollout.

        Raises:
            ValueError: ``rid`` could be a prefix of another rid, or is already in flight.
            ContextLengthExceededError: the engine refused the prompt as too long.
            EngineStatusError: a 4xx answer (a problem of this request).
            BackendError: a malformed answer, or the fleet can no longer serve.

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
        if self._gateway_client is not None:
            worker, client = None, self._gateway_client
            if key is not None:
                headers = {ROUTING_KEY_HEADER: key}
                self._gateway_keys.add(key)
        else:
            while not self._live and self._restarting and self._fatal is None:
                await self._membership.wait()  # the only workers are being restarted
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
                        session_id=session_id, image_data=image_data, headers=headers)
                except BackendError as exc:
                    if not _worker_failure(exc):
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
        log.warning("fleet: request %s resumes on another worker (%s)", rid, flight.lost)
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
            BackendError: a reachable worker refused, or too few workers remain.

        Cancellation:
            A checkpoint; workers already reached keep the abort.
        """
        await self._each(lambda w: w.client.abort(rid))

    async def abort_all(self) -> None:
        """Abort every request on every worker.

        Raises:
            BackendError: a reachable worker refused, or too few workers remain.

        Cancellation:
            A checkpoint; workers already reached keep the abort.
        """
        await self._each(lambda w: w.client.abort_all())

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """Pause every worker (§4.4); health probes stop until :meth:`continue_generation`.

        Raises:
            BackendError: a worker refused, or too few workers remain.

        Cancellation:
            A checkpoint; workers already paused stay paused (call continue, shielded).
        """
        self._paused += 1
        await self._each(lambda w: w.client.pause_generation(mode))

    async def continue_generation(self) -> None:
        """Resume every worker after :meth:`pause_generation`.

        Raises:
            BackendError: a worker refused, or too few workers remain.

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
        """Load a checkpoint directory on every worker (§4.2), without the pause bracket.

        Raises:
            EngineStatusError: a worker answered ``success: false``.
            BackendError: too few workers remain.

        Cancellation:
            A checkpoint; workers that started loading finish.
        """
        await self._each(lambda w: w.client.update_weights_from_disk(
            model_path, weight_version=weight_version, abort_all_requests=abort_all_requests,
            flush_cache=flush_cache))

    async def _verify_version(self, client: EngineClient, url: str, version: str) -> None:
        info = await client.model_info()
        reported = info.get("weight_version")
        if reported != version:
            raise EngineStatusError(
                f"engine {url} reports weight version {reported!r} after loading {version!r}",
                status_code=500, engine_url=url)

    async def update_weights(self, model_path: str, version: str) -> None:
        """Bring every worker to weight version ``version`` before any generates again.

        Pause every worker (``retract``: in-flight requests keep their tokens and continue on
        the new weights), load ``model_path`` on every worker, confirm each worker's
        ``/model_info`` ``weight_version``, continue every worker. A worker that fails to load
        or reports another version is removed (it must not serve stale weights).

        Args:
            model_path: what every worker's ``/update_weights_from_disk`` loads (a directory
                they can all read, or a shared-memory manifest for embedded engines).
            version: the new version label.

        Raises:
            BackendError: too few workers remain.

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
                                model_path, weight_version=version)
                            await self._verify_version(worker.client, worker.url, version)
                        except EngineStatusError as exc:
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
            BackendError: a worker refused, or too few workers remain.

        Cancellation:
            A checkpoint.
        """
        await self._each(lambda w: w.client.update_weight_version(
            new_version, abort_all_requests=abort_all_requests))

    async def flush_cache(self) -> None:
        """Flush the prefix cache on every worker.

        Raises:
            EngineStatusError: a worker refused (requests still running).
            BackendError: too few workers remain.

        Cancellation:
            A checkpoint.
        """
        await self._each(lambda w: w.client.flush_cache())

    async def close_session(self, session_id: str) -> None:
        """Release a Session's engine-side state where it was served (see the module docs).

        Raises:
            BackendError: a reachable worker refused, or too few workers remain.

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

    # ------------------------------------------------------------------ info
    async def health(self) -> bool:
        """True when every healthy worker answers ``GET /health`` with 200; never raises.

        Cancellation:
            A checkpoint.
        """
        results: list[bool] = []

        async def one(worker: Worker) -> None:
            results.append(await worker.client.health())

        async with trio.open_nursery() as nursery:
            for worker in self.workers:
                nursery.start_soon(one, worker)
        return bool(results) and all(results)

    def _pick_info(self, url: str | None) -> Worker:
        if url is not None:
            return self._live.get(url.rstrip("/")) or Worker(
                url=url.rstrip("/"), client=self._client(url.rstrip("/"), self._client_config))
        return self._route(None)

    async def model_info(self, url: str | None = None) -> dict[str, Any]:
        """``GET /model_info`` of one worker (default: the least loaded).

        Raises:
            BackendError: HTTP error, invalid JSON or unreachable worker.

        Cancellation:
            A checkpoint.
        """
        return await self._pick_info(url).client.model_info()

    async def server_info(self, url: str | None = None) -> dict[str, Any]:
        """``GET /server_info`` of one worker (default: the least loaded).

        Raises:
            BackendError: HTTP error, invalid JSON or unreachable worker.

        Cancellation:
            A checkpoint.
        """
        return await self._pick_info(url).client.server_info()


@asynccontextmanager
async def open_engine_fleet(
    config: FleetConfig,
    *,
    worker_urls: Sequence[str] = (),
    gateway_url: str | None = None,
    client_config: EngineClientConfig | None = None,
) -> AsyncIterator[EngineFleet]:
    """Open the fleet: pools, the worker listing, and the health monitor.

    Args:
        config: membership, health and lifecycle settings.
        worker_urls: workers without a gateway (direct mode).
        gateway_url: the gateway (gateway mode); its ``GET /workers`` is read before yielding.
        client_config: timeouts and retries of the per-worker clients.

    Yields:
        The fleet; the monitor runs while inside.

    Raises:
        BackendError: no worker (empty listing or URL list), the gateway unreachable, or (from
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
            with trio.fail_after(config.gateway_wait_s):
                while not fleet.urls:
                    await fleet.refresh()
                    if not fleet.urls:
                        await trio.sleep(_GATEWAY_POLL_S)
        log.info("fleet: %d worker(s)%s: %s", len(fleet.urls),
                 f" behind gateway {gateway_url}" if gateway_url else "", ", ".join(fleet.urls))
        await nursery.start(fleet.run_monitor)
        try:
            yield fleet
        finally:
            nursery.cancel_scope.cancel()
