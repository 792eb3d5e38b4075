"""Launched engines as Ray actors (``--ray-address`` with ``--rollout-num-engines N``).

:class:`RayEngineStarter` is the :class:`~relaxtrio.fleet.starter.EngineStarter` of a Ray run:
each launched engine gets one actor that reserves the engine's GPUs (``num_gpus_per_engine``;
none for the embedded CPU engine) and ``--engine-num-cpus`` CPUs, so Ray places it on a node
that has them free. The actor starts the very command line the local launcher would run
(:mod:`relaxtrio.fleet.launch_fleet`) on its node, under :mod:`relaxtrio._reaper` as the
leader of its own process group, with its log at the same path on that node (the run
directory's ``engines/engine-<i>.log``), and returns the engine's base URL:

- on the driver's node the engine keeps ``--host 127.0.0.1``: nothing changes from a local
  launch (the agent API and the gateway reach it on loopback, and an embedded engine takes its
  weights through shared memory);
- on another node it binds that node's IP (``--host <node IP>``; both the embedded engine and
  SGLang's ``launch_server`` take ``--host``), so the driver and the gateway can reach it; its
  weights come through the disk store (``--weights-dir`` must be a directory every node sees),
  because the shared-memory mailbox exists only on the driver's node
  (:mod:`relaxtrio.run.inference` chooses per engine).

The fleet then works on URLs as with local processes: the gateway runs next to the driver,
membership, health and weight pushes are unchanged. The actor reports the process's exit
(:meth:`_RayProcess.wait`); a supervisor restart goes through :meth:`RayEngineStarter.start`
again, in the same actor when it is alive (same node, same port, so the same URL), otherwise in
a new actor placed on the same node when it still has room. The engine process cannot outlive
its actor: the reaper shim watches the actor's process and takes the engine's group down when
the actor dies (``ray.kill``, a lost worker). Stopping terminates the group (SIGTERM, SIGKILL
after :data:`~relaxtrio.fleet.starter.STOP_GRACE_S`) and kills the actor.

Every Ray call is made from a worker thread (``trio.to_thread.run_sync``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any, Final

import attrs
import ray
import trio
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .. import _reaper as reaper
from .._errors import BackendError
from ..fleet.embedded import URL_PREFIX
from ..fleet.starter import (
    STOP_GRACE_S,
    EngineProcess,
    ProcessSpec,
    flag_value,
    status_text,
    tail,
    with_flag,
)
from .runtime import connect

__all__ = ["RayEngineStarter"]

log = logging.getLogger(__name__)

_WAIT_CHUNK_S: Final = 5.0
"""Seconds one ``wait`` call to the actor blocks (a cancelled wait leaves its thread this long)."""

_CALL_MARGIN_S: Final = 30.0
"""Seconds on top of a call's own bound for Ray's round trip (actor placement included)."""


def _port_free(host: str, port: int) -> bool:
    """Whether an engine could listen on ``port`` (as servers do, past TIME_WAIT sockets)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# wait() blocks (a watcher during startup, the supervisor, a removal's check, and abandoned waits
# that run out within _WAIT_CHUNK_S) while start/stop/kill/tail are answered.
@ray.remote(max_concurrency=8)
class _EngineActor:
    """Runs one engine process on this actor's node (module docstring)."""

    def __init__(self, driver_node_id: str, num_cpus: float) -> None:
        self._node_id = ray.get_runtime_context().get_node_id()
        self._ip = ray.util.get_node_ip_address()
        self._same_node = self._node_id == driver_node_id
        self._num_threads = max(1, int(num_cpus))
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    def where(self) -> tuple[str, str]:
        """``(node id, node IP)`` of this actor."""
        return self._node_id, self._ip

    def start(self, job: ProcessSpec, timeout_s: float) -> tuple[str, Any, Any, int]:
        """Starts ``job`` here: ``("ok", url, cmd, pgid)`` or ``("failed", message, None, 0)``."""
        cmd = self._placed(job)
        self._log_path = job.log_path
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(self._num_threads), **job.env}
        log_file = job.log_path.open("ab", buffering=0)
        with job.log_path.open("ab") as stderr_file:
            process = subprocess.Popen(reaper.command(list(cmd)), stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=stderr_file, env=env,
                                       start_new_session=True)
        self._process = process
        announced: list[str] = []
        ready = threading.Event()
        threading.Thread(target=_copy_stdout, args=(process, log_file, announced, ready),
                         daemon=True).start()
        if job.announces_url:
            ready.wait(timeout_s)
            if not announced:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(5.0)  # stdout ended: it is exiting
                code = process.poll()
                self.stop(STOP_GRACE_S)
                what = (f"exited with {status_text(code)} during startup" if code is not None
                        else f"not ready within {timeout_s:g} s")
                return "failed", (f"{job.name} {what} (log {job.log_path} on {self._ip}):\n"
                                  f"{tail(job.log_path)}"), None, 0
            url = announced[0]
        else:
            url = f"http://{flag_value(cmd, '--host')}:{flag_value(cmd, '--port')}"
        return "ok", url, cmd, process.pid

    def _placed(self, job: ProcessSpec) -> tuple[str, ...]:
        """``job.cmd`` for this node: its IP as ``--host`` off the driver's node, and a port
        that is free here (a restart keeps its port when it can)."""
        host = "127.0.0.1" if self._same_node else self._ip
        cmd = with_flag(job.cmd, "--host", host)
        port = int(flag_value(cmd, "--port") or 0)
        if port and not _port_free(host, port):
            cmd = with_flag(cmd, "--port", "0" if job.announces_url else str(_free_port(host)))
        return cmd

    def wait(self, timeout_s: float) -> int | None:
        """The process's exit status, or None while it still runs after ``timeout_s``."""
        assert self._process is not None
        try:
            return self._process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the process group now."""
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signal.SIGKILL)

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM (the shim passes it on), SIGKILL to the group after ``grace_s``; the status."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace_s)
        self.kill()  # the group may outlive its leader
        return process.wait()

    def tail(self) -> str:
        """The end of the engine's log on this node."""
        return tail(self._log_path) if self._log_path is not None else ""


