"""How a launched engine's process is started: the interface, and the local starter.

:func:`~relaxtrio.fleet.launch_fleet.open_launched_fleet` builds each engine's command line
(:class:`ProcessSpec`) and hands it to an :class:`EngineStarter`, which starts the process
somewhere and returns an :class:`EngineProcess`: the engine's base URL, its exit, and a way to
stop it. Everything above that (readiness on ``/health``, the gateway, fleet membership,
supervision and restarts, weight pushes) only sees URLs, so it is the same wherever the
process runs.

- :class:`LocalStarter` (the default) runs the process on this machine under
  :mod:`relaxtrio._reaper`, as the leader of its own process group, with its log in
  ``job.log_path``;
- :class:`relaxtrio.cluster.engines.RayEngineStarter` runs it inside a Ray actor on a node with
  the engine's GPUs and CPUs free (``--ray-address``; this package never imports Ray).

An embedded engine (``announces_url``) starts on ``--port 0`` and prints
``RELAXTRIO_ENGINE_URL=<url>``; the starter reads that line. An SGLang server is given its
``--host``/``--port`` and its URL is built from them.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final, Protocol

import attrs
import trio

from .. import _reaper as reaper
from .._errors import BackendError
from .embedded import _copy_to_log, _read_url

__all__ = ["EngineProcess", "EngineStarter", "LocalStarter", "ProcessSpec", "flag_value",
           "status_text", "tail", "with_flag"]

STOP_GRACE_S: Final = 10.0
"""Seconds between SIGTERM to a process group and SIGKILL."""


def tail(path: Path, num_bytes: int = 3000) -> str:
    """The last ``num_bytes`` of a log file ("" when it cannot be read)."""
    try:
        return path.read_bytes()[-num_bytes:].decode("utf-8", errors="replace")
    except OSError:
        return ""


def status_text(code: int | None) -> str:
    """``code 137 (killed by SIGKILL)``: a signal death (``-N``) is shown as a shell shows it."""
    if code is None:
        return "still running"
    code = 128 - code if code < 0 else code
    signum = code - 128
    if signum > 0 and signum in signal.Signals._value2member_map_:
        return f"code {code} (killed by {signal.Signals(signum).name})"
    return f"code {code}"


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    """attrs converter with a type mypy can read (``converter=tuple`` infers none)."""
    return tuple(value)


def flag_value(cmd: tuple[str, ...] | list[str], flag: str) -> str | None:
    """The value after ``flag`` in ``cmd`` (None when absent)."""
    try:
        return cmd[cmd.index(flag) + 1]
    except (ValueError, IndexError):
        return None


def with_flag(cmd: tuple[str, ...], flag: str, value: str) -> tuple[str, ...]:
    """``cmd`` with the value after ``flag`` replaced (``flag`` must be present)."""
    out = list(cmd)
    out[out.index(flag) + 1] = value
    return tuple(out)


@attrs.frozen(kw_only=True)
class ProcessSpec:
    """One engine process to start.

    Attributes:
        name: for logs and errors (``"engine 0"``).
        cmd: the command line; it has ``--host`` and ``--port`` flags.
        log_path: the log file (stderr, and stdout copied), on the node the process runs on.
        env: variables added to the starter's environment (``OMP_NUM_THREADS``, a local
            SGLang engine's ``CUDA_VISIBLE_DEVICES``).
        announces_url: it prints ``RELAXTRIO_ENGINE_URL=<url>`` once it serves (the embedded
            engine); otherwise its URL is ``http://<--host>:<--port>``.
        num_gpus: GPUs the engine uses (a Ray starter reserves them; 0 on CPU).
    """

    name: str
    cmd: tuple[str, ...] = attrs.field(converter=_str_tuple)
    log_path: Path
    env: Mapping[str, str] = attrs.field(factory=dict)
    announces_url: bool = False
    num_gpus: int = 0


class EngineProcess(Protocol):
    """A started engine process, wherever it runs.

    Attributes:
        url: its base URL (reachable from the driver).
        cmd: the command line it was started with (a restart reuses it, port included).
        node: where it runs, for logs (``"local"``, or a Ray node's IP).
        pid: its local process-group id, or None when it runs elsewhere.
        returncode: its exit status once known (negative: killed by that signal), else None.
    """

    url: str
    cmd: tuple[str, ...]
    node: str

    @property
    def pid(self) -> int | None: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int:
        """Waits for the process to exit; returns its status.

        Cancellation:
            A checkpoint; the process is not affected.
        """
        ...

    def describe_exit(self) -> str:
        """How it ended, for logs (``code 137 (killed by SIGKILL)``, or its actor's loss)."""
        ...

    async def kill(self) -> None:
        """SIGKILL its process group now (a removed engine that still runs).

        Cancellation:
            A checkpoint.
        """
        ...

    async def stop(self) -> None:
        """SIGTERM to its group, SIGKILL after :data:`STOP_GRACE_S`; waits; idempotent.

        Cancellation:
            Callers shield it.
        """
        ...

    async def log_tail(self) -> str:
        """The end of its log ("" when it cannot be read from here).

        Cancellation:
            A checkpoint.
        """
        ...


class EngineStarter(Protocol):
    """Starts engine processes (see the module docstring)."""

    async def start(self, job: ProcessSpec, *, timeout_s: float, nursery: trio.Nursery,
                    previous: EngineProcess | None = None) -> EngineProcess:
        """Starts ``job`` and returns once its URL is known (not yet healthy).

        Args:
            job: what to run.
            timeout_s: seconds the URL may take (an embedded engine loads its model first).
            nursery: where tasks that live as long as the process run (its stdout copier).
            previous: the process this one replaces (a restart), or None.

        Raises:
            BackendError: it exited, or announced no URL, within ``timeout_s`` (the message has
                its log tail); nothing of it is left running.

        Cancellation:
            Whatever was started is stopped (shielded) before the Cancelled propagates.
        """
        ...


@attrs.define(eq=False, kw_only=True)
class _LocalProcess:
    """:class:`EngineProcess` of a process on this machine."""

    process: trio.Process
    url: str
    cmd: tuple[str, ...]
    log_path: Path
    node: str = "local"

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    async def wait(self) -> int:
        return await self.process.wait()

    def describe_exit(self) -> str:
        return status_text(self.process.returncode)

    async def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    async def stop(self) -> None:
        await stop_process(self.process)

    async def log_tail(self) -> str:
        return tail(self.log_path)


async def stop_process(process: trio.Process) -> None:
    """SIGTERM (the reaper shim passes it on), SIGKILL to the group after the grace period.

    Cancellation:
        Callers shield it.
    """
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    with trio.move_on_after(STOP_GRACE_S):
        await process.wait()
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the group may outlive its leader
    except (ProcessLookupError, PermissionError):
        pass
    await process.wait()


async def _pump(stdout: trio.abc.ReceiveStream, log_file: Any) -> None:
    """Copy a process's stdout into its log until EOF; then close both."""
    try:
        await _copy_to_log(stdout, log_file.write)
    finally:
        with trio.CancelScope(shield=True):
            await log_file.aclose()
            await stdout.aclose()


@attrs.define(eq=False)
class LocalStarter:
    """Starts engines as processes on this machine (the default :class:`EngineStarter`).

    Stdout goes through a pipe (copied into the log by a task in the caller's nursery, so the
    embedded engine's URL line is an event, not a poll), stderr straight into the log.
    """

    async def start(self, job: ProcessSpec, *, timeout_s: float, nursery: trio.Nursery,
                    previous: EngineProcess | None = None) -> EngineProcess:
        """See :meth:`EngineStarter.start`.

        Raises:
            BackendError: as :meth:`EngineStarter.start`.

        Cancellation:
            As :meth:`EngineStarter.start`.
        """
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, **job.env) if job.env else None
        with job.log_path.open("ab") as stderr_file:
            process = await trio.lowlevel.open_process(
                reaper.command(list(job.cmd)), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=stderr_file, env=env, start_new_session=True,
            )
        assert process.stdout is not None
        log_file = await trio.open_file(job.log_path, "ab", buffering=0)
        pumping = False
        try:
            if job.announces_url:
                url = await _wait_url_line(job, process, log_file, timeout_s)
            else:
                url = f"http://{flag_value(job.cmd, '--host')}:{flag_value(job.cmd, '--port')}"
            nursery.start_soon(_pump, process.stdout, log_file)
            pumping = True
        finally:
            if not pumping:
                with trio.CancelScope(shield=True):
                    await log_file.aclose()
                    await stop_process(process)
        return _LocalProcess(process=process, url=url, cmd=job.cmd, log_path=job.log_path)


async def _wait_url_line(job: ProcessSpec, process: trio.Process, log_file: Any,
                         timeout_s: float) -> str:
    """The embedded engine's URL line, read from its stdout pipe (copied into the log)."""
    assert process.stdout is not None
    with trio.move_on_after(timeout_s):
        url = await _read_url(process.stdout, log_file.write)
        if url is not None:
            return url
        await process.wait()  # stdout closed without the line: it is exiting
        raise BackendError(f"{job.name} exited with {status_text(process.returncode)} "
                           f"during startup (log {job.log_path}):\n{tail(job.log_path)}")
    raise BackendError(f"{job.name} not ready within {timeout_s:g} s (log {job.log_path}):\n"
                       f"{tail(job.log_path)}")
