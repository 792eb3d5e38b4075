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
status (and the tail of its log), restarted on the same port up to ``engine_restarts`` times,
given the current weights, and readmitted; an SGLang engine is not restarted (a GPU server that
died usually needs a person). The gateway is restarted on its port whenever it exits; the fleet
waits for it (up to ``gateway_wait_s``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, Literal

import attrs
import httpx
import trio

from .. import _reaper as reaper
from .._errors import BackendError
from ..config import FleetConfig
from .fleet import EngineFleet
from .launch import _copy_to_log, _read_url

__all__ = ["EngineKind", "LaunchedFleet", "detect_engine_kind", "open_gateway",
           "open_launched_fleet"]

log = logging.getLogger(__name__)

EngineKind = Literal["sglang", "embedded"]
STOP_GRACE_S: Final = 10.0
KILL_GRACE_S: Final = 2.0
MAX_GATEWAY_RESTARTS: Final = 5
_POLL_S: Final = 0.2


def _tail(path: Path, num_bytes: int = 3000) -> str:
    try:
        return path.read_bytes()[-num_bytes:].decode("utf-8", errors="replace")
    except OSError:
        return ""


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
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def detect_engine_kind() -> EngineKind:
    """``sglang`` when the ``sglang`` package and a GPU are present, else ``embedded``."""
    if importlib.util.find_spec("sglang") is not None and _visible_gpus():
        return "sglang"
    return "embedded"


def _status_text(code: int | None) -> str:
    """``code 137 (killed by SIGKILL)``: a signal death (``-N``) is shown as a shell shows it."""
    if code is None:
        return "still running"
    code = 128 - code if code < 0 else code
    signum = code - 128
    if signum > 0 and signum in signal.Signals._value2member_map_:
        return f"code {code} (killed by {signal.Signals(signum).name})"
    return f"code {code}"


@attrs.define(eq=False, kw_only=True)
class _Proc:
    """One launched process (an engine or the gateway)."""

    name: str
    cmd: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    port: int | None = None
    url: str | None = None
    process: trio.Process | None = None
    restarts_left: int = 0
    stopping: bool = False

    async def start(self) -> None:
        """Start the process: stderr straight into the log, stdout through a pipe (copied into
        the log by :func:`_boot`'s reader, so the embedded engine's URL line is an event)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as stderr_file:
            self.process = await trio.lowlevel.open_process(
                reaper.command(self.cmd),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr_file,
                env=self.env, start_new_session=True,
            )

    async def stop(self) -> None:
        """SIGTERM to the group, SIGKILL after the grace period; waits for the shim."""
        self.stopping = True
        if self.process is None:
            return
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)  # the shim passes it on to the process
        with trio.move_on_after(STOP_GRACE_S):
            await self.process.wait()
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the group may outlive its leader
        except (ProcessLookupError, PermissionError):
            pass
        await self.process.wait()


@attrs.define(eq=False, kw_only=True)
class LaunchedFleet:
    """What :func:`open_launched_fleet` started.

    Attributes:
        kind: the engines' kind.
        worker_urls: the engines' base URLs.
        gateway_url: the gateway's base URL, or None (one engine, or no gateway package).
        log_dir: where the logs are.
        fleet: the :class:`~relaxtrio.sglang.fleet.EngineFleet` told about deaths and restarts
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
                fleet.set_restartable(proc.url, proc.restarts_left > 0)
        fleet.on_remove = self._on_remove

    def _on_remove(self, url: str, reason: str) -> None:
        for proc in self._procs:
            if proc.url == url and self._nursery is not None:
                self._nursery.start_soon(self._kill_if_running, proc, proc.process, reason)

    async def _kill_if_running(self, proc: _Proc, process: trio.Process | None, reason: str) -> None:
        """Kill a removed engine that is still running :data:`KILL_GRACE_S` later (one that died
        is being handled by its supervisor already)."""
        if process is None:
            return
        with trio.move_on_after(KILL_GRACE_S):
            await process.wait()
            return
        if proc.process is process and not proc.stopping:
            log.warning("%s was removed from the fleet (%s) but still runs; killing it so that "
                        "it is restarted", proc.name, reason)
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def pids(self) -> list[int]:
        """Process-group ids of the running processes (for tests)."""
        return [p.process.pid for p in self._procs if p.process and p.process.returncode is None]


async def _wait_http_ok(proc: _Proc, url: str, path: str, timeout_s: float,
                        client: httpx.AsyncClient) -> None:
    """Poll ``url + path`` until it answers 200: SGLang's servers and the gateway announce
    readiness only by answering (``/health`` is 503 or refused before)."""
    with trio.move_on_after(timeout_s):
        while True:
            assert proc.process is not None
            if proc.process.poll() is not None:
                raise BackendError(f"{proc.name} exited with {_status_text(proc.process.returncode)} "
                                   f"during startup (log {proc.log_path}):\n{_tail(proc.log_path)}")
            try:
                response = await client.get(url + path, timeout=5.0)
                if response.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await trio.sleep(_POLL_S)
    raise BackendError(f"{proc.name} did not answer {path} within {timeout_s:g} s "
                       f"(log {proc.log_path}):\n{_tail(proc.log_path)}")


async def _pump(stdout: trio.abc.ReceiveStream, log_file: Any) -> None:
    """Copy a process's stdout into its log until EOF; then close both."""
    try:
        await _copy_to_log(stdout, log_file.write)
    finally:
        with trio.CancelScope(shield=True):
            await log_file.aclose()
            await stdout.aclose()


async def _wait_url_line(proc: _Proc, log_file: Any, timeout_s: float) -> str:
    """The embedded engine's URL line, read from its stdout pipe (copied into the log)."""
    assert proc.process is not None and proc.process.stdout is not None
    with trio.move_on_after(timeout_s):
        url = await _read_url(proc.process.stdout, log_file.write)
        if url is not None:
            return url
        await proc.process.wait()  # stdout closed without the line: it is exiting
        raise BackendError(f"{proc.name} exited with {_status_text(proc.process.returncode)} "
                           f"during startup (log {proc.log_path}):\n{_tail(proc.log_path)}")
    raise BackendError(f"{proc.name} not ready within {timeout_s:g} s (log {proc.log_path}):\n"
                       f"{_tail(proc.log_path)}")


async def _boot(proc: _Proc, kind: EngineKind | Literal["gateway"], timeout_s: float,
                client: httpx.AsyncClient, nursery: trio.Nursery) -> None:
    """Start ``proc`` and wait until its ``/health`` answers 200; sets ``proc.url``.

    Its stdout is copied into its log by a task in ``nursery`` for as long as it runs.
    """
    await proc.start()
    assert proc.process is not None and proc.process.stdout is not None
    log_file = await trio.open_file(proc.log_path, "ab", buffering=0)
    pumping = False
    try:
        if kind == "embedded" and proc.port is None:
            proc.url = await _wait_url_line(proc, log_file, timeout_s)
            proc.port = int(proc.url.rsplit(":", 1)[1])
            proc.cmd[proc.cmd.index("--port") + 1] = str(proc.port)  # a restart keeps the port
        else:
            proc.url = f"http://127.0.0.1:{proc.port}"
        nursery.start_soon(_pump, proc.process.stdout, log_file)
        pumping = True
    finally:
        if not pumping:
            with trio.CancelScope(shield=True):
                await log_file.aclose()
    await _wait_http_ok(proc, proc.url, "/health", timeout_s, client)
    log.info("%s ready at %s (log %s)", proc.name, proc.url, proc.log_path)


def _cpu_share_env(num_engines: int) -> dict[str, str] | None:
    """Environment of an embedded engine sharing the CPU with ``num_engines - 1`` others.

    torch runs one compute thread per core in every process; N engines on C cores would run
    N x C threads and slow each other down, so each gets ``max(1, C // N)`` threads (unless the
    user set ``OMP_NUM_THREADS``).
    """
    if num_engines <= 1 or "OMP_NUM_THREADS" in os.environ:
        return None
    threads = max(1, (os.cpu_count() or 1) // num_engines)
    return dict(os.environ, OMP_NUM_THREADS=str(threads))


def _engine_procs(config: FleetConfig, kind: EngineKind, model_dir: Path, log_dir: Path,
                  engine_args: Sequence[str]) -> list[_Proc]:
    procs = []
    if kind == "sglang":
        per = config.num_gpus_per_engine
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
            port = _free_port()
            cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir),
                   "--host", "127.0.0.1", "--port", str(port), "--tp-size", str(per),
                   *config.sglang_args]
            block = i % blocks  # round robin when engines share GPUs
            env = dict(os.environ,
                       CUDA_VISIBLE_DEVICES=",".join(gpus[block * per:(block + 1) * per]))
            procs.append(_Proc(name=f"engine {i}", cmd=cmd, log_path=log_path, env=env, port=port))
        else:
            cmd = [sys.executable, "-m", "relaxtrio.engine", "--model", str(model_dir),
                   "--host", "127.0.0.1", "--port", "0", *engine_args]
            procs.append(_Proc(name=f"engine {i}", cmd=cmd, log_path=log_path,
                               env=_cpu_share_env(config.num_engines),
                               restarts_left=config.engine_restarts))
    return procs


