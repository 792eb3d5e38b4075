"""examples/mini_swe_agent: an external agent server running the real ``mini`` CLI (mini-swe-agent
2.4.6) with every command of the model in a bubblewrap sandbox.

The server starts once, before the run, with a fixed number of slots; each Session's command only
submits its task and waits. The scripted engine plays the model in mini-swe-agent's text format
(one ``mswea_bash_command`` block per reply); the commands run for real in the sandbox on a copy
of the task's repository, and the repository's test (also sandboxed) decides the reward.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from tests.support.examples import EXAMPLES, assert_response_masks, run_example

from relaxtrio.testing.scripted_server import Rule

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (Path(sys.executable).parent / "mini").exists() and shutil.which("mini") is None,
                       reason="mini-swe-agent is not installed (the harnesses extra)"),
    # CI sets RELAXTRIO_REQUIRE_SANDBOX=1 (.ci/run): there a missing bwrap fails, never skips.
    pytest.mark.skipif(shutil.which("bwrap") is None and os.environ.get("RELAXTRIO_REQUIRE_SANDBOX") != "1",
                       reason="bubblewrap is not installed (scripts/install_sandbox.sh installs it)"),
]

_END = r"<\|im_end\|>\n<\|im_start\|>assistant\n$"


def _reply(thought: str, command: str) -> str:
    return f"THOUGHT: {thought}\n\n```mswea_bash_command\n{command}\n```"


FIX_CALC = _reply("add subtracts; make it add.", "sed -i 's/a - b/a + b/' calc.py")
FIX_WORDS = _reply("the words are joined in order.",
                   "sed -i 's/join(text.split())/join(reversed(text.split()))/' words.py")
SUBMIT = _reply("fixed.", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
PROSE = "I would change the minus sign in calc.py to a plus sign."
SOLVE = [
    Rule(match=r"<returncode>0</returncode>.*" + _END, reply=SUBMIT),
    Rule(match=r"Please solve this issue: The function add.*" + _END, reply=FIX_CALC),
    Rule(match=r"Please solve this issue: reverse_words.*" + _END, reply=FIX_WORDS),
]


@asynccontextmanager
async def agent_server(work_dir: Path, *, slots: int) -> AsyncIterator[str]:
    """Runs examples/mini_swe_agent/agent_server.py; yields its URL; stops it (and its tasks)."""
    argv = [sys.executable, str(EXAMPLES / "mini_swe_agent" / "agent_server.py"), "--slots", str(slots),
            "--work-dir", str(work_dir), "--command-timeout-s", "30"]
    async with await trio.open_file(work_dir.parent / "server.log", "wb") as log:
        proc = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, stderr=log.wrapped)
        try:
            assert proc.stdout is not None
            line = b""
            with trio.fail_after(60):
                while not line.endswith(b"\n"):
                    chunk = await proc.stdout.receive_some()
                    assert chunk, (work_dir.parent / "server.log").read_text()
                    line += chunk
            yield line.split()[3].decode()
        finally:
            proc.terminate()
            with trio.move_on_after(30):
                await proc.wait()
            proc.kill()
            await proc.wait()


async def _stats(url: str) -> dict[str, int]:
    def get() -> dict[str, int]:
        import urllib.request
        with urllib.request.urlopen(f"{url}/v1/stats", timeout=10) as response:
            return json.loads(response.read())
    return await trio.to_thread.run_sync(get)


async def test_the_server_fixes_two_tasks_within_its_declared_slots(tiny_model_dir: Path,
                                                                    tmp_path: Path) -> None:
    (tmp_path / "server").mkdir()
    async with agent_server(tmp_path / "server", slots=2) as url:
        run = await run_example("mini_swe_agent", tmp_path, tiny_model_dir, rules=SOLVE, command="rollout",
                                args=["--rollout-batch-size", "2", "--agent-external-slots", "2"],
                                agent_env=[f"MSWEA_SERVER_URL={url}"])
        stats = await _stats(url)
    assert run.returncode == 0, run.output[-3000:]
    assert "agent capacity: T=2" in run.output
    assert len(run.samples) == 2
    for sample in run.samples:
        assert sample["name"] is None and sample["reward"] == 1.0, sample["metadata"]
        assert sample["metadata"]["tests_passed"] and sample["metadata"]["steps"] == 2
        assert assert_response_masks(sample) == 2
    assert stats["completed"] == 2 and 1 <= stats["peak_busy"] <= 2 and stats["busy"] == 0
    # The fixes landed in the server's per-task workspaces; the example's repositories are untouched.
    fixed = {p.read_text() for p in (tmp_path / "server").glob("task-*/workspace/calc.py")}
    assert len(fixed) == 1 and "a + b" in fixed.pop()
    assert "a - b" in (EXAMPLES / "mini_swe_agent" / "repos" / "calc" / "calc.py").read_text()


async def test_a_run_declaring_fewer_slots_than_the_formula_needs_is_refused(tiny_model_dir: Path,
                                                                             tmp_path: Path) -> None:
    run = await run_example("mini_swe_agent", tmp_path, tiny_model_dir, rules=SOLVE, command="rollout",
                            args=["--rollout-batch-size", "2", "--agent-external-slots", "1"],
                            agent_env=["MSWEA_SERVER_URL=http://127.0.0.1:9"])
    assert run.returncode != 0
    assert "--agent-external-slots 1 is too small" in run.output and "needs 2 slots" in run.output
    assert run.samples == []


async def test_a_format_error_branch_is_left_out_by_the_final_policy(tiny_model_dir: Path,
                                                                     tmp_path: Path) -> None:
    # First reply is prose: mini-swe-agent drops it and resends the history plus a format-error
    # message (a second branch under the task); that branch then fixes and submits.
    rules = [SOLVE[0], Rule(match=r"Format error.*" + _END, reply=FIX_CALC),
             Rule(match=r"Please solve this issue:.*" + _END, reply=PROSE)]
    (tmp_path / "server").mkdir()
    async with agent_server(tmp_path / "server", slots=1) as url:
        run = await run_example("mini_swe_agent", tmp_path, tiny_model_dir, rules=rules, command="rollout",
                                args=["--agentic-export-policy", "final", "--agent-external-slots", "1"],
                                agent_env=[f"MSWEA_SERVER_URL={url}"])
    assert run.returncode == 0, run.output[-3000:]
    [session] = run.sessions()
    assert len(session["forest"]["leaves"]) == 2
    [sample] = run.samples
    assert sample["reward"] == 1.0 and sample["metadata"]["steps"] == 2
    assert assert_response_masks(sample) == 2  # the fix and the submit; the prose is not trained
    assert sample["state_hash"] in session["forest"]["leaves"]


async def test_a_command_from_the_model_cannot_escape_its_workspace(tiny_model_dir: Path,
                                                                   tmp_path: Path) -> None:
    # The model's command tries to write a host file outside its workspace, to connect to a port
    # listening on the host's loopback, and to reach an outside address; all must fail, and the
    # command still ran (its write inside the workspace landed).
    outside = tmp_path / "outside"
    outside.mkdir()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    escape = _reply("let me look around.", (
        f"echo inside > inside.txt; echo pwned > {outside}/escaped.txt; "
        f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=5)'; "
        "python3 -c 'import socket; socket.create_connection((\"192.0.2.1\", 80), timeout=5)'; "
        "echo ESCAPE_TRIED"))
    rules = [SOLVE[0], Rule(match=r"Please solve this issue:.*" + _END, reply=escape)]
    (tmp_path / "server").mkdir()
    with listener:
        async with agent_server(tmp_path / "server", slots=1) as url:
            run = await run_example("mini_swe_agent", tmp_path, tiny_model_dir, rules=rules, command="rollout",
                                    args=["--agent-external-slots", "1"], agent_env=[f"MSWEA_SERVER_URL={url}"])
        assert run.returncode == 0, run.output[-3000:]
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected
    assert not (outside / "escaped.txt").exists()
    [task_dir] = (tmp_path / "server").glob("task-*")
    assert (task_dir / "workspace" / "inside.txt").read_text() == "inside\n"
    traj = json.loads((task_dir / "trajectory.json").read_text())
    observation = next(m["content"] for m in traj["messages"] if "ESCAPE_TRIED" in str(m.get("content"))
                       and m["role"] == "user")
    assert "No such file or directory" in str(observation)  # the host directory is not even visible
    assert "Connection refused" in str(observation)  # the sandbox's own loopback: no host listener
    assert "Network is unreachable" in str(observation)  # no route anywhere else
    [sample] = run.samples
    assert sample["reward"] == 0.0  # nothing fixed
