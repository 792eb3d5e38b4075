"""Fixtures of the serve tests: one embedded engine process for the tests that only need an
engine to talk to (``python -m relaxtrio serve --engine-url``), started once per test session.

Starting an engine is a real process start (Python, torch, transformers, the model): seconds on
an idle machine, minutes on a loaded 2-core one. Sharing it keeps that cost out of each test's own
time budget; its start-up gets a budget of its own, :data:`ENGINE_START_S`.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from relaxtrio import _reaper

ENGINE_START_S: Final = 600.0
"""Wall seconds for the engine's ready line (as long as ``open_embedded_engine`` waits)."""

ENGINE_STOP_S: Final = 30.0
"""Wall seconds for the engine to exit after SIGTERM before its process group is SIGKILLed."""

_READY: Final = "RELAXTRIO_ENGINE_URL="


def _tail(path: Path, num_bytes: int = 4000) -> str:
    return path.read_bytes()[-num_bytes:].decode(errors="replace") if path.exists() else ""


@pytest.fixture(scope="session")
def shared_engine_url(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of ``python -m relaxtrio.engine`` serving the tiny model (SGLang's native API).

    The process runs under relaxtrio's reaper shim in a process group of its own, so it cannot
    outlive the test run; it is stopped (SIGTERM, then SIGKILL) when the session ends.
    """
    log_path = tmp_path_factory.mktemp("shared-engine") / "engine.log"
    cmd = [sys.executable, "-m", "relaxtrio.engine", "--model", str(tiny_model_dir), "--host", "127.0.0.1",
           "--port", "0"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(_reaper.command(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=log_file, env=env, start_new_session=True, text=True)
    assert process.stdout is not None
    lines: queue.Queue[str] = queue.Queue()

    def read_stdout() -> None:  # the engine's stdout: the ready line, then nothing until it exits
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put("")

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    try:
        try:
            line = lines.get(timeout=ENGINE_START_S)
        except queue.Empty:
            line = ""
        if not line.startswith(_READY):
            raise RuntimeError(f"the shared engine did not start within {ENGINE_START_S:g} s "
                               f"(exit code {process.poll()}); its log:\n{_tail(log_path)}")
        yield line.strip().removeprefix(_READY)
    finally:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(ENGINE_STOP_S)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        reader.join(ENGINE_STOP_S)
        process.stdout.close()
