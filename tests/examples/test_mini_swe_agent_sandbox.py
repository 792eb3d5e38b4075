"""examples/mini_swe_agent/sandbox.py and the agent server's request checks.

The sandbox is what keeps the model's shell commands off the host: a command gets its workspace
writable and nothing else (read-only system, private /tmp, no other host path, no network).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import sys
from pathlib import Path
from types import ModuleType

import pytest
from tests.support.examples import EXAMPLES

DIR = EXAMPLES / "mini_swe_agent"


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(DIR))
    try:
        found = importlib.util.spec_from_file_location(f"mswea_{name}", DIR / f"{name}.py")
        assert found is not None and found.loader is not None
        module = importlib.util.module_from_spec(found)
        found.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(DIR))


sandbox = _load("sandbox")
# CI sets RELAXTRIO_REQUIRE_SANDBOX=1 (.ci/run): there a missing bwrap fails instead of skipping.
no_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None and os.environ.get("RELAXTRIO_REQUIRE_SANDBOX") != "1",
    reason="bubblewrap is not installed (scripts/install_sandbox.sh installs it)")


@pytest.mark.slow
@no_bwrap
@pytest.mark.parametrize(("escape", "said"), [
    # a host directory beside the workspace: not even visible
    ("echo x > {outside}/escaped", "No such file or directory"),
    # the workspace's parent: the sandbox's own tmpfs, private (the write lands nowhere on the host)
    ("echo x > {workspace}/../escaped && cp {workspace}/../escaped {outside}/escaped", "No such file"),
    ("echo x > /etc/escaped", "Read-only file system"),  # the system is read-only
    ("echo x > /tmp/escaped && cp /tmp/escaped {outside}/escaped", "No such file"),  # private /tmp
])
def test_a_command_writes_its_workspace_and_nothing_else(tmp_path: Path, escape: str, said: str) -> None:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    command = escape.format(outside=outside, workspace=workspace)
    done = sandbox.run_in_sandbox(workspace, f"echo ok > inside; {command}", timeout_s=30)
    assert (workspace / "inside").read_text() == "ok\n"  # the command ran
    assert done.returncode != 0 and said in done.stdout, done.stdout
    assert not (outside / "escaped").exists() and not (tmp_path / "escaped").exists()
    assert not Path("/etc/escaped").exists() and not Path("/tmp/escaped").exists()


@pytest.mark.slow
@no_bwrap
def test_a_command_opens_no_network_connection(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        probe = ("import socket\n"
                 "for host, port in [('127.0.0.1', %d), ('192.0.2.1', 80)]:\n"
                 "    try:\n"
                 "        socket.create_connection((host, port), timeout=5)\n"
                 "        print(host, 'CONNECTED')\n"
                 "    except OSError as exc:\n"
                 "        print(host, type(exc).__name__, exc.errno)\n") % port
        (tmp_path / "probe.py").write_text(probe)
        done = sandbox.run_in_sandbox(tmp_path, "python3 probe.py", timeout_s=30)
        with pytest.raises(BlockingIOError):
            listener.accept()  # the host's listener never saw a connection
    assert done.returncode == 0, done.stdout
    assert "CONNECTED" not in done.stdout
    assert "127.0.0.1 ConnectionRefusedError" in done.stdout
    assert "192.0.2.1 OSError 101" in done.stdout  # ENETUNREACH: no interface but a private loopback


def test_the_server_refuses_a_bad_task_naming_the_field() -> None:
    server = _load("agent_server")
    good = {"task": "t", "repo": "repos/calc", "test": "python3 test_calc.py", "base_url": "http://x",
            "api_key": "s"}
    assert server.parse_task(json.dumps(good).encode()) == good
    for field, value, said in [("task", "", "task:"), ("test", 3, "test:"),
                               ("repo", "../../relaxtrio", "repo:"), ("repo", "/etc", "repo:")]:
        with pytest.raises(server.BadTask, match=said):
            server.parse_task(json.dumps(dict(good, **{field: value})).encode())
    with pytest.raises(server.BadTask, match="body"):
        server.parse_task(b"[1]")
