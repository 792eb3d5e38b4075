"""Launching the fleet: N engines, plus one SGLang Model Gateway in front when N > 1.

``--rollout-num-engines N`` starts N engines: ``python -m sglang.launch_server`` when SGLang is
installed and a GPU is present (engine ``i`` sees GPUs ``i*g .. i*g+g-1`` of the ``num_gpus`` it
may use, ``g = num_gpus_per_engine`` is its tensor-parallel size; with fewer GPUs than engines
need, the engines share them round robin; the ``--sglang-*`` flags are passed on without the
``sglang-`` part), the embedded CPU engine (``python -m
relaxtrio.engine``) otherwise. With N > 1 the gateway (``python -m
sglang_router.launch_router``, package ``sglang-router``) runs in front with the ``manual``
policy (``min_group`` assignment: a new Session key goes to the worker with the fewest keys).
Each process is started only after the previous ones answered ``/health``.

Ownership: every process runs under :mod:`relaxtrio._reaper` as the leader of its own
process group, so stopping it (SIGTERM to the group, SIGKILL after :data:`STOP_GRACE_S`) stops
everything it spawned, and a driver that dies without cleaning up (SIGKILL) still takes them
down (the shim watches the driver's pid). The processes live in the launcher's nursery: leaving the context (normally, by an error,
by Ctrl-C) stops them all. Logs go to ``<log_dir>/engine-<i>.log`` and ``<log_dir>/gateway.log``.

Supervision: a launched embedded engine that exits is removed from the fleet with its exit
status (and the tail of its log), restarted on the same port, given the current weights, and
readmitted, up to ``engine_restarts`` times within any ``engine_restart_window_s`` (a crash-looping
engine is then left out of the fleet for good, and the run goes on while ``min_healthy_engines``
remain; an engine that dies once a day in a run of many days is restarted every time); an SGLang
engine is not restarted (a GPU server that died usually needs a person). The gateway is restarted on its port whenever it exits (up to
:data:`MAX_GATEWAY_RESTARTS` times within any hour); the fleet waits for it (up to
``gateway_wait_s``).

Where engines run: an :class:`~relaxtrio.fleet.starter.EngineStarter` starts each engine's
command line; the default :class:`~relaxtrio.fleet.starter.LocalStarter` runs it here as
described above, :class:`relaxtrio.cluster.engines.RayEngineStarter` inside a Ray actor on a
node with its GPUs and CPUs free (``--ray-address``). The gateway always runs here, next to the
driver. Membership, supervision and weight pushes only see URLs, so they work the same way for
both; a restart goes through the same starter (on Ray: the same actor, or a new one when the
actor was lost).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, Literal

import attrs
import httpx
import trio

from .._errors import BackendError
from ..config import FleetConfig
from .fleet import EngineFleet
from .starter import (
    STOP_GRACE_S,
    EngineProcess,
    EngineStarter,
    LocalStarter,
    ProcessSpec,
    flag_value,
    with_flag,
)

__all__ = ["STOP_GRACE_S", "EngineKind", "LaunchedFleet", "detect_engine_kind", "open_gateway",
           "open_launched_fleet"]

log = logging.getLogger(__name__)

EngineKind = Literal["sglang", "embedded"]
KILL_GRACE_S: Final = 2.0
MAX_GATEWAY_RESTARTS: Final = 5  # within any hour
_POLL_S: Final = 0.2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _visible_gpus() -> list[str]:
    """GPU ids this process may use (``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi -L``)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], check=False, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def detect_engine_kind() -> EngineKind:
    """``sglang`` when the ``sglang`` package and a GPU are present, else ``embedded``."""
    if importlib.util.find_spec("sglang") is not None and _visible_gpus():
        return "sglang"
    return "embedded"


