"""``python -m relaxtrio serve`` + an openai-SDK agent run by hand + Ctrl-C: the dump matches the
agent's turns.

Serve talks to the shared engine process (``shared_engine_url``; the embedded engine that serve
starts by itself is the same ``open_engine`` path ``python -m relaxtrio doctor`` is tested
through). Each real process gets a time budget of its own, sized for a loaded machine.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest
import trio
from tests.support.procs import descendants

from relaxtrio import ConfigError
from relaxtrio.config import FleetConfig
from relaxtrio.run.inference import open_inference
from relaxtrio.tools.replay import replay_dump
from relaxtrio.rollout.dumps import load_dump

# A plain openai-SDK agent: two turns with a growing history; it records what it sent and got.
pytestmark = pytest.mark.slow  # starts real processes

SDK_AGENT = r'''
import json, os
from openai import OpenAI

client = OpenAI(base_url=os.environ["RELAX_BASE_URL"], api_key=os.environ["RELAX_SESSION_ID"],
                timeout=600, max_retries=0)
messages = [{"role": "user", "content": "What is 2 + 2?"}]
replies = []
for turn in range(2):
    reply = client.chat.completions.create(model="m", messages=messages, max_tokens=6)
    content = reply.choices[0].message.content or ""
    replies.append(content)
    messages.append({"role": "assistant", "content": content})
    if turn == 0:
        messages.append({"role": "user", "content": "Are you sure?"})
json.dump({"messages": messages, "replies": replies}, open(os.environ["AGENT_LOG"], "w"))
json.dump({"reward": 0.75, "metadata": {"by": "hand"}}, open(os.environ["RELAX_OUTPUT_JSON"], "w"))
'''


SERVE_START_S: Final = 300
"""Wall seconds until serve prints its lines: a Python process importing relaxtrio and
transformers and loading the tokenizer (about 10 s idle; minutes at a load of 20)."""

AGENT_RUN_S: Final = 300
"""Wall seconds for the agent: a Python process importing the openai SDK, then two tiny turns."""

SERVE_STOP_S: Final = 120
"""Wall seconds from Ctrl-C to serve's exit: close, export and write the dump."""


def _parse_exports(line: str) -> dict[str, str]:
    words = shlex.split(line.split("#", 1)[0])
    assert words[0] == "export"
    return dict(word.split("=", 1) for word in words[1:])


async def _read_until_serving(process: trio.Process) -> str:
    """serve's stdout up to its ``# serving`` line (its export lines before it)."""
    with trio.fail_after(SERVE_START_S):
        buffer = b""
        while b"# serving" not in buffer:
            chunk = await process.stdout.receive_some()
            assert chunk, f"serve exited early: {buffer!r}"
            buffer += chunk
    return buffer.decode()


async def _read_to_exit(process: trio.Process) -> tuple[bytes, int]:
    """The rest of serve's stdout and its exit status."""
    with trio.fail_after(SERVE_STOP_S):
        tail = b""
        while chunk := await process.stdout.receive_some():
            tail += chunk
        return tail, await process.wait()


