"""The embedded engine as a subprocess: the URL line on its stdout is the readiness event, a
failed start raises with its log tail, and a death while in use stops the caller loudly."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio

from relaxtrio import BackendError, _reaper
from relaxtrio.fleet.embedded import URL_PREFIX, open_embedded_engine

pytestmark = pytest.mark.slow  # starts real processes


def _engine_pids(model_dir: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (b"relaxtrio.engine" in cmdline and str(model_dir).encode() in cmdline
                    and _reaper.SCRIPT.encode() not in cmdline):  # the engine, not its shim
                pids.append(int(entry.name))
    return pids


async def test_engine_death_cancels_the_body_with_a_clear_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    reached_end = False
    log_path = tmp_path / "engine.log"
    others = set(_engine_pids(tiny_model_dir))  # e.g. a session-scoped engine of other tests
    with trio.fail_after(120), pytest.RaisesGroup(
        pytest.RaisesExc(BackendError, match="the embedded engine exited unexpectedly with code -9")
    ):
        async with open_embedded_engine(tiny_model_dir, log_path=log_path) as url:
            assert url.startswith("http://127.0.0.1:")
            assert f"{URL_PREFIX}{url}\n" in log_path.read_text()  # stdout is copied to the log
            [pid] = set(_engine_pids(tiny_model_dir)) - others
            os.kill(pid, signal.SIGKILL)
            await trio.sleep_forever()  # the engine's exit cancels this (fail_after catches a hang)
            reached_end = True
    assert not reached_end
    assert set(_engine_pids(tiny_model_dir)) - others == set()


async def test_engine_that_cannot_start_raises_with_its_log_tail(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    log_path = tmp_path / "engine.log"
    with trio.fail_after(120), pytest.raises(BackendError, match="during startup") as info:
        async with open_embedded_engine(missing, log_path=log_path):
            raise AssertionError("an engine without a model never becomes ready")
    assert "Traceback" in log_path.read_text()  # the engine's stderr goes to the log file
    assert "Traceback" in str(info.value)  # and its tail into the error
    assert _engine_pids(missing) == []