@attrs.define(eq=False, kw_only=True)
class _Proc:
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
        :meth:`~relaxtrio.fleet.fleet.EngineFleet.set_restartable`)."""
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


@attrs.define(eq=False, kw_only=True)
class LaunchedFleet:
    """What :func:`open_launched_fleet` started.

    Attributes:
        kind: the engines' kind.
        worker_urls: the engines' base URLs.
        gateway_url: the gateway's base URL, or None (one engine, or no gateway package).
        log_dir: where the logs are.
        fleet: the :class:`~relaxtrio.fleet.fleet.EngineFleet` told about deaths and restarts
            (set with :meth:`attach`).
    """

    kind: EngineKind
    worker_urls: tuple[str, ...]
    gateway_url: str | None
    log_dir: Path
    fleet: EngineFleet | None = None
    _procs: list[_Proc] = attrs.field(factory=list)
    _nursery: trio.Nursery | None = None

    def attach(self, fleet: EngineFleet) -> None:
        """Route later deaths and restarts to ``fleet`` (``remove`` / ``readmit``), and let the
        fleet's removals reach the processes: a removed engine that still runs (it stopped
        answering) is killed, so that it is restarted like one that died."""
        self.fleet = fleet
        for proc in self._procs:
            if proc.url is not None and proc.name != "gateway":
                fleet.set_restartable(proc.url, proc.supervised)
        fleet.on_remove = self._on_remove

    def _on_remove(self, url: str, reason: str) -> None:
        for proc in self._procs:
            if proc.url == url and self._nursery is not None:
                self._nursery.start_soon(self._kill_if_running, proc, proc.handle, reason)

    async def _kill_if_running(self, proc: _Proc, handle: EngineProcess | None, reason: str) -> None:
        """Kill a removed engine that is still running :data:`KILL_GRACE_S` later (one that died
        is being handled by its supervisor already)."""
        if handle is None:
            return
        with trio.move_on_after(KILL_GRACE_S):
            await handle.wait()
            return
        if proc.handle is handle and not proc.stopping:
            log.warning("%s was removed from the fleet (%s) but still runs; killing it so that "
                        "it is restarted", proc.name, reason)
            await handle.kill()

    def pids(self) -> list[int]:
        """Process-group ids of the running local processes (for tests)."""
        return [p.handle.pid for p in self._procs
                if p.handle and p.handle.pid is not None and p.handle.returncode is None]

    def handles(self) -> dict[str, EngineProcess]:
        """The current process of each engine, by name (``engine 0``...; for tests)."""
        return {p.name: p.handle for p in self._procs if p.handle is not None}


async def _poll_while_alive(proc: _Proc, timeout_s: float,
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
            while not await ready():
                await trio.sleep(_POLL_S)
            outcome = "ready"
        nursery.cancel_scope.cancel()
    return outcome


async def _wait_http_ok(proc: _Proc, url: str, path: str, timeout_s: float,
                        client: httpx.AsyncClient) -> None:
    """Poll ``url + path`` until it answers 200: SGLang's servers and the gateway announce
    readiness only by answering (``/health`` is 503 or refused before). The process's exit,
    watched meanwhile, ends the wait with an error."""

    async def answered() -> bool:
        try:
            return (await client.get(url + path, timeout=5.0)).status_code == 200
        except httpx.TransportError:
            return False

    outcome = await _poll_while_alive(proc, timeout_s, answered)
    if outcome == "ready":
        return
    assert proc.handle is not None
    if outcome == "exited":
        raise BackendError(f"{proc.name} exited with {proc.handle.describe_exit()} during startup "
                           f"(log {proc.where}):\n{await proc.handle.log_tail()}")
    raise BackendError(f"{proc.name} did not answer {path} within {timeout_s:g} s "
                       f"(log {proc.where}):\n{await proc.handle.log_tail()}")


async def _boot(proc: _Proc, timeout_s: float, client: httpx.AsyncClient,
                nursery: trio.Nursery) -> None:
    """Start ``proc`` through its starter and wait until its ``/health`` answers 200; sets
    ``proc.url`` and keeps the port it got for a restart."""
    proc.handle = await proc.starter.start(proc.spec, timeout_s=timeout_s, nursery=nursery,
                                           previous=proc.handle)
    proc.url = proc.handle.url
    port = proc.url.rsplit(":", 1)[1]
    proc.spec = attrs.evolve(proc.spec, cmd=with_flag(proc.handle.cmd, "--port", port))
    await _wait_http_ok(proc, proc.url, "/health", timeout_s, client)
    log.info("%s ready at %s (log %s)", proc.name, proc.url, proc.where)


def _cpu_share_env(num_engines: int) -> dict[str, str]:
    """Environment of an embedded engine sharing the CPU with ``num_engines - 1`` others.

    torch runs one compute thread per core in every process; N engines on C cores would run
    N x C threads and slow each other down, so each gets ``max(1, C // N)`` threads (unless the
    user set ``OMP_NUM_THREADS``).
    """
    if num_engines <= 1 or "OMP_NUM_THREADS" in os.environ:
        return {}
    threads = max(1, (os.cpu_count() or 1) // num_engines)
    return {"OMP_NUM_THREADS": str(threads)}


def _engine_procs(config: FleetConfig, kind: EngineKind, model_dir: Path, log_dir: Path,
                  engine_args: Sequence[str], starter: EngineStarter) -> list[_Proc]:
    """The engines' processes; GPU blocks are assigned here only for the local starter (a Ray
    starter reserves ``num_gpus_per_engine`` GPUs per actor and Ray sets the devices)."""
    procs = []
    per = config.num_gpus_per_engine
    local = isinstance(starter, LocalStarter)
    if kind == "sglang" and local:
        gpus = _visible_gpus()[: config.num_gpus or config.num_engines * per]
        if len(gpus) < per:
            raise BackendError(f"an SGLang engine of {per} GPUs needs {per} GPUs, "
                               f"{len(gpus)} available")
        blocks = len(gpus) // per
        if blocks < config.num_engines:
            log.warning("%d SGLang engines share %d GPU block(s) of %d GPU(s): give each a "
                        "share of the memory (e.g. --sglang-mem-fraction-static %.2f)",
                        config.num_engines, blocks, per, 0.8 / -(-config.num_engines // blocks))
    for i in range(config.num_engines):
        log_path = log_dir / f"engine-{i}.log"
        if kind == "sglang":
            cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir),
                   "--host", "127.0.0.1", "--port", str(_free_port()), "--tp-size", str(per),
                   *config.sglang_args]
            env = {}
            if local:
                block = i % blocks  # round robin when engines share GPUs
                env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus[block * per:(block + 1) * per])}
            spec = ProcessSpec(name=f"engine {i}", cmd=cmd, log_path=log_path, env=env,
                               num_gpus=per)
            procs.append(_Proc(spec=spec, starter=starter))
        else:
            cmd = [sys.executable, "-m", "relaxtrio.engine", "--model", str(model_dir),
                   "--host", "127.0.0.1", "--port", "0", *engine_args]
            env = _cpu_share_env(config.num_engines) if local else {}
            spec = ProcessSpec(name=f"engine {i}", cmd=cmd, log_path=log_path, env=env,
                               announces_url=True)
            procs.append(_Proc(spec=spec, starter=starter, max_restarts=config.engine_restarts,
                               restart_window_s=config.engine_restart_window_s))
    return procs


def _gateway_proc(urls: Sequence[str], log_dir: Path) -> _Proc:
    port = _free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
           "--port", str(port), "--worker-urls", *urls, "--policy", "manual",
           "--assignment-mode", "min_group", "--prometheus-host", "127.0.0.1",
           "--prometheus-port", str(_free_port()), "--health-check-interval-secs", "5",
           "--log-level", "warn"]
    spec = ProcessSpec(name="gateway", cmd=cmd, log_path=log_dir / "gateway.log")
    return _Proc(spec=spec, starter=LocalStarter(), max_restarts=MAX_GATEWAY_RESTARTS)


async def _supervise(launched: LaunchedFleet, proc: _Proc, gateway: bool, config: FleetConfig,
                     client: httpx.AsyncClient, nursery: trio.Nursery) -> None:
    """Watch one process; restart it when it dies (see the module docstring).

    A restart that fails (the new process dies during start-up or never answers ``/health``)
    is one more death: it is tried again while the restart budget allows. A restart normally
    gets the same URL (same node, same port); when it cannot (a Ray actor re-placed on another
    node, or its port taken there), the new URL joins the fleet and the old one is marked as
    given up only after it did, so the quorum never counts a gap.
    """
    while True:
        assert proc.handle is not None
        await proc.handle.wait()
        if proc.stopping:
            return
        status = proc.handle.describe_exit()
        fleet = None if gateway else launched.fleet
        restart = proc.take_restart()
        reason = f"{proc.name} process exited with {status}"
        old_url = proc.url
        if fleet is not None and old_url is not None:
            fleet.remove(old_url, reason, restarting=restart)
            if not restart:
                fleet.restart_failed(old_url, f"{reason}; {proc.budget_spent()}")
        if not restart:
            log.error("%s exited with %s; not restarting it: %s (log %s):\n%s", proc.name, status,
                      proc.budget_spent(), proc.where, await proc.handle.log_tail())
            return
        what = f"{proc.name} exited with {status}"
        while True:  # restart attempts
            log.warning("%s; restarting it on port %s (%s; log %s)", what,
                        flag_value(proc.spec.cmd, "--port"), proc.budget_used(), proc.where)
            try:
                await _boot(proc, config.startup_timeout_s, client, nursery)
                if fleet is not None and proc.url is not None:
                    fleet.set_restartable(proc.url, proc.supervised)
                    await fleet.readmit(proc.url)
                    if old_url is not None and proc.url != old_url:
                        log.warning("%s came back at %s instead of %s", proc.name, proc.url, old_url)
                        fleet.restart_failed(old_url, f"{reason}; replaced by {proc.url}")
                        launched.worker_urls = tuple(
                            proc.url if u == old_url else u for u in launched.worker_urls)
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
                    if fleet is not None and old_url is not None:
                        fleet.restart_failed(old_url, f"{reason}; the restart failed: {exc}; "
                                                      f"{proc.budget_spent()}")
                    return


@asynccontextmanager
async def open_launched_fleet(
    config: FleetConfig,
    *,
    model_dir: Path,
    log_dir: Path,
    engine_args: Sequence[str] = (),
    kind: EngineKind | None = None,
    starter: EngineStarter | None = None,
) -> AsyncIterator[LaunchedFleet]:
    """Start ``config.num_engines`` engines (and the gateway when more than one) and own them.

    Args:
        config: engine count, GPUs, ``--sglang-*`` flags, restarts, timeouts.
        model_dir: the model every engine serves.
        log_dir: where the logs go (created).
        engine_args: extra flags of embedded engines.
        kind: force the engine kind (default: :func:`detect_engine_kind`, or the starter's
            ``detect_kind()`` when it has one: a Ray starter looks at the cluster's GPUs).
        starter: where the engines' processes run (default: :class:`LocalStarter`, here).

    Yields:
        What was started; attach the fleet with :meth:`LaunchedFleet.attach`.

    Raises:
        BackendError: a process exited or did not answer ``/health`` during startup, or too few
            GPUs for the SGLang engines.

    Cancellation:
        Leaving the context in any way stops every process (shielded: SIGTERM, then SIGKILL
        after :data:`STOP_GRACE_S`).
    """
    starter = starter or LocalStarter()
    if kind is None:
        detect = getattr(starter, "detect_kind", detect_engine_kind)
        kind = await trio.to_thread.run_sync(detect)
    log_dir = log_dir.resolve()
    procs = _engine_procs(config, kind, model_dir, log_dir, engine_args, starter)
    launched = LaunchedFleet(kind=kind, worker_urls=(), gateway_url=None, log_dir=log_dir,
                             procs=procs)
    use_gateway = config.num_engines > 1 and importlib.util.find_spec("sglang_router") is not None
    if config.num_engines > 1 and not use_gateway:
        log.warning("sglang-router is not installed: routing Sessions over the %d engines without "
                    "a gateway (pip install sglang-router==0.3.2 for the gateway)",
                    config.num_engines)
    log.info("starting %d %s engine(s)%s (logs in %s)", config.num_engines, kind,
             " and the gateway" if use_gateway else "", log_dir)
    supervisors = _Supervisors()
    async with httpx.AsyncClient() as client, trio.open_nursery() as nursery:
        launched._nursery = nursery
        try:
            async with trio.open_nursery() as boot:
                for proc in procs:
                    boot.start_soon(_boot, proc, config.startup_timeout_s, client, nursery)
            launched.worker_urls = tuple(p.url for p in procs if p.url is not None)
            if use_gateway:
                gateway = _gateway_proc(launched.worker_urls, log_dir)
                procs.append(gateway)
                await _boot(gateway, config.startup_timeout_s, client, nursery)
                launched.gateway_url = gateway.url
            for proc in procs:
                nursery.start_soon(supervisors.run, _supervise, launched, proc, proc.name == "gateway",
                                   config, client, nursery)
            yield launched
        finally:
            # Supervisors first: one restarting an engine as the run ends would otherwise start
            # its replacement after _stop_all (which then leaks). A cancelled start stops what it
            # started; a finished one left its process in proc.handle for _stop_all.
            await supervisors.stop()
            await _stop_all(procs)
            nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class _Supervisors:
    """The ``_supervise`` tasks of a launched fleet, cancellable and awaitable as one."""

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


async def _stop_all(procs: Sequence[_Proc]) -> None:
    with trio.CancelScope(shield=True):
        for proc in procs:
            proc.stopping = True
        async with trio.open_nursery() as stops:
            for proc in procs:
                stops.start_soon(proc.stop)


async def _await_registered(gateway: _Proc, worker_urls: Sequence[str], timeout_s: float,
                            client: httpx.AsyncClient) -> None:
    """Wait until the gateway's ``GET /workers`` lists every URL of ``worker_urls`` as healthy.

    The gateway answers ``/health`` before it has registered the workers of its launch flags
    (it registers them in the background); a Session routed meanwhile gets a ``min_group`` key
    on the workers registered so far and keeps it, so a loaded machine could send every first
    Session to one worker. Past ``timeout_s`` it goes on with a warning naming the missing ones.

    Raises:
        BackendError: the gateway exited while waited for.
    """
    assert gateway.handle is not None and gateway.url is not None
    url = gateway.url
    expected = {u.rstrip("/") for u in worker_urls}
    healthy: set[str] = set()

    async def all_listed() -> bool:
        nonlocal healthy
        try:
            listing = (await client.get(url + "/workers", timeout=5.0)).json()
            healthy = {str(w.get("url", "")).rstrip("/") for w in listing.get("workers", ())
                       if isinstance(w, dict) and w.get("is_healthy", True)}
        except (httpx.TransportError, ValueError, AttributeError):
            pass
        return expected <= healthy

    outcome = await _poll_while_alive(gateway, timeout_s, all_listed)
    if outcome == "exited":
        raise BackendError(f"the gateway exited with {gateway.handle.describe_exit()} while "
                           f"registering its workers (log {gateway.where}):\n"
                           f"{await gateway.handle.log_tail()}")
    if outcome == "timeout":
        log.warning("gateway %s lists %d of its %d workers as healthy after %g s (missing: %s)",
                    url, len(expected & healthy), len(expected), timeout_s,
                    ", ".join(sorted(expected - healthy)))


@asynccontextmanager
async def open_gateway(
    config: FleetConfig, worker_urls: Sequence[str], *, log_dir: Path
) -> AsyncIterator[LaunchedFleet]:
    """Launch only the gateway, in front of workers that run already (restarted when it exits).

    Args:
        config: startup timeout.
        worker_urls: the workers' base URLs.
        log_dir: where ``gateway.log`` goes.

    Yields:
        What was started (``gateway_url`` set; ``worker_urls`` as given), once the gateway lists
        every worker as healthy (or ``startup_timeout_s`` passed: warned).

    Raises:
        BackendError: the gateway exited or did not answer ``/health`` during startup, or
            exited while registering the workers.

    Cancellation:
        Leaving the context in any way stops the gateway (shielded).
    """
    gateway = _gateway_proc(worker_urls, log_dir.resolve())
    launched = LaunchedFleet(kind="embedded", worker_urls=tuple(worker_urls), gateway_url=None,
                             log_dir=log_dir.resolve(), procs=[gateway])
    async with httpx.AsyncClient() as client, trio.open_nursery() as nursery:
        try:
            await _boot(gateway, config.startup_timeout_s, client, nursery)
            launched.gateway_url = gateway.url
            await _await_registered(gateway, worker_urls, config.startup_timeout_s, client)
            nursery.start_soon(_supervise, launched, gateway, True, config, client, nursery)
            yield launched
        finally:
            await _stop_all([gateway])
            nursery.cancel_scope.cancel()