def _gateway_proc(urls: Sequence[str], log_dir: Path) -> _Proc:
    port = _free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
           "--port", str(port), "--worker-urls", *urls, "--policy", "manual",
           "--assignment-mode", "min_group", "--prometheus-host", "127.0.0.1",
           "--prometheus-port", str(_free_port()), "--health-check-interval-secs", "5",
           "--log-level", "warn"]
    return _Proc(name="gateway", cmd=cmd, log_path=log_dir / "gateway.log", port=port,
                 restarts_left=MAX_GATEWAY_RESTARTS)


async def _supervise(launched: LaunchedFleet, proc: _Proc, kind: EngineKind | Literal["gateway"],
                     config: FleetConfig, client: httpx.AsyncClient, nursery: trio.Nursery) -> None:
    """Watch one process; restart it when it dies (see the module docstring)."""
    while True:
        assert proc.process is not None
        await proc.process.wait()
        if proc.stopping:
            return
        status = _status_text(proc.process.returncode)
        fleet = launched.fleet if kind != "gateway" else None
        restart = proc.restarts_left > 0
        reason = f"{proc.name} process exited with {status}"
        if fleet is not None and proc.url is not None:
            fleet.remove(proc.url, reason, restarting=restart)
            if not restart:
                fleet.restart_failed(proc.url, reason)
        if not restart:
            log.error("%s exited with %s; not restarting it (log %s):\n%s", proc.name, status,
                      proc.log_path, _tail(proc.log_path))
            return
        proc.restarts_left -= 1
        log.warning("%s exited with %s; restarting it on port %s (log %s)", proc.name, status,
                    proc.port, proc.log_path)
        try:
            await _boot(proc, kind, config.startup_timeout_s, client, nursery)
            if fleet is not None and proc.url is not None:
                fleet.set_restartable(proc.url, proc.restarts_left > 0)
                await fleet.readmit(proc.url)
        except BackendError as exc:
            log.error("%s could not be restarted: %s", proc.name, exc)
            if fleet is not None and proc.url is not None:
                fleet.restart_failed(proc.url, f"{reason}; the restart failed: {exc}")
            return


