"""Membership and health of the fleet's workers (the base of :class:`~relaxtrio.fleet.fleet.EngineFleet`).

Owns the set of healthy workers and why the others were removed, the gateway's ``GET /workers``
listing (followed: new URLs join, URLs it drops leave, removed workers are deleted from it), the
health monitor (``/health`` probes; a refused connection removes a worker at once,
``health_failures`` failed probes in a row remove one that stopped answering), the wait for an
unreachable gateway (``gateway_wait_s``), workers a launcher restarts, and the quorum
(``min_healthy_engines``). Generation, control fan-out and weights are in
:mod:`relaxtrio.fleet.fleet`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, Final

import attrs
import httpx
import trio

from .._errors import BackendError, EngineRejectedError, EngineUnavailableError
from ..config import FleetConfig
from ..sglang._http import EngineClientConfig, json_object, send_with_retries
from ..sglang.client import EngineClient

__all__ = ["FleetMembers", "WeightPaths", "Worker", "path_for", "worker_failure"]

log = logging.getLogger("relaxtrio.fleet.fleet")

LISTING_MAX_AGE_S: Final = 1.0
JOIN_GRACE_S: Final = 30.0
UNLISTED_GRACE_S: Final = 10.0
GATEWAY_POLL_S: Final = 0.5


WeightPaths = Callable[[str], str]
"""A worker's base URL → the ``model_path`` it loads (weights reach workers different ways:
shared memory on the driver's machine, a shared directory elsewhere)."""


def path_for(model_path: str | WeightPaths, url: str) -> str:
    """The ``model_path`` worker ``url`` loads."""
    return model_path if isinstance(model_path, str) else model_path(url)


def worker_failure(exc: BackendError) -> bool:
    """Whether a failed call says something about the worker rather than about the request.

    5xx answers and transport failures (refused, reset, timed out) do; a 4xx answer
    (:class:`~relaxtrio.EngineRejectedError`) or a malformed response goes back to the caller.
    """
    if isinstance(exc, EngineRejectedError):
        return False
    status = getattr(exc, "status_code", None)
    if status is not None:
        return status >= 500
    return isinstance(exc.__cause__, httpx.TransportError)


