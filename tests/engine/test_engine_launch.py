"""The embedded engine as a subprocess: a death while in use stops the caller loudly."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio

from relaxtrio import BackendError
from relaxtrio.sglang.launch import open_embedded_engine


def _engine_pids(model_dir: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"relaxtrio.engine" in cmdline and str(model_dir).encode() in cmdline:
                pids.append(int(entry.name))
    return pids


async def test_engine_death_cancels_the_body_with_a_clear_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    reached_end = False
    with trio.fail_after(120), pytest.RaisesGroup(
        pytest.RaisesExc(BackendError, match="the embedded engine exited unexpectedly with code -9")
    ):
        async with open_embedded_engine(tiny_model_dir, log_path=tmp_path / "engine.log"):
            [pid] = _engine_pids(tiny_model_dir)
            os.kill(pid, signal.SIGKILL)
            await trio.sleep(60)
            reached_end = True
    assert not reached_end
    assert _engine_pids(tiny_model_dir) == []
