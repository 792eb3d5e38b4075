"""Launching the fleet: N engines, plus one SGLang Model Gateway in front when N > 1.

``--rollout-num-engines N`` starts N engines of ``--rollout-backend`` (command lines and
environments: :mod:`relaxtrio.fleet.engine_commands`; vLLM engines get no gateway: relaxtrio
routes Sessions over them itself). Without the flag: ``python -m sglang.launch_server`` when
SGLang is installed and a GPU is present (engine ``i`` sees GPUs ``i*g .. i*g+g-1`` of the ``num_gpus`` it
may use, ``g = num_gpus_per_engine`` is its tensor-parallel size; with fewer GPUs than engines
need, the engines share them round robin; the ``--sglang-*`` flags are passed on without the
``sglang-`` part), the embedded CPU engine (``python -m
relaxtrio.engine``) otherwise. With N > 1 the gateway (``python -m smg launch``, PyPI ``smg``, the
Shepherd Model Gateway) runs in front with the ``manual`` policy (``min_group`` assignment: a new
Session key goes to the worker with the fewest keys) and its own retries, circuit breaker and
rerouting off (:func:`gateway_command`: relaxtrio owns health and removal).
Each process is started only after the previous ones answered ``/health``.

Ownership: every process runs under :mod:`relaxtrio._reaper` as the leader of its own
process group, so stopping it (SIGTERM to the group, SIGKILL after :data:`STOP_GRACE_S`) stops
everything it spawned, and a driver that dies without cleaning up (SIGKILL) still takes them
down (the shim watches the driver's pid). The processes live in the launcher's nursery: leaving the context (normally, by an error,
by Ctrl-C) stops them all. Logs go to ``<log_dir>/engine-<i>.log`` and ``<log_dir>/gateway.log``.

Supervision: a launched embedded or vLLM engine that exits is removed from the fleet with its exit
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

import functools
import importlib.util
import logging
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import attrs
import httpx
import trio

from .._errors import BackendError
from ..config import Backend, FleetConfig
from .engine_commands import embedded_command, sglang_command, vllm_command, vllm_env
from .fleet import EngineFleet
from .gateway import ROUTING_KEY_HEADER
from .processes import LaunchedProcess, Supervisors, boot, poll_while_alive, stop_all, supervise
from .starter import (
    STOP_GRACE_S,
    EngineProcess,
    EngineStarter,
    LocalStarter,
    ProcessSpec,
    flag_value,
)

__all__ = ["GATEWAY_COMMAND", "STOP_GRACE_S", "EngineKind", "LaunchedFleet", "detect_engine_kind",
           "gateway_command", "gateway_metrics_url", "launch_kind", "open_gateway", "open_launched_fleet"]

log = logging.getLogger(__name__)

EngineKind = Backend
KILL_GRACE_S: Final = 2.0
MAX_GATEWAY_RESTARTS: Final = 5  # within any hour
WEDGE_OFF_S: Final = 86400  # the gateway's stalled-worker rerouting, in effect off
GATEWAY_KINDS: Final = frozenset({"sglang", "embedded"})
"""Engine kinds behind the gateway: those serving SGLang's ``/generate`` (smg answers 404 for
vLLM's token API, so the fleet routes other kinds' Sessions itself)."""


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


def launch_kind(config: FleetConfig) -> EngineKind:
    """The kind of engines launched for ``config``: ``--rollout-backend``, else
    :func:`detect_engine_kind` (looks for GPUs: call it off the trio thread)."""
    return config.backend or detect_engine_kind()


@attrs.define(eq=False, kw_only=True)
class LaunchedFleet:
    """What :func:`open_launched_fleet` started.

    Attributes:
        kind: the engines' kind.
        worker_urls: the engines' base URLs.
        gateway_url: the gateway's base URL, or None (one engine, or no gateway package).
        gateway_metrics_url: where the gateway serves its Prometheus metrics, or None.
        log_dir: where the logs are.
        fleet: the :class:`~relaxtrio.fleet.fleet.EngineFleet` told about deaths and restarts
            (set with :meth:`attach`).
    """

    kind: EngineKind
    worker_urls: tuple[str, ...]
    gateway_url: str | None
    log_dir: Path
    gateway_metrics_url: str | None = None
    fleet: EngineFleet | None = None
    _procs: list[LaunchedProcess] = attrs.field(factory=list)
    _nursery: trio.Nursery | None = None

    def attach(self, fleet: EngineFleet) -> None:
        """Route later deaths and restarts to ``fleet`` (``remove`` / ``readmit``), and let the
        fleet's removals reach the processes: a removed engine that still runs (it stopped
        answering) is killed, so that it is restarted like one that died; the fleet reads the
        gateway's per-worker metrics (:meth:`EngineFleet.gateway_metrics`)."""
        self.fleet = fleet
        if fleet.gateway is not None and self.gateway_metrics_url is not None:
            fleet.gateway.watch_metrics(self.gateway_metrics_url)
        for proc in self._procs:
            if proc.url is not None and proc.name != "gateway":
                fleet.members.set_restartable(proc.url, proc.supervised)
        fleet.on_remove = self._on_remove

    def fleet_of(self, proc: LaunchedProcess) -> Callable[[], EngineFleet | None]:
        """What ``proc``'s supervisor tells about deaths and restarts: the attached fleet for
        an engine, nothing for the gateway."""
        if proc.name == "gateway":
            return lambda: None
        return lambda: self.fleet

    def replaced(self, old_url: str, new_url: str) -> None:
        """A restarted engine came back at ``new_url`` instead of ``old_url``."""
        self.worker_urls = tuple(new_url if u == old_url else u for u in self.worker_urls)

    def _on_remove(self, url: str, reason: str) -> None:
        for proc in self._procs:
            if proc.url == url and self._nursery is not None:
                self._nursery.start_soon(self._kill_if_running, proc, proc.handle, reason)

    async def _kill_if_running(self, proc: LaunchedProcess, handle: EngineProcess | None, reason: str) -> None:
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
                  engine_args: Sequence[str], starter: EngineStarter) -> list[LaunchedProcess]:
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
            env = {}
            if local:
                block = i % blocks  # round robin when engines share GPUs
                env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus[block * per:(block + 1) * per])}
            spec = ProcessSpec(name=f"engine {i}", cmd=sglang_command(config, model_dir),
                               log_path=log_path, env=env, num_gpus=per)
            procs.append(LaunchedProcess(spec=spec, starter=starter))
            continue
        if kind == "vllm":
            # A failed weight reload leaves a vLLM engine unusable: it is restarted like a crash.
            spec = ProcessSpec(name=f"engine {i}", cmd=vllm_command(config, model_dir, engine_args),
                               log_path=log_path,
                               env=vllm_env(i, config.num_engines, engine_args, local=local))
        else:
            env = _cpu_share_env(config.num_engines) if local else {}
            spec = ProcessSpec(name=f"engine {i}", cmd=embedded_command(model_dir, engine_args),
                               log_path=log_path, env=env, announces_url=True)
        procs.append(LaunchedProcess(spec=spec, starter=starter, max_restarts=config.engine_restarts,
                                     restart_window_s=config.engine_restart_window_s))
    return procs


