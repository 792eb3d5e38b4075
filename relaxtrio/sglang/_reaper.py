"""``python -m relaxtrio.sglang._reaper -- CMD ...``: run CMD and never let it outlive the parent.

The launcher starts every engine and the gateway through this shim, as the leader of a new
process group (``start_new_session``); CMD and whatever it spawns (SGLang's scheduler and
detokenizer processes) stay in that group. The shim

- waits for CMD and exits with its status (a signal death ``-N`` becomes ``128 + N``), after
  sending SIGTERM to what is left of the group;
- forwards SIGTERM and SIGINT to CMD;
- checks every :data:`POLL_S` seconds whether its parent (the driver) is still alive; when the
  parent is gone (even SIGKILLed, so none of its cleanup ran), it sends CMD SIGTERM, waits up to
  :data:`GRACE_S`, then SIGKILLs the whole group, itself included.

The driver stops a launched process by signalling the group (SIGTERM, later SIGKILL), so nothing
is left behind in any of these cases. Plain Python, no imports beyond the standard library.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Final

POLL_S: Final = 0.5
GRACE_S: Final = 10.0


def _status(code: int) -> int:
    return 128 - code if code < 0 else code


def main(argv: list[str]) -> int:
    """Run ``argv`` (after an optional ``--``) under the shim; returns the exit status."""
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("usage: python -m relaxtrio.sglang._reaper -- CMD ...", file=sys.stderr)
        return 2
    parent = os.getppid()
    child = subprocess.Popen(argv)

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
        if os.getppid() != parent:  # reparented: the driver died without stopping us
            child.terminate()
            try:
                child.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            os.killpg(0, signal.SIGKILL)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.killpg(0, signal.SIGTERM)  # leftovers of CMD (its own children)
    except OSError:
        pass
    return _status(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
