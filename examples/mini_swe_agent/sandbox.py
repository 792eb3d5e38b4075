"""The bubblewrap sandbox every command of a task runs in (the model's commands and the reward test).

One namespace set per command (``bwrap --unshare-all``): no network (a fresh network namespace with
only a down loopback), its own pid, ipc, uts and user namespaces; the system directories are bound
read-only, ``/tmp`` is a private tmpfs, and the task's workspace is the only writable host path.
Nothing else of the host (home directories, the server's state, other tasks' workspaces) is visible.

The same argument list configures mini-swe-agent's ``bubblewrap`` environment class (which appends
``--bind <cwd> <cwd> --chdir <cwd>`` and the command), so the agent's commands and the reward test
run under one policy.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"


def bwrap_executable() -> str:
    """The ``bwrap`` binary; raises RuntimeError when bubblewrap is not installed."""
    found = shutil.which("bwrap")
    if found is None:
        raise RuntimeError("bubblewrap is not installed (scripts/install_sandbox.sh installs it)")
    return found


def wrapper_args() -> list[str]:
    """bwrap's arguments before the workspace bind: namespaces, read-only system, private /tmp."""
    args = ["--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
            "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    # Merged-/usr systems have /bin, /lib... as symlinks into /usr; others have real directories.
    for top in ("bin", "sbin", "lib", "lib32", "lib64"):
        path = Path("/") / top
        if path.is_symlink():
            args += ["--symlink", str(path.readlink()), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    args += ["--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev",
             "--setenv", "PATH", SANDBOX_PATH, "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8"]
    return args


def sandbox_argv(workspace: Path, command: str) -> list[str]:
    """The full argv running ``bash -c command`` in the sandbox with ``workspace`` writable and as cwd."""
    ws = str(workspace.resolve())
    return [bwrap_executable(), *wrapper_args(), "--bind", ws, ws, "--chdir", ws, "bash", "-c", command]


def run_in_sandbox(workspace: Path, command: str, *, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Runs ``command`` in the sandbox; stdout and stderr together in ``.stdout``.

    Raises:
        subprocess.TimeoutExpired: the command ran longer than ``timeout_s`` (bwrap's
            ``--die-with-parent`` takes the sandboxed processes down with it).
    """
    return subprocess.run(sandbox_argv(workspace, command), capture_output=False, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          timeout=timeout_s, check=False)