GATEWAY_COMMAND: Final = ("-m", "smg", "launch")
"""How the gateway is started, after relaxtrio's own interpreter (PyPI ``smg``, the Shepherd
Model Gateway; its process then renames itself ``smg::router``)."""


def gateway_command(urls: Sequence[str], *, port: int, metrics_port: int) -> list[str]:
    """The gateway's command line: a router over ``urls`` and nothing more.

    relaxtrio owns health and removal (:mod:`relaxtrio.fleet.health`,
    :class:`~relaxtrio.fleet.gateway.Gateway`), so the gateway's own fault handling is off: no
    retries (a generation that failed on its worker is the fleet's to resume: a retry on another
    worker would run it twice, once unseen), no circuit breaker, no overload or wedge rerouting
    (they would move a pinned Session off its worker's prefix cache), and it never drops a worker
    from its listing by itself. Its health probes stay on: they only keep an unhealthy worker out
    of routing until the fleet removes it. ``--policy manual`` pins each routing key (the Session
    id, :data:`~relaxtrio.fleet.gateway.ROUTING_KEY_HEADER`) to one worker; ``min_group`` gives a
    new key the worker with the fewest keys. Per-worker counters are served in Prometheus text on
    ``metrics_port`` (:mod:`relaxtrio.fleet.gateway_metrics`).
    """
    return [sys.executable, *GATEWAY_COMMAND, "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *urls, "--policy", "manual", "--assignment-mode", "min_group",
            "--routing-key-headers", ROUTING_KEY_HEADER.lower(),
            "--disable-retries", "--disable-circuit-breaker",
            "--disable-worker-overload-protection", "--worker-wedge-secs", str(WEDGE_OFF_S),
            "--no-remove-unhealthy-workers", "--health-check-interval-secs", "5",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            "--log-level", "warn"]


def _gateway_proc(urls: Sequence[str], log_dir: Path) -> LaunchedProcess:
    cmd = gateway_command(urls, port=_free_port(), metrics_port=_free_port())
    spec = ProcessSpec(name="gateway", cmd=cmd, log_path=log_dir / "gateway.log")
    return LaunchedProcess(spec=spec, starter=LocalStarter(), max_restarts=MAX_GATEWAY_RESTARTS)


