"""The reaper shim: it ends the way its command ended, and nothing under it outlives the driver.

Real processes on the real clock: each wait is for something to happen (a process to be gone),
bounded by a deadline that only a hang reaches.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.support.procs import alive
from tests.support.waits import wait_until_sync

from relaxtrio import _reaper, shm_weights

pytestmark = pytest.mark.slow  # starts real processes

DEADLINE_S = 30.0


def wait_gone(*pids: int) -> None:
    gone = wait_until_sync(lambda: not any(alive(p) for p in pids), timeout_s=DEADLINE_S, what="exits")
    assert gone, [p for p in pids if alive(p)]


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def run_shimmed(script: str) -> int:
    return subprocess.run(_reaper.command(["bash", "-c", script]), start_new_session=True,
                          timeout=DEADLINE_S).returncode


@pytest.mark.parametrize(("script", "status"), [
    ("exit 0", 0),
    ("exit 3", 3),
    ("kill -KILL $$", -signal.SIGKILL),
    ("kill -TERM $$", -signal.SIGTERM),
])
def test_the_shim_ends_the_way_its_command_ended(script: str, status: int) -> None:
    assert run_shimmed(script) == status


def test_a_shim_whose_launcher_is_gone_starts_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    argv = _reaper.command(["touch", str(marker)], parent=os.getpid())
    # Started by a child of ours, the shim's parent is not the pid it was told to watch.
    done = subprocess.run(["sh", "-c", '"$@"; exit $?', "sh", *argv], timeout=DEADLINE_S)
    assert done.returncode == 1
    assert not marker.exists()


def test_the_command_dies_with_a_sigkilled_shim() -> None:
    shim = subprocess.Popen(_reaper.command(["sleep", "3600"]), start_new_session=True)
    try:
        assert wait_until_sync(lambda: children(shim.pid), timeout_s=DEADLINE_S, what="the shim's command")
        [sleeper] = children(shim.pid)
        shim.kill()  # only the shim: its command is killed by the kernel (PR_SET_PDEATHSIG)
        shim.wait()
        wait_gone(sleeper)
    finally:
        try:
            os.killpg(shim.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


_DRIVER = textwrap.dedent("""
    import json, subprocess, sys, time
    from relaxtrio import _reaper
    shims = [subprocess.Popen(_reaper.command(["bash", "-c", "sleep 3600 & sleep 3600; wait"]),
                              start_new_session=True) for _ in range(2)]
    print(json.dumps([s.pid for s in shims]), flush=True)
    time.sleep(3600)
""")


def test_the_shim_knows_the_mailbox_prefix_of_shm_weights() -> None:
    assert _reaper.SHM_MAILBOX_PREFIX == shm_weights._PREFIX


def test_a_sigkilled_driver_takes_every_shimmed_group_down(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER], stdout=subprocess.PIPE, env=env)
    try:
        assert driver.stdout is not None
        shims = json.loads(driver.stdout.readline())
        under: list[int] = []
        grandchildren: list[int] = []

        def started() -> bool:  # each shim runs bash, and bash its two sleeps
            under[:] = [pid for shim in shims for pid in children(shim)]
            grandchildren[:] = [pid for pid in under for pid in children(pid)]
            return len(under) == 2 and len(grandchildren) == 4

        assert wait_until_sync(started, timeout_s=DEADLINE_S, what="two bash commands and their sleeps")
        # The driver's weight mailbox (named after its pid) must not outlive it in RAM.
        mailbox = _reaper.SHM_ROOT / f"{_reaper.SHM_MAILBOX_PREFIX}{driver.pid}-test"
        mailbox.mkdir()
        (mailbox / "weights.bin").write_bytes(b"\0" * 4096)
        other = _reaper.SHM_ROOT / f"{_reaper.SHM_MAILBOX_PREFIX}{os.getpid()}-test"  # alive
        other.mkdir()
        driver.kill()
        driver.wait()
        wait_gone(*shims, *under, *grandchildren)
        assert not mailbox.exists() and other.exists()
    finally:
        for path in _reaper.SHM_ROOT.glob(f"{_reaper.SHM_MAILBOX_PREFIX}*-test"):
            shutil.rmtree(path, ignore_errors=True)
        driver.kill()
        driver.wait()
        if driver.stdout is not None:
            driver.stdout.close()