def _refused(exc: BaseException) -> bool:
    return isinstance(exc.__cause__, httpx.ConnectError) and not isinstance(
        exc.__cause__, httpx.ConnectTimeout
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


class FleetMembers:
    """The workers of a fleet and their health; :class:`~relaxtrio.fleet.fleet.EngineFleet`
    adds generation and control on top.

    Attributes:
        weights: ``(model_path, version)`` every worker loaded last, or None (a worker that
            joins loads it first); ``model_path`` may be a :data:`WeightPaths` function.
        weights_lock: held while weights are loaded; hold it while writing a version.

    Args:
        config: membership, health and lifecycle settings.
        worker_urls: the initial workers (direct mode; through a gateway its listing is read).
        gateway_url: the gateway, or None for direct mode.
        generation: the ``httpx.AsyncClient`` of generation traffic.
        control: the ``httpx.AsyncClient`` of control traffic.
        client_config: timeouts and retries of the per-worker clients.
        nursery: where background calls (gateway deletes, session closes) run.
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
        self._listed_at = -math.inf
        self._joining: dict[str, float] = {}  # readmitted URL -> trio time it was added
        self._unlisted: dict[str, float] = {}  # live URL -> since when the listing lacks it
        self._forgetting: set[str] = set()
        self._swept_at = -math.inf
        self._gateway_down_since: float | None = None
        self._paused = 0
        self._sweep_lock = trio.Lock()
        self._fatal: BackendError | None = None
        self._restarting: set[str] = set()
        self._restartable: set[str] = set()
        self._membership = trio.Event()
        self.on_remove: Callable[[str, str], None] | None = None
        self.weights_lock = trio.Lock()
        self.weights: tuple[str | WeightPaths, str] | None = None
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
        self._unlisted.pop(url, None)
        log.warning("fleet: worker %s removed: %s (%d healthy left)", url, reason, len(self._live))
        for scope in worker.calls:
            scope.cancel()
        self._worker_removed(worker, reason)
        if self.gateway_url is not None:
            self._nursery.start_soon(self._gateway_forget, worker)
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
            self._fatal = EngineUnavailableError(
                f"only {len(self._live)} healthy engine(s) left, fewer than "
                f"--min-healthy-engines {self.config.min_healthy_engines} ({reasons})"
            )
            log.error("fleet: %s", self._fatal)

    def _check_quorum(self) -> None:
        self._update_quorum()
        if self._fatal is not None:
            raise self._fatal

    def _worker_removed(self, worker: Worker, reason: str) -> None:
        """Called by :meth:`remove` after ``worker`` left (the subclass ends its generations)."""

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

        New URLs join; URLs it has not listed for :data:`UNLISTED_GRACE_S` leave (a restarted
        gateway lists its workers only after registering them); a removed worker it lists again
        (a restarted gateway reads its launch flags) is deleted from it again. An unreachable
        gateway keeps the current membership; past ``gateway_wait_s`` the fleet fails.

        Raises:
            EngineUnavailableError: the gateway has been unreachable for longer than ``gateway_wait_s``,
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
        unhealthy: set[str] = set()
        for entry in listing:
            if isinstance(entry, dict):
                url = entry.get("dp_base_url") or entry.get("url")
                if isinstance(url, str):
                    listed.setdefault(url.rstrip("/"), entry.get("id"))
                    if entry.get("is_healthy") is False:
                        unhealthy.add(url.rstrip("/"))
        for url, worker_id in listed.items():
            if url in self._removed:
                if url not in self._forgetting:
                    self._nursery.start_soon(self._gateway_forget, self._worker(url, worker_id))
            elif url in self._live:
                self._live[url].worker_id = worker_id
                if url not in unhealthy and self._joining.pop(url, None) is not None:
                    self._notify()  # a readmitted worker now takes generations through the gateway
                self._unlisted.pop(url, None)
            else:
                self._add(url, worker_id)
                log.info("fleet: gateway lists worker %s (%d healthy)", url, len(self._live))
        now = trio.current_time()
        for url in [u for u in self._live if u not in listed]:
            # A (re)started gateway registers its workers in the background, and one we
            # readmitted may not be listed yet: only a worker missing for a while has left.
            since = self._unlisted.setdefault(url, now)
            if now - since > UNLISTED_GRACE_S and now - self._joining.get(url, -math.inf) > JOIN_GRACE_S:
                self.remove(url, "the gateway no longer lists it")

    def _gateway_unreachable(self, exc: BackendError) -> None:
        now = trio.current_time()
        if self._gateway_down_since is None:
            self._gateway_down_since = now
            log.warning("fleet: gateway %s unreachable (%s); waiting up to %g s for it",
                        self.gateway_url, exc, self.config.gateway_wait_s)
        elif now - self._gateway_down_since > self.config.gateway_wait_s and self._fatal is None:
            self._fatal = EngineUnavailableError(
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
        """One ``/health`` probe; removes the worker when it is gone or keeps failing.

        No verdict while the fleet holds the workers paused: SGLang's probe generation waits
        behind the pause (docs/client-quirks.md#health-checks-while-paused).
        """
        if self._paused:
            return
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
        behind a pause, docs/client-quirks.md#health-checks-while-paused).

        Raises:
            EngineUnavailableError: too few workers remain, or the gateway stayed away too long.

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
            EngineUnavailableError: the fleet can no longer serve (see :meth:`sweep`).

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
            EngineUnavailableError: the fleet can no longer serve.
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
            await trio.sleep(GATEWAY_POLL_S)
        await self._sweep_since(failed_at)

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
                    await client.update_weights_from_disk(path_for(path, url),
                                                          weight_version=version)
                    await self._verify_version(client, url, version)
            self._removed.pop(url, None)
            self._restarting.discard(url)
            self._add(url)
            self._notify()
            if self.gateway_url is not None:
                self._joining[url] = trio.current_time()
                await self._gateway_call("POST", "/workers", {"url": url})
                self._nursery.start_soon(self._await_listed, url)
        log.info("fleet: worker %s joined with weights %s (%d healthy)", url,
                 self.weights[1] if self.weights is not None else "as launched", len(self._live))

    async def _await_listed(self, url: str) -> None:
        """Re-reads the gateway's listing every :data:`GATEWAY_POLL_S` until it lists the
        readmitted ``url`` as healthy (``url`` leaves the joining set), for at most
        :data:`JOIN_GRACE_S`; generations waiting for a worker (:meth:`wait_servable`) go on then.

        Cancellation:
            A plain poll; nothing to clean up.
        """
        with trio.move_on_after(JOIN_GRACE_S):
            while url in self._joining:
                await trio.sleep(GATEWAY_POLL_S)
                await self.refresh()

    def _servable(self) -> bool:
        """Whether a generation can be sent now: a worker is live and, through the gateway, one
        the gateway lists as healthy (a readmitted one may still be registering there; after
        :data:`JOIN_GRACE_S` it is tried anyway)."""
        if self.gateway_url is None:
            return bool(self._live)
        now = trio.current_time()
        return any(now - self._joining.get(url, -math.inf) > JOIN_GRACE_S for url in self._live)

    async def wait_servable(self) -> None:
        """Waits while no worker can take a generation but one is coming: being restarted by
        its launcher, or readmitted and not yet listed healthy by the gateway. Returns at once
        when a worker can serve, when none is coming, or when the fleet has failed (the caller
        raises then).

        Cancellation:
            A plain wait; nothing to clean up.
        """
        while self._fatal is None and not self._servable() and (self._restarting or self._joining):
            # A joining worker counts as servable after its grace: wake up then at the latest.
            wake = min((t + JOIN_GRACE_S for t in self._joining.values()), default=math.inf)
            with trio.move_on_at(wake):
                await self._membership.wait()

    async def _verify_version(self, client: EngineClient, url: str, version: str) -> None:
        info = await client.model_info()
        reported = info.get("weight_version")
        if reported != version:
            raise EngineUnavailableError(
                f"engine {url} reports weight version {reported!r} after loading {version!r}",
                engine_url=url)

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
            return self._live.get(url.rstrip("/")) or self._worker(url.rstrip("/"))
        if not self._live:
            self._check_quorum()
            raise EngineUnavailableError("no healthy engine to ask")
        return next(iter(self._live.values()))

    async def model_info(self, url: str | None = None) -> dict[str, Any]:
        """``GET /model_info`` of one worker (default: the first healthy one).

        Raises:
            BackendError: HTTP error, invalid JSON or unreachable worker.

        Cancellation:
            A checkpoint.
        """
        return await self._pick_info(url).client.model_info()

    async def server_info(self, url: str | None = None) -> dict[str, Any]:
        """``GET /server_info`` of one worker (default: the first healthy one).

        Raises:
            BackendError: HTTP error, invalid JSON or unreachable worker.

        Cancellation:
            A checkpoint.
        """
        return await self._pick_info(url).client.server_info()
