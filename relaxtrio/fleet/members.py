"""The members of a fleet: its workers, who was removed and why, who is coming back.

:class:`Membership` owns the healthy workers (each a :class:`Worker` with its per-engine
clients), the reasons of removals, the workers a launcher is restarting (they count towards the
quorum until it gives up), readmitted workers the gateway does not list yet, the quorum
(``min_healthy_engines``) and the weight version every worker loaded last. It does no I/O of its
own: the fleet (:mod:`relaxtrio.fleet.fleet`), the gateway listing (:mod:`.gateway`) and the
health monitor (:mod:`.health`) change it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Final

import attrs
import httpx
import trio

from .._errors import BackendError, EngineRejectedError, EngineUnavailableError
from ..config import FleetConfig
from .engine_api import EngineAPI, EngineClientConfig, EngineConnections

__all__ = ["JOIN_GRACE_S", "Membership", "WeightPaths", "Worker", "path_for", "refused",
           "worker_failure"]

log = logging.getLogger("relaxtrio.fleet.fleet")  # one logger for every line of the fleet

JOIN_GRACE_S: Final = 30.0
"""Seconds a readmitted worker may stay unlisted by the gateway before generations try it."""

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
        return int(status) >= 500
    return isinstance(exc.__cause__, httpx.TransportError)


def refused(exc: BaseException) -> bool:
    """Whether a failed call's connection was refused (the worker is gone, not slow)."""
    return isinstance(exc.__cause__, httpx.ConnectError) and not isinstance(
        exc.__cause__, httpx.ConnectTimeout
    )


@attrs.define(eq=False, kw_only=True)
class Worker:
    """One engine of the fleet.

    Attributes:
        url: base URL, ``http://host:port``.
        client: a client of this worker (the client config's retries).
        generation_client: the same with a single attempt per generation (a failed generation
            moves to another worker rather than retrying a dead one).
        probe: the same with a single attempt bounded by ``health_timeout_s`` (health probes).
        worker_id: the gateway's id of the worker (gateway mode), else None.
        sessions: Session ids routed to this worker (direct mode).
        failures: consecutive failed health probes.
        calls: cancel scopes of control calls running on it (cancelled when it is removed).
    """

    url: str
    client: EngineAPI
    generation_client: EngineAPI
    probe: EngineAPI
    worker_id: str | None = None
    sessions: set[str] = attrs.field(factory=set)
    failures: int = 0
    calls: set[trio.CancelScope] = attrs.field(factory=set)


