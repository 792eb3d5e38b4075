"""Starting the embedded CPU engine as a separate process (``python -m relaxtrio.engine``).

The driver uses this when no SGLang URL is configured. The engine prints
``RELAXTRIO_ENGINE_URL=<url>`` when it is ready; its stdout and stderr go to a log file, which is
polled for that line (no pipe to drain).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import trio

from .._errors import BackendError

URL_PREFIX: Final = "RELAXTRIO_ENGINE_URL="
_POLL_S: Final = 0.1
STOP_GRACE_S: Final = 10.0


def _tail(path: Path, num_bytes: int = 4096) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-num_bytes:].decode("utf-8", errors="replace")


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
        log_path: where the engine's stdout/stderr go (default: a temp file).
        extra_args: more engine flags (e.g. ``["--max-running-requests", "16"]``).
        startup_timeout_s: how long to wait for the ready line, in seconds.

    Raises:
        BackendError: the engine exited or did not become ready in time, or it died while in use
            (the body is cancelled and this error propagates; the message has its log tail).

    Cancellation:
        On exit (normal, error or cancel) the engine gets SIGTERM, then SIGKILL after 10 s; the
        shutdown is shielded.
    """
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="relaxtrio-engine-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "relaxtrio.engine", "--model", str(model_path),
           "--host", "127.0.0.1", "--port", "0", *extra_args]
    with log_path.open("wb") as log_file:
        process = await trio.lowlevel.open_process(
            cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT
        )
    stopping = False
    try:
        url = await _wait_ready(process, log_path, startup_timeout_s)
        async with trio.open_nursery() as nursery:
            async def watch() -> None:
                await process.wait()
                if not stopping:
                    raise BackendError(
                        f"the embedded engine exited unexpectedly with code {process.returncode} "
                        f"(log: {log_path}):\n{_tail(log_path)}"
                    )

            nursery.start_soon(watch)
            try:
                yield url
            finally:
                stopping = True
                nursery.cancel_scope.cancel()
    finally:
        stopping = True
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                with trio.move_on_after(STOP_GRACE_S):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()


async def _wait_ready(process: trio.Process, log_path: Path, startup_timeout_s: float) -> str:
    with trio.move_on_after(startup_timeout_s):
        while True:
            for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith(URL_PREFIX):
                    return line[len(URL_PREFIX):].strip()
            if process.poll() is not None:
                raise BackendError(
                    f"engine exited with code {process.returncode} during startup:\n{_tail(log_path)}"
                )
            await trio.sleep(_POLL_S)
    raise BackendError(f"engine not ready after {startup_timeout_s:g} s:\n{_tail(log_path)}")