@asynccontextmanager
async def open_launched_fleet(
    config: FleetConfig,
    *,
    model_dir: Path,
    log_dir: Path,
    engine_args: Sequence[str] = (),
    kind: EngineKind | None = None,
) -> AsyncIterator[LaunchedFleet]:
    """Start ``config.num_engines`` engines (and the gateway when more than one) and own them.

    Args:
        config: engine count, GPUs, ``--sglang-*`` flags, restarts, timeouts.
        model_dir: the model every engine serves.
        log_dir: where the logs go (created).
        engine_args: extra flags of embedded engines.
        kind: force the engine kind (default: :func:`detect_engine_kind`).

    Yields:
        What was started; attach the fleet with :meth:`LaunchedFleet.attach`.

    Raises:
        BackendError: a process exited or did not answer ``/health`` during startup, or too few
            GPUs for the SGLang engines.

    Cancellation:
        Leaving the context in any way stops every process (shielded: SIGTERM, then SIGKILL
        after :data:`STOP_GRACE_S`).
    """
    kind = kind or detect_engine_kind()
    log_dir = log_dir.resolve()
    procs = _engine_procs(config, kind, model_dir, log_dir, engine_args)
    launched = LaunchedFleet(kind=kind, worker_urls=(), gateway_url=None, log_dir=log_dir,
                             procs=procs)
    use_gateway = config.num_engines > 1 and importlib.util.find_spec("sglang_router") is not None
    if config.num_engines > 1 and not use_gateway:
        log.warning("sglang-router is not installed: routing Sessions over the %d engines without "
                    "a gateway (pip install sglang-router==0.3.2 for the gateway)",
                    config.num_engines)
    log.info("starting %d %s engine(s)%s (logs in %s)", config.num_engines, kind,
             " and the gateway" if use_gateway else "", log_dir)
    async with httpx.AsyncClient() as client, trio.open_nursery() as nursery:
        launched._nursery = nursery
        try:
            async with trio.open_nursery() as boot:
                for proc in procs:
                    boot.start_soon(_boot, proc, kind, config.startup_timeout_s, client, nursery)
            launched.worker_urls = tuple(p.url for p in procs if p.url is not None)
            if use_gateway:
                gateway = _gateway_proc(launched.worker_urls, log_dir)
                procs.append(gateway)
                await _boot(gateway, "gateway", config.startup_timeout_s, client, nursery)
                launched.gateway_url = gateway.url
            for proc in procs:
                nursery.start_soon(_supervise, launched, proc,
                                   "gateway" if proc.name == "gateway" else kind, config, client,
                                   nursery)
            yield launched
        finally:
            await _stop_all(procs)
            nursery.cancel_scope.cancel()


async def _stop_all(procs: Sequence[_Proc]) -> None:
    with trio.CancelScope(shield=True):
        for proc in procs:
            proc.stopping = True
        async with trio.open_nursery() as stops:
            for proc in procs:
                stops.start_soon(proc.stop)


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
        What was started (``gateway_url`` set; ``worker_urls`` as given).

    Raises:
        BackendError: the gateway exited or did not answer ``/health`` during startup.

    Cancellation:
        Leaving the context in any way stops the gateway (shielded).
    """
    gateway = _gateway_proc(worker_urls, log_dir.resolve())
    launched = LaunchedFleet(kind="embedded", worker_urls=tuple(worker_urls), gateway_url=None,
                             log_dir=log_dir.resolve(), procs=[gateway])
    async with httpx.AsyncClient() as client, trio.open_nursery() as nursery:
        try:
            await _boot(gateway, "gateway", config.startup_timeout_s, client, nursery)
            launched.gateway_url = gateway.url
            nursery.start_soon(_supervise, launched, gateway, "gateway", config, client, nursery)
            yield launched
        finally:
            await _stop_all([gateway])
            nursery.cancel_scope.cancel()
