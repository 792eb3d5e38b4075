"""A launched process (an engine or the gateway) across its restarts: start, readiness,
supervision, stop.

:func:`boot` starts a process through its :class:`~relaxtrio.fleet.starter.EngineStarter` and
waits until it answers ``/health`` (SGLang's servers and the gateway announce readiness only by
answering). :func:`supervise` watches one process and restarts it when it dies, within its
restart budget (``max_restarts`` within ``restart_window_s``), telling the fleet: the dead engine
is removed (counted as restarting while a restart is coming), the restarted one readmitted with
the current weights. :class:`Supervisors` stops every supervisor before the processes are
stopped (:func:`stop_all`), so that none starts a replacement that would leak.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Literal

import attrs
import httpx
import trio

from .._errors import BackendError
from ..config import FleetConfig
from .fleet import EngineFleet
from .starter import EngineProcess, EngineStarter, ProcessSpec, flag_value, with_flag

__all__ = ["LaunchedProcess", "Supervisors", "boot", "poll_while_alive", "stop_all", "supervise"]

log = logging.getLogger("relaxtrio.fleet.launch_fleet")

_POLL_S: Final = 0.2


@attrs.define(eq=False, kw_only=True)
class LaunchedProcess:
    """One launched process (an engine or the gateway) across its restarts."""

    spec: ProcessSpec
    starter: EngineStarter
    url: str | None = None
    handle: EngineProcess | None = None
    max_restarts: int = 0
    restart_window_s: float = 3600.0
    restart_times: list[float] = attrs.field(factory=list)  # trio.current_time() of each restart
    stopping: bool = False

    @property
    def supervised(self) -> bool:
        """Whether a death is ever restarted (the fleet then waits for it, see
        :meth:`~relaxtrio.fleet.members.Membership.set_restartable`)."""
        return self.max_restarts > 0

    def budget_used(self) -> str:
        """``"restart 2 of 3 within 60 min"``: the restart just taken, for log lines."""
        return (f"restart {len(self.restart_times)} of {self.max_restarts} within "
                f"{self.restart_window_s / 60:g} min")

    def budget_spent(self) -> str:
        """Why a death is not restarted, for log lines and the fleet's final error."""
        flag = "" if self.name == "gateway" else f", --engine-restarts {self.max_restarts}"
        if self.max_restarts == 0:
            return f"restarts are off{flag}"
        return (f"its restart budget is spent ({len(self.restart_times)} restart(s) within the last "
                f"{self.restart_window_s / 60:g} min{flag}): it keeps dying")

    def take_restart(self) -> bool:
        """Uses up one restart if fewer than ``max_restarts`` happened in the last
        ``restart_window_s`` seconds; False (nothing used) when the budget is spent."""
        now = trio.current_time()
        self.restart_times = [t for t in self.restart_times if now - t < self.restart_window_s]
        if len(self.restart_times) >= self.max_restarts:
            return False
        self.restart_times.append(now)
        return True

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def where(self) -> str:
        """The log's place, for messages (``<path>`` here, ``<path> on <node>`` elsewhere)."""
        node = self.handle.node if self.handle is not None else "local"
        return str(self.spec.log_path) + ("" if node == "local" else f" on {node}")

    async def stop(self) -> None:
        """SIGTERM to the group, SIGKILL after the grace period; waits (see the starter)."""
        self.stopping = True
        if self.handle is not None:
            await self.handle.stop()


async def poll_while_alive(proc: LaunchedProcess, timeout_s: float,
                            ready: Callable[[], Awaitable[bool]]) -> Literal["ready", "exited", "timeout"]:
    """Call ``ready`` every ``_POLL_S`` until it returns True, ``proc`` exits (watched
    meanwhile; the poll is cancelled) or ``timeout_s`` passes; says which came first."""
    handle = proc.handle
    assert handle is not None
    outcome: Literal["ready", "exited", "timeout"] = "timeout"
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal outcome
            await handle.wait()
            outcome = "exited"
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        with trio.move_on_after(timeout_s):
            # Another process's readiness shows only in its answers: no event to wait on.
            while not await ready():  # noqa: ASYNC110
                await trio.sleep(_POLL_S)
            outcome = "ready"
        nursery.cancel_scope.cancel()
    return outcome


async def wait_http_ok(proc: LaunchedProcess, url: str, path: str, timeout_s: float,
                        client: httpx.AsyncClient) -> None:
    """Poll ``url + path`` until it answers 200: SGLang's servers and the gateway announce
    readiness only by answering (``/health`` is 503 or refused before). The process's exit,
    watched meanwhile, ends the wait with an error."""

    async def answered() -> bool:
        try:
            return (await client.get(url + path, timeout=5.0)).status_code == 200
        except httpx.TransportError:
            return False

    outcome = await poll_while_alive(proc, timeout_s, answered)
    if outcome == "ready":
        return
    assert proc.handle is not None
    if outcome == "exited":
        raise BackendError(f"{proc.name} exited with {proc.handle.describe_exit()} during startup "
                           f"(log {proc.where}):\n{await proc.handle.log_tail()}")
    raise BackendError(f"{proc.name} did not answer {path} within {timeout_s:g} s "
                       f"(log {proc.where}):\n{await proc.handle.log_tail()}")