async def test_serve_then_ctrl_c_dumps_the_forest_of_a_hand_run_agent(tiny_model_dir: Path, tmp_path: Path,
                                                                     shared_engine_url: str) -> None:
    out_dir = tmp_path / "serve"
    cmd = [sys.executable, "-m", "relaxtrio", "serve", "--hf-checkpoint", str(tiny_model_dir),
           "--engine-url", shared_engine_url, "--sessions", "2", "--output-dir", str(out_dir),
           "--rollout-max-response-len", "6", "--log-level", "WARNING"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = await trio.lowlevel.open_process(cmd, stdout=subprocess.PIPE, env=env)
    try:
        lines = [line for line in (await _read_until_serving(process)).splitlines()
                 if line.startswith("export ")]
        assert len(lines) == 2 and lines[0].endswith("# session 0")
        exports = [_parse_exports(line) for line in lines]
        assert exports[0]["RELAX_BASE_URL"].endswith("/agentic_api/")
        assert exports[0]["RELAX_SESSION_ID"] != exports[1]["RELAX_SESSION_ID"]
        # Every variable a started agent gets (harness scripts read them under set -u).
        assert Path(exports[0]["RELAX_SESSION_IO_DIR"]) == Path(exports[0]["RELAX_OUTPUT_JSON"]).parent
        assert exports[0]["RELAX_ROLLOUT_MODE"] == "train"
        assert exports[0]["RELAX_GROUP_ID"] != exports[1]["RELAX_GROUP_ID"]  # a Group each

        agent_script = tmp_path / "sdk_agent.py"
        agent_script.write_text(SDK_AGENT)
        agent_log = tmp_path / "agent_log.json"
        with trio.fail_after(AGENT_RUN_S):
            done = await trio.run_process([sys.executable, str(agent_script)], capture_stderr=True,
                                          check=False,
                                          env={**os.environ, **exports[0], "AGENT_LOG": str(agent_log)})
        assert done.returncode == 0, done.stderr.decode()[-2000:]

        process.send_signal(signal.SIGINT)
        tail, code = await _read_to_exit(process)
        assert code == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert b"dump: " in tail

    seen = json.loads(agent_log.read_text())
    dump = load_dump(out_dir / "serve_dump.json")
    assert dump.rollout_id == "serve"
    used = dump.session(exports[0]["RELAX_SESSION_ID"])
    nodes = used["forest"]["nodes"]
    assert [n["kind"] for n in nodes] == ["observation", "response", "observation", "response"]
    # The forest holds exactly the agent's turns: what it sent, and what it was answered.
    assert [m["content"] for n in nodes for m in n["messages"]] == [m["content"] for m in seen["messages"]]
    assert [n["messages"][0]["content"] for n in nodes if n["kind"] == "response"] == seen["replies"]
    assert used["status"] == "completed" and used["turn_count"] == 2 and used["num_requests"] == 2
    assert used["exported"] == [nodes[-1]["state_hash"]] == used["forest"]["leaves"]
    [sample] = [d for d in dump.samples if d.sample.session_id == used["session_id"]]
    assert sample.sample.reward == 0.75 and sample.scalar_reward == 0.75
    assert sample.sample.metadata["by"] == "hand"
    assert sum(sample.sample.loss_mask) == sum(n["num_tokens"] for n in nodes if n["kind"] == "response")

    # The engine's logprobs of the hand-run turns agree with the trainer's (no advantages here).
    report = replay_dump(dump, tiny_model_dir)
    assert report.first is None, report.lines()
    assert report.num_trained_tokens == sum(sample.sample.loss_mask) and not report.advantages_checked

    idle = dump.session(exports[1]["RELAX_SESSION_ID"])
    assert idle["forest"]["nodes"] == [] and idle["turn_count"] == 0
    # No agent used it: not a failed export, but "no requests" (in the dump and the closing line).
    assert idle["status"] == "cancelled" and idle["reason"] == "no requests"
    assert b"0 failed, 1 with no requests" in tail


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


async def test_serve_dumps_its_sessions_when_the_embedded_engine_dies(tiny_model_dir: Path,
                                                                     tmp_path: Path) -> None:
    """kill -9 of serve's own engine: serve still exports every Session and writes the dump
    (exit 1), as with a failing ``--engine-url``; the Session's committed turn is in it."""
    import httpx

    out_dir = tmp_path / "serve"
    cmd = [sys.executable, "-m", "relaxtrio", "serve", "--hf-checkpoint", str(tiny_model_dir),
           "--sessions", "2", "--output-dir", str(out_dir), "--rollout-max-response-len", "4",
           "--log-level", "WARNING"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = await trio.lowlevel.open_process(cmd, stdout=subprocess.PIPE, env=env)
    try:
        exports = [_parse_exports(line) for line in (await _read_until_serving(process)).splitlines()
                   if line.startswith("export ")]
        base, token = exports[0]["RELAX_BASE_URL"], exports[0]["RELAX_SESSION_ID"]
        async with httpx.AsyncClient(timeout=120) as http:
            reply = await http.post(base + "v1/chat/completions", headers={"Authorization": f"Bearer {token}"},
                                    json={"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
        assert reply.status_code == 200, reply.text
        # The engine itself, not the reaper shim that runs it (whose argv holds the engine's).
        [engine] = [p for p in descendants(process.pid) if "-m relaxtrio.engine " in _cmdline(p)
                    and "--parent" not in _cmdline(p)]
        os.kill(engine, signal.SIGKILL)
        tail, code = await _read_to_exit(process)
        assert code == 1
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert b"dump: " in tail
    dump = load_dump(out_dir / "serve_dump.json")
    used = dump.session(token)
    assert [n["kind"] for n in used["forest"]["nodes"]] == ["observation", "response"]
    assert used["num_requests"] == 1
    assert dump.session(exports[1]["RELAX_SESSION_ID"])["reason"] == "no requests"


def _relabelled_model(tiny_model_dir: Path, out: Path) -> Path:
    """The tiny model's files under a config.json that names another architecture."""
    shutil.copytree(tiny_model_dir, out)
    config = json.loads((out / "config.json").read_text())
    config.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    (out / "config.json").write_text(json.dumps(config))
    return out


async def test_an_engine_serving_another_model_is_refused_at_startup(
        tiny_model_dir: Path, tmp_path: Path, shared_engine_url: str) -> None:
    """``--engine-url`` serving a llama while ``--hf-checkpoint`` is a qwen2: serve exits 2 naming
    both before any Session; train's inference refuses it the same way, before a rollout."""
    other = _relabelled_model(tiny_model_dir, tmp_path / "qwen2")
    cmd = [sys.executable, "-m", "relaxtrio", "serve", "--hf-checkpoint", str(other),
           "--engine-url", shared_engine_url, "--output-dir", str(tmp_path / "serve")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with trio.fail_after(SERVE_START_S):
        done = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, check=False,
                                      env=env)
    stderr = done.stderr.decode()
    assert done.returncode == 2, stderr
    assert (f"the engine at {shared_engine_url} serves model_type 'llama' and architectures "
            "['LlamaForCausalLM'], not 'qwen2' and ['Qwen2ForCausalLM']") in stderr
    assert "--hf-checkpoint" in stderr and b"export " not in done.stdout

    config = FleetConfig(engine_urls=(shared_engine_url,))
    with pytest.RaisesGroup(pytest.RaisesExc(ConfigError, match="serves model_type 'llama'",
                                             check=lambda e: e.param == "--hf-checkpoint"),
                            flatten_subgroups=True):
        async with open_inference(config, model_dir=other, run_dir=tmp_path / "run"):
            pass
    async with open_inference(config, model_dir=tiny_model_dir, run_dir=tmp_path / "run") as inference:
        assert inference.fleet.urls == (shared_engine_url,)  # the right model passes