class Membership:
    """Who serves in a fleet.

    Attributes:
        config: membership, health and lifecycle settings.
        live: base URL → healthy worker, in join order.
        removed: base URL → why it was removed.
        restarting: URLs whose launcher restarts them (they count towards the quorum).
        joining: readmitted URLs the gateway may not list yet → trio time they were added.
        fatal: the error every call raises once the fleet cannot serve, or None.
        paused: pause brackets in progress (no health verdicts meanwhile).
        weights: ``(model_path, version)`` every worker loaded last, or None (a worker that
            joins loads it first); ``model_path`` may be a :data:`WeightPaths` function.
        weights_lock: held while weights are loaded; hold it while writing a version.

    Args:
        config: the fleet settings.
        connections: the pools the per-engine clients use (and their protocol).
        client_config: timeouts and retries of the per-engine clients.
        gateway_mode: whether a gateway routes generations (then a readmitted worker serves only
            once listed, see :meth:`servable`).
    """

    def __init__(self, config: FleetConfig, *, connections: EngineConnections,
                 client_config: EngineClientConfig, gateway_mode: bool):
        self.config = config
        self.gateway_mode = gateway_mode
        self._connections = connections
        self._client_config = client_config
        # Generation fails over to another worker instead of retrying a dead one.
        self._generate_config = attrs.evolve(client_config, max_attempts=1)
        self._probe_config = attrs.evolve(client_config, max_attempts=1,
                                          control_timeout_s=config.health_timeout_s)
        self.live: dict[str, Worker] = {}
        self.removed: dict[str, str] = {}
        self.restarting: set[str] = set()
        self._restartable: set[str] = set()
        self.joining: dict[str, float] = {}
        self.fatal: BackendError | None = None
        self.paused = 0
        self._changed = trio.Event()
        self.weights_lock = trio.Lock()
        self.weights: tuple[str | WeightPaths, str] | None = None

    def client(self, url: str, *, single_attempt: bool = False) -> EngineAPI:
        """A client of ``url`` on the fleet's pools (``single_attempt``: as generations use)."""
        return self._connections.client(
            url, self._generate_config if single_attempt else self._client_config)

    def add(self, url: str, worker_id: str | None = None) -> Worker:
        """Make ``url`` a healthy worker (replacing any earlier record of it)."""
        worker = Worker(url=url, client=self.client(url),
                        generation_client=self.client(url, single_attempt=True),
                        probe=self._connections.client(url, self._probe_config),
                        worker_id=worker_id)
        self.live[url] = worker
        return worker

    @property
    def urls(self) -> tuple[str, ...]:
        """Base URLs of the healthy workers."""
        return tuple(self.live)

    @property
    def workers(self) -> tuple[Worker, ...]:
        """The healthy workers."""
        return tuple(self.live.values())

    @property
    def version(self) -> str | None:
        """The weight version every worker loaded last, or None."""
        return self.weights[1] if self.weights is not None else None

    def take_out(self, url: str, reason: str, *, restarting: bool = False) -> Worker | None:
        """Remove ``url`` from the healthy workers, with a logged reason; returns the worker, or
        None when it was not one. Updates the quorum (see :meth:`update_quorum`)."""
        if restarting or url in self._restartable:
            self.restarting.add(url)
        worker = self.live.pop(url, None)
        if worker is None:
            return None
        self.removed[url] = reason
        self.joining.pop(url, None)
        log.warning("fleet: worker %s removed: %s (%d healthy left)", url, reason, len(self.live))
        for scope in worker.calls:
            scope.cancel()
        self.update_quorum()
        self.notify()
        return worker

    def readmitted(self, url: str) -> Worker:
        """``url`` is back (restarted, weights loaded): a healthy worker again."""
        self.removed.pop(url, None)
        self.restarting.discard(url)
        worker = self.add(url)
        if self.gateway_mode:
            self.joining[url] = trio.current_time()
        self.notify()
        return worker

    def set_restartable(self, url: str, restartable: bool) -> None:
        """Whether a launcher restarts ``url`` when it dies (its removal then waits for the
        restart: it counts towards the quorum until :meth:`restart_failed`)."""
        if restartable:
            self._restartable.add(url.rstrip("/"))
        else:
            self._restartable.discard(url.rstrip("/"))

    def restart_failed(self, url: str, reason: str) -> None:
        """The launcher gave up restarting ``url``: it no longer counts towards the quorum."""
        self._restartable.discard(url)
        self.restarting.discard(url)
        self.removed[url] = reason
        self.update_quorum()
        self.notify()

    def notify(self) -> None:
        """Wake :meth:`wait_servable`: membership changed."""
        self._changed.set()
        self._changed = trio.Event()

    def update_quorum(self) -> None:
        """Set :attr:`fatal` when fewer than ``min_healthy_engines`` workers remain (healthy or
        being restarted)."""
        healthy = len(self.live) + len(self.restarting)
        if self.fatal is None and healthy < self.config.min_healthy_engines:
            reasons = "; ".join(f"{u}: {why}" for u, why in self.removed.items())
            self.fatal = EngineUnavailableError(
                f"only {len(self.live)} healthy engine(s) left, fewer than "
                f"--min-healthy-engines {self.config.min_healthy_engines} ({reasons})"
            )
            log.error("fleet: %s", self.fatal)

    def check_quorum(self) -> None:
        """Raises :attr:`fatal` (after :meth:`update_quorum`) when the fleet cannot serve.

        Raises:
            EngineUnavailableError: too few workers remain, or the gateway stayed away.
        """
        self.update_quorum()
        if self.fatal is not None:
            raise self.fatal

    def servable(self) -> bool:
        """Whether a generation can be sent now: a worker is live and, through the gateway, one
        the gateway lists as healthy (a readmitted one may still be registering there; after
        :data:`JOIN_GRACE_S` it is tried anyway)."""
        if not self.gateway_mode:
            return bool(self.live)
        now = trio.current_time()
        return any(now - self.joining.get(url, -math.inf) > JOIN_GRACE_S for url in self.live)

    async def wait_servable(self) -> None:
        """Waits while no worker can take a generation but one is coming: being restarted by
        its launcher, or readmitted and not yet listed healthy by the gateway. Returns at once
        when a worker can serve, when none is coming, or when the fleet has failed (the caller
        raises then).

        Cancellation:
            A plain wait; nothing to clean up.
        """
        while self.fatal is None and not self.servable() and (self.restarting or self.joining):
            # A joining worker counts as servable after its grace: wake up then at the latest.
            wake = min((t + JOIN_GRACE_S for t in self.joining.values()), default=math.inf)
            with trio.move_on_at(wake):
                await self._changed.wait()

    async def verify_version(self, client: EngineAPI, version: str) -> None:
        """Check that the engine of ``client`` reports weight version ``version``.

        Raises:
            EngineUnavailableError: it reports another one.
            BackendError: it could not be asked.
        """
        reported = await client.weight_version()
        if reported != version:
            raise EngineUnavailableError(
                f"engine {client.url} reports weight version {reported!r} after loading "
                f"{version!r}", engine_url=client.url)

    def pick(self, url: str | None) -> EngineAPI:
        """The client of worker ``url`` (one outside the fleet gets a fresh client), or of the
        first healthy worker when None.

        Raises:
            EngineUnavailableError: no healthy worker (``url`` None).
        """
        if url is not None:
            worker = self.live.get(url.rstrip("/"))
            return worker.client if worker is not None else self.client(url.rstrip("/"))
        if not self.live:
            self.check_quorum()
            raise EngineUnavailableError("no healthy engine to ask")
        return next(iter(self.live.values())).client