async def boot(proc: LaunchedProcess, timeout_s: float, client: httpx.AsyncClient,
                nursery: trio.Nursery) -> None:
    """Start ``proc`` through its starter and wait until its ``/health`` answers 200; sets
    ``proc.url`` and keeps the port it got for a restart."""
    proc.handle = await proc.starter.start(proc.spec, timeout_s=timeout_s, nursery=nursery,
                                           previous=proc.handle)
    proc.url = proc.handle.url
    port = proc.url.rsplit(":", 1)[1]
    proc.spec = attrs.evolve(proc.spec, cmd=with_flag(proc.handle.cmd, "--port", port))
    await wait_http_ok(proc, proc.url, "/health", timeout_s, client)
    log.info("%s ready at %s (log %s)", proc.name, proc.url, proc.where)


async def supervise(proc: LaunchedProcess, *, fleet: Callable[[], EngineFleet | None],
                    replaced: Callable[[str, str], None], config: FleetConfig,
                    client: httpx.AsyncClient, nursery: trio.Nursery) -> None:
    """Watch one process; restart it when it dies (see the module docstring).

    A restart that fails (the new process dies during start-up or never answers ``/health``)
    is one more death: it is tried again while the restart budget allows. A restart normally
    gets the same URL (same node, same port); when it cannot (a Ray actor re-placed on another
    node, or its port taken there), the new URL joins the fleet and the old one is marked as
    given up only after it did, so the quorum never counts a gap.

    Args:
        proc: the process, booted.
        fleet: the fleet to tell about deaths and restarts, when there is one (read at each
            death: a fleet is attached after the processes started).
        replaced: called with ``(old_url, new_url)`` when a restart came back elsewhere.
        config: restart budget and startup timeout.
        client: the HTTP client of readiness probes.
        nursery: where a restarted process's own tasks run.

    Cancellation:
        Runs until the process is stopped or not restarted; cancel it (:class:`Supervisors`)
        before stopping the processes.
    """
    while True:
        assert proc.handle is not None
        await proc.handle.wait()
        if proc.stopping:
            return
        status = proc.handle.describe_exit()
        engines = fleet()
        restart = proc.take_restart()
        reason = f"{proc.name} process exited with {status}"
        old_url = proc.url
        if engines is not None and old_url is not None:
            engines.remove(old_url, reason, restarting=restart)
            if not restart:
                engines.members.restart_failed(old_url, f"{reason}; {proc.budget_spent()}")
        if not restart:
            log.error("%s exited with %s; not restarting it: %s (log %s):\n%s", proc.name, status,
                      proc.budget_spent(), proc.where, await proc.handle.log_tail())
            return
        what = f"{proc.name} exited with {status}"
        while True:  # restart attempts
            log.warning("%s; restarting it on port %s (%s; log %s)", what,
                        flag_value(proc.spec.cmd, "--port"), proc.budget_used(), proc.where)
            try:
                await boot(proc, config.startup_timeout_s, client, nursery)
                if engines is not None and proc.url is not None:
                    engines.members.set_restartable(proc.url, proc.supervised)
                    await engines.readmit(proc.url)
                    if old_url is not None and proc.url != old_url:
                        log.warning("%s came back at %s instead of %s", proc.name, proc.url, old_url)
                        engines.members.restart_failed(old_url, f"{reason}; replaced by {proc.url}")
                        replaced(old_url, proc.url)
                break
            except BackendError as exc:
                if proc.handle is not None:  # one that never answered /health must not linger
                    with trio.CancelScope(shield=True):
                        await proc.handle.stop()
                if proc.stopping:
                    return
                what = f"{proc.name} could not be restarted ({exc})"
                if not proc.take_restart():
                    log.error("%s could not be restarted: %s; %s", proc.name, exc, proc.budget_spent())
                    if engines is not None and old_url is not None:
                        engines.members.restart_failed(old_url, f"{reason}; the restart failed: {exc}; "
                                                      f"{proc.budget_spent()}")
                    return


@attrs.define(eq=False)
class Supervisors:
    """The ``supervise`` tasks of a launched fleet, cancellable and awaitable as one."""

    scopes: list[trio.CancelScope] = attrs.field(factory=list)
    stopping: bool = False
    running: int = 0
    idle: trio.Event = attrs.field(factory=trio.Event)

    async def run(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        scope = trio.CancelScope()
        self.scopes.append(scope)
        if self.stopping:
            scope.cancel()
        self.running += 1
        try:
            with scope:
                await fn(*args)
        finally:
            self.running -= 1
            if self.running == 0:
                self.idle.set()

    async def stop(self) -> None:
        """Cancels every supervisor and waits (shielded) until each has returned."""
        self.stopping = True
        for scope in self.scopes:
            scope.cancel()
        with trio.CancelScope(shield=True):
            while self.running:
                self.idle = trio.Event()
                await self.idle.wait()


async def stop_all(procs: Sequence[LaunchedProcess]) -> None:
    with trio.CancelScope(shield=True):
        for proc in procs:
            proc.stopping = True
        async with trio.open_nursery() as stops:
            for proc in procs:
                stops.start_soon(proc.stop)