def gateway_metrics_url(proc: LaunchedProcess) -> str:
    """Where the launched gateway ``proc`` serves its Prometheus metrics (``/metrics``)."""
    cmd = proc.spec.cmd
    return f"http://{flag_value(cmd, '--prometheus-host')}:{flag_value(cmd, '--prometheus-port')}"


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
        kind: force the engine kind (default: ``config.backend``, else :func:`detect_engine_kind`,
            or the starter's ``detect_kind()`` when it has one: a Ray starter looks at the
            cluster's GPUs).
        starter: where the engines' processes run (default: :class:`LocalStarter`, here).

    Yields:
        What was started; attach the fleet with :meth:`LaunchedFleet.attach`.

    Raises:
        BackendError: a process exited or did not answer ``/health`` during startup, or too few
            GPUs for the SGLang engines.
        ConfigError: no environment for SGLang or vLLM engines
            (:func:`~relaxtrio.fleet.engine_commands.engine_python`).

    Cancellation:
        Leaving the context in any way stops every process (shielded: SIGTERM, then SIGKILL
        after :data:`STOP_GRACE_S`).
    """
    starter = starter or LocalStarter()
    if kind is None and config.backend is None:
        detect: Callable[[], EngineKind] = getattr(starter, "detect_kind", detect_engine_kind)
        engine_kind = await trio.to_thread.run_sync(detect)
    else:
        engine_kind = kind or launch_kind(config)
    log_dir = await trio.to_thread.run_sync(log_dir.resolve)
    procs = _engine_procs(config, engine_kind, model_dir, log_dir, engine_args, starter)
    launched = LaunchedFleet(kind=engine_kind, worker_urls=(), gateway_url=None, log_dir=log_dir,
                             procs=procs)
    # Only SGLang-speaking engines go behind the gateway: vLLM fleets route Sessions themselves
    # (sticky, relaxtrio.fleet.routing), since smg does not route vLLM's /inference/v1/generate.
    routed = config.num_engines > 1 and engine_kind in GATEWAY_KINDS
    use_gateway = routed and importlib.util.find_spec("smg") is not None
    if routed and not use_gateway:
        log.warning("smg is not installed: routing Sessions over the %d engines without "
                    "a gateway (pip install smg==1.13.0 for the gateway)", config.num_engines)
    log.info("starting %d %s engine(s)%s (logs in %s)", config.num_engines, engine_kind,
             " and the gateway" if use_gateway else "", log_dir)
    supervisors = Supervisors()
    async with httpx.AsyncClient() as client, trio.open_nursery() as nursery:
        launched._nursery = nursery
        try:
            async with trio.open_nursery() as boot_all:
                for proc in procs:
                    boot_all.start_soon(boot, proc, config.startup_timeout_s, client, nursery)
            launched.worker_urls = tuple(p.url for p in procs if p.url is not None)
            if use_gateway:
                gateway = _gateway_proc(launched.worker_urls, log_dir)
                procs.append(gateway)
                await boot(gateway, config.startup_timeout_s, client, nursery)
                launched.gateway_url = gateway.url
                launched.gateway_metrics_url = gateway_metrics_url(gateway)
            for proc in procs:
                nursery.start_soon(supervisors.run, functools.partial(
                    supervise, proc, config=config, client=client, nursery=nursery,
                    fleet=launched.fleet_of(proc), replaced=launched.replaced))
            yield launched
        finally:
            # Supervisors first: one restarting an engine as the run ends would otherwise start
            # its replacement after _stop_all (which then leaks). A cancelled start stops what it
            # started; a finished one left its process in proc.handle for _stop_all.
            await supervisors.stop()
            await stop_all(procs)
            nursery.cancel_scope.cancel()


async def _await_registered(gateway: LaunchedProcess, worker_urls: Sequence[str], timeout_s: float,
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

    outcome = await poll_while_alive(gateway, timeout_s, all_listed)
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
    log_dir = await trio.to_thread.run_sync(log_dir.resolve)
    gateway = _gateway_proc(worker_urls, log_dir)
    launched = LaunchedFleet(kind="embedded", worker_urls=tuple(worker_urls), gateway_url=None,
                             log_dir=log_dir, procs=[gateway])
    async with httpx.AsyncClient() as client, trio.open_nursery() as nursery:
        try:
            await boot(gateway, config.startup_timeout_s, client, nursery)
            launched.gateway_url = gateway.url
            launched.gateway_metrics_url = gateway_metrics_url(gateway)
            await _await_registered(gateway, worker_urls, config.startup_timeout_s, client)
            nursery.start_soon(functools.partial(
                supervise, gateway, config=config, client=client, nursery=nursery,
                fleet=launched.fleet_of(gateway), replaced=launched.replaced))
            yield launched
        finally:
            await stop_all([gateway])
            nursery.cancel_scope.cancel()