def _copy_stdout(process: subprocess.Popen[bytes], log_file: Any, announced: list[str],
                 ready: threading.Event) -> None:
    """Copies the engine's stdout into its log; notes the URL line; sets ``ready`` at the URL
    line or at EOF."""
    prefix = URL_PREFIX.encode()
    assert process.stdout is not None
    try:
        for line in process.stdout:
            log_file.write(line)
            if not announced and line.startswith(prefix):
                announced.append(line[len(prefix):].decode("utf-8", errors="replace").strip())
                ready.set()
    finally:
        ready.set()
        log_file.close()
        process.stdout.close()


@attrs.define(eq=False, kw_only=True)
class _RayProcess:
    """:class:`~relaxtrio.fleet.starter.EngineProcess` of an engine inside a Ray actor."""

    actor: Any
    url: str
    cmd: tuple[str, ...]
    node: str
    node_id: str
    log_path: Path
    remote_pgid: int
    pid: int | None = None
    returncode: int | None = None
    lost: str | None = None

    async def wait(self) -> int:
        while self.returncode is None:
            await trio.to_thread.run_sync(self._wait_chunk, abandon_on_cancel=True)
        return self.returncode

    def _wait_chunk(self) -> None:
        try:
            code = ray.get(self.actor.wait.remote(_WAIT_CHUNK_S),
                           timeout=_WAIT_CHUNK_S + _CALL_MARGIN_S)
        except ray.exceptions.GetTimeoutError:
            return
        except ray.exceptions.RayActorError as exc:
            self.lost = _first_line(exc)
            code = -signal.SIGKILL  # the shim took the engine's group down with the actor
        if code is not None and self.returncode is None:
            self.returncode = code

    def describe_exit(self) -> str:
        if self.lost is not None:
            return f"the loss of its Ray actor on node {self.node} ({self.lost})"
        return f"{status_text(self.returncode)} on node {self.node}"

    async def kill(self) -> None:
        await trio.to_thread.run_sync(self._call, "kill", ())

    async def stop(self) -> None:
        await trio.to_thread.run_sync(self._stop)

    def _stop(self) -> None:
        if self.lost is None:
            code = self._call("stop", (STOP_GRACE_S,), STOP_GRACE_S + _CALL_MARGIN_S)
            if isinstance(code, int) and self.returncode is None:
                self.returncode = code
        with contextlib.suppress(Exception):
            ray.kill(self.actor)
        if self.returncode is None:
            self.returncode = -signal.SIGKILL

    async def log_tail(self) -> str:
        text = await trio.to_thread.run_sync(self._call, "tail", ())
        if isinstance(text, str):
            return text
        return tail(self.log_path)  # the actor is gone: the file, if this node has it

    def _call(self, method: str, args: tuple[Any, ...], timeout_s: float = _CALL_MARGIN_S) -> Any:
        """One actor call; None when the actor is gone or silent."""
        try:
            return ray.get(getattr(self.actor, method).remote(*args), timeout=timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            log.debug("engine actor on %s: %s failed: %s", self.node, method, exc)
            return None


@attrs.define(eq=False, kw_only=True)
class RayEngineStarter:
    """Starts each launched engine in its own Ray actor (module docstring).

    Create with :meth:`connect` (blocking; call it from a worker thread).

    Attributes:
        num_cpus: CPUs each engine's actor reserves (``--engine-num-cpus``); the engine runs
            ``max(1, int(num_cpus))`` torch threads.
        driver_node_id: the Ray node id of the driver's node.
    """

    num_cpus: float
    driver_node_id: str

    @classmethod
    def connect(cls, address: str, *, num_cpus: float = 1.0) -> RayEngineStarter:
        """Joins the Ray cluster at ``address`` and returns a starter.

        Raises:
            ConfigError: no Ray cluster answers at ``address``.
        """
        connect(address)
        return cls(num_cpus=num_cpus, driver_node_id=ray.get_runtime_context().get_node_id())

    def detect_kind(self) -> str:
        """``sglang`` when this checkout has SGLang and the cluster has GPUs, else ``embedded``
        (blocking: asks Ray for the cluster's resources)."""
        gpus = ray.cluster_resources().get("GPU", 0)
        return "sglang" if gpus and importlib.util.find_spec("sglang") is not None else "embedded"

    async def start(self, job: ProcessSpec, *, timeout_s: float, nursery: trio.Nursery,
                    previous: EngineProcess | None = None) -> EngineProcess:
        """Starts ``job`` in an actor; returns once it announced its URL (see
        :meth:`relaxtrio.fleet.starter.EngineStarter.start`).

        Args:
            job: the engine's command line (its ``--host`` and port are fitted to the node).
            timeout_s: seconds for the actor to be placed and the engine to announce its URL.
            nursery: unused (the actor copies the engine's output into its log on its node).
            previous: the engine's last process: its actor is reused when alive, else the new
                actor prefers its node.

        Raises:
            BackendError: no node could take the actor, or the engine exited or announced no URL
                in time; the actor is killed.

        Cancellation:
            The actor (and so the engine's process group) is killed, shielded, before the
            Cancelled propagates.
        """
        if isinstance(previous, _RayProcess) and previous.lost is None:
            actor = previous.actor
        else:
            near = previous.node_id if isinstance(previous, _RayProcess) else None
            actor = await trio.to_thread.run_sync(self._new_actor, job.num_gpus, near)
        started = False
        try:
            outcome = await trio.to_thread.run_sync(self._start_in, actor, job, timeout_s,
                                                    abandon_on_cancel=True)
            started = True
        finally:
            if not started:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(_kill_actor, actor)
        if outcome[0] != "ok":
            await trio.to_thread.run_sync(_kill_actor, actor)
            raise BackendError(outcome[1])
        _, url, cmd, node_id, ip, pgid = outcome
        log.info("%s runs in a Ray actor on node %s (%s)%s, process group %d", job.name, ip,
                 node_id[:12], " (the driver's node)" if node_id == self.driver_node_id else "",
                 pgid)
        return _RayProcess(actor=actor, url=url, cmd=tuple(cmd), node=ip, node_id=node_id,
                           log_path=job.log_path, remote_pgid=pgid)

    def _new_actor(self, num_gpus: int, near: str | None) -> Any:
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": num_gpus}
        if near is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(near, soft=True)
        return _EngineActor.options(**options).remote(self.driver_node_id, self.num_cpus)

    @staticmethod
    def _start_in(actor: Any, job: ProcessSpec, timeout_s: float) -> tuple[Any, ...]:
        """``("ok", url, cmd, node id, ip, pgid)`` or ``("failed", message)``."""
        try:
            node_id, ip = ray.get(actor.where.remote(), timeout=timeout_s)
            kind, value, cmd, pgid = ray.get(actor.start.remote(job, timeout_s),
                                             timeout=timeout_s + _CALL_MARGIN_S)
        except ray.exceptions.GetTimeoutError:
            message = (f"{job.name}: no Ray node took its actor (num_gpus={job.num_gpus}) or "
                       f"it did not start within {timeout_s:g} s "
                       f"(available: {ray.available_resources()})")
            return "failed", message
        except ray.exceptions.RayActorError as exc:
            return "failed", f"{job.name}: its Ray actor died during startup ({_first_line(exc)})"
        if kind != "ok":
            return "failed", value
        return "ok", value, cmd, node_id, ip, pgid


def _kill_actor(actor: Any) -> None:
    """Kills ``actor`` (errors ignored); the reaper shim of an engine it started sees its parent
    go and takes the engine's group down (SIGTERM, SIGKILL after the shim's grace)."""
    with contextlib.suppress(Exception):
        ray.kill(actor)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
