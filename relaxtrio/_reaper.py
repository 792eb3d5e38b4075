"""``python -S -P relaxtrio/_reaper.py --parent PID -- CMD``: run CMD, never let it outlive PID.

Every process relaxtrio launches (each engine, the gateway, each agent) runs under this shim,
started as the leader of a new process group (``start_new_session``); CMD and whatever it spawns
(SGLang's scheduler and detokenizer processes, an agent's tools) stay in that group. The shim

- waits for CMD and ends the way CMD ended: the same exit code, or killed by the same signal (so
  the launcher sees what it would have seen without the shim), after sending SIGTERM to what is
  left of the group;
- forwards SIGTERM and SIGINT to CMD;
- checks every :data:`POLL_S` seconds whether its parent is still ``PID`` (the driver that
  launched it; the caller's pid is passed rather than read at start, so a driver that died before
  the shim looked is noticed too). When the parent is gone, even SIGKILLed so that none of its
  cleanup ran, the shim sends the group SIGTERM, waits up to :data:`GRACE_S` seconds for CMD to
  exit, removes the dead driver's shared-memory weight mailboxes (``/dev/shm`` directories named
  after its pid, see :mod:`relaxtrio.shm_weights`: they would hold the model's size in RAM until
  the next run), then SIGKILLs the whole group, itself included;
- makes CMD receive SIGKILL when the shim itself dies (Linux ``PR_SET_PDEATHSIG``, set in CMD
  right after the fork). The shim is single-threaded, so that signal is tied to the shim's life;
  it is not set between the driver and the shim because trio forks from a worker thread, and the
  kernel sends the signal when the forking *thread* exits.

The driver stops a launched process by signalling its group (SIGTERM, later SIGKILL), so nothing
is left behind in any of these cases. Plain Python, standard library only; it runs as a script
under ``python -S -P`` (no site-packages, nothing of relaxtrio imported), so it starts in a few tens
of milliseconds on an idle machine.
"""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

POLL_S: Final = 0.5
GRACE_S: Final = 10.0
_PR_SET_PDEATHSIG: Final = 1
SHM_ROOT: Final = Path("/dev/shm")
SHM_MAILBOX_PREFIX: Final = "relaxtrio-weights-"  # relaxtrio.shm_weights._PREFIX (not imported)


SCRIPT: Final = os.path.abspath(__file__)
"""This file: a shim's argv holds it (tests tell a shim from the process under it that way)."""


def command(cmd: Sequence[str], *, parent: int | None = None) -> list[str]:
    """The argv that runs ``cmd`` under the shim, watching ``parent`` (default: this process)."""
    return [sys.executable, "-S", "-P", SCRIPT, "--parent",
            str(os.getpid() if parent is None else parent), "--", *cmd]


def _die_with_shim(shim_pid: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` giving CMD SIGKILL when the shim dies (None where prctl is missing)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != shim_pid:  # the shim died before prctl took effect
            os._exit(1)

    return preexec


def _end_like(code: int) -> int:
    """Return ``code`` as the shim's status; a signal death (``-N``) is re-raised on the shim."""
    if code >= 0:
        return code
    signum = -code
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file of the shim
    except (OSError, ValueError):
        pass
    if signum not in (signal.SIGKILL, signal.SIGSTOP):  # these two have no handler to reset
        try:
            signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        except (OSError, ValueError):
            return 128 + signum
    os.kill(os.getpid(), signum)
    return 128 + signum  # a signal that does not kill (or could not be re-raised)


def remove_mailboxes(driver_pid: int, root: Path = SHM_ROOT) -> None:
    """Remove the weight mailboxes of ``driver_pid`` (``<prefix><pid>-*`` under ``root``)."""
    for path in root.glob(f"{SHM_MAILBOX_PREFIX}{driver_pid}-*"):
        shutil.rmtree(path, ignore_errors=True)


def _kill_group(signum: int) -> None:
    """Signal the shim's process group, only when the shim leads it (never the caller's)."""
    if os.getpgrp() != os.getpid():
        return
    try:
        os.killpg(0, signum)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    """Run the command in ``argv`` (``[--parent PID] [--] CMD ...``); returns the exit status."""
    parent = os.getppid()
    if len(argv) >= 2 and argv[0] == "--parent":
        parent = int(argv[1])
        argv = argv[2:]
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("usage: python -S _reaper.py [--parent PID] -- CMD ...", file=sys.stderr)
        return 2
    if os.getppid() != parent:
        return 1  # the launcher is already gone: do not start CMD at all
    child = subprocess.Popen(argv, preexec_fn=_die_with_shim(os.getpid()))  # noqa: PLW1509

    def forward(signum: int, frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            code = child.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent:  # reparented: the launcher died without stopping us
            _kill_group(signal.SIGTERM)  # CMD and what it spawned (the shim forwards it too)
            child.terminate()
            try:
                child.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            remove_mailboxes(parent)  # its engines (this CMD among them) have stopped reading
            _kill_group(signal.SIGKILL)
            child.kill()  # not a group leader: at least CMD goes
            return 1
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _kill_group(signal.SIGTERM)  # leftovers of CMD (its own children)
    return _end_like(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
