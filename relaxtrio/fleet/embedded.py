"""One embedded CPU engine as a child process (``python -m relaxtrio.engine``), without a fleet.

A fleet launches its engines through :class:`~relaxtrio.fleet.starter.LocalStarter`, which reads
the engine's URL line with this module's reader; :func:`open_embedded_engine` is the stand-alone
form, for tests and benchmarks that need one engine process and no fleet. The engine prints
``RELAXTRIO_ENGINE_URL=<url>`` on stdout once it serves; the launcher reads that pipe (the line
is the readiness event, no polling) and copies everything the engine writes on stdout into the
log file, where its stderr (logging, tracebacks) goes directly. The process's exit is the other
event: before the URL line it is a startup failure, afterwards an engine death that stops the
caller.

The engine runs under :mod:`relaxtrio._reaper` as the leader of its own process group: stopping
signals the group, and a driver that dies without cleaning up (SIGKILL) still takes the engine
down. The shim ends the way the engine ended, so the exit status seen here is the engine's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import attrs
import trio

from .. import _reaper as reaper
from .._errors import BackendError

URL_PREFIX: Final = "RELAXTRIO_ENGINE_URL="
STOP_GRACE_S: Final = 10.0

_Write = Callable[[bytes], Awaitable[object]]  # appends bytes to the engine's log file


def _tail(path: Path, num_bytes: int = 4096) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-num_bytes:].decode("utf-8", errors="replace")


def _fresh_log(log_path: Path | None) -> Path:
    """An empty log file (a temp file when ``log_path`` is None)."""
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="relaxtrio-engine-", suffix=".log")
        os.close(fd)
        return Path(name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_bytes(b"")
    return log_path


async def _read_url(stdout: trio.abc.ReceiveStream, write_log: _Write) -> str | None:
    """Copies ``stdout`` into the log until the URL line; returns the URL, or None at EOF.

    Cancellation:
        A checkpoint; what was read so far is in the log.
    """
    prefix = URL_PREFIX.encode()
    pending = b""
    async for raw in stdout:
        chunk = bytes(raw)
        await write_log(chunk)
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.startswith(prefix):
                return line[len(prefix):].decode("utf-8", errors="replace").strip()
    return None


async def _copy_to_log(stdout: trio.abc.ReceiveStream, write_log: _Write) -> None:
    """Copies the rest of ``stdout`` into the log until EOF (so the pipe never fills up)."""
    async for chunk in stdout:
        await write_log(bytes(chunk))


@attrs.define(eq=False)
class _EngineProcess:
    """One launched engine: its process, its log and whether we are stopping it."""

    process: trio.Process
    log_path: Path
    stopping: bool = False

    async def wait_ready(self, write_log: _Write, startup_timeout_s: float) -> str:
        """Waits for the URL line on stdout and returns the URL.

        Raises:
            BackendError: the engine exited, or printed no URL within ``startup_timeout_s``.

        Cancellation:
            A checkpoint; the caller stops the process.
        """
        assert self.process.stdout is not None
        with trio.move_on_after(startup_timeout_s):
            url = await _read_url(self.process.stdout, write_log)
            if url is not None:
                return url
            await self.process.wait()  # stdout closed without a URL: the engine is exiting
            raise BackendError(
                f"engine exited with code {self.process.returncode} during startup:\n"
                f"{_tail(self.log_path)}"
            )
        raise BackendError(f"engine not ready after {startup_timeout_s:g} s:\n{_tail(self.log_path)}")

    async def watch(self) -> None:
        """Returns when the engine exits while being stopped; raises if it exits on its own.

        Raises:
            BackendError: the engine died while in use (the message has its log tail).
        """
        await self.process.wait()
        if not self.stopping:
            raise BackendError(
                f"the embedded engine exited unexpectedly with code {self.process.returncode} "
                f"(log: {self.log_path}):\n{_tail(self.log_path)}"
            )

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL to the group after :data:`STOP_GRACE_S`; shielded, idempotent."""
        self.stopping = True
        with trio.CancelScope(shield=True):
            if self.process.returncode is None:
                self.process.send_signal(signal.SIGTERM)
                with trio.move_on_after(STOP_GRACE_S):
                    await self.process.wait()
                if self.process.returncode is None:
                    try:
                        os.killpg(self.process.pid, signal.SIGKILL)  # the shim and the engine
                    except ProcessLookupError:
                        pass
                    await self.process.wait()


@asynccontextmanager
async def open_embedded_engine(
    model_path: Path,
    *,
    log_path: Path | None = None,
    extra_args: Sequence[str] = (),
    startup_timeout_s: float = 600.0,
) -> AsyncIterator[str]:
    """Starts ``python -m relaxtrio.engine`` on 127.0.0.1 (free port) and yields its base URL.

    Args:
        model_path: HF model directory to serve.
        log_path: where the engine's stderr and stdout go (default: a temp file).
        extra_args: more engine flags (e.g. ``["--max-running-requests", "16"]``).
        startup_timeout_s: how long to wait for the ready line, in seconds.

    Raises:
        BackendError: the engine exited or did not become ready in time, or it died while in use
            (the body is cancelled and this error propagates; the message has its log tail).

    Cancellation:
        On exit (normal, error or cancel) the engine gets SIGTERM, then SIGKILL after 10 s; the
        shutdown is shielded.
    """
    log_path = _fresh_log(log_path)
    cmd = [sys.executable, "-m", "relaxtrio.engine", "--model", str(model_path),
           "--host", "127.0.0.1", "--port", "0", *extra_args]
    with log_path.open("ab") as stderr_file:  # append: our stdout copies share the file
        process = await trio.lowlevel.open_process(
            reaper.command(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=stderr_file, start_new_session=True,
        )
    assert process.stdout is not None
    engine = _EngineProcess(process=process, log_path=log_path)
    try:
        async with await trio.open_file(log_path, "ab", buffering=0) as log:
            url = await engine.wait_ready(log.write, startup_timeout_s)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_copy_to_log, process.stdout, log.write)
                nursery.start_soon(engine.watch)
                try:
                    yield url
                finally:
                    await engine.stop()  # stdout is still drained while the engine shuts down
                    nursery.cancel_scope.cancel()
    finally:
        await engine.stop()
        with trio.CancelScope(shield=True):
            await process.stdout.aclose()
