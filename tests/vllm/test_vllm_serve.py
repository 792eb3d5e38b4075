"""``python -m relaxtrio serve --rollout-backend vllm --engine-url <real vLLM server>``: one chat
request through serve's agent API, then Ctrl-C; the dump holds the turn, and its rollout
logprobs (vLLM's) agree with the trainer's (``replay``).

(``doctor`` on a vLLM server: tests/vllm/test_vllm_fleet.py.)
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Final

import httpx
import pytest
import trio
from tests.vllm.vllm_helpers import VllmServer

from relaxtrio.rollout.dumps import load_dump
from relaxtrio.tools.replay import replay_dump

pytestmark = pytest.mark.slow  # a real vLLM server and a serve process

SERVE_START_S: Final = 300.0  # a Python process importing relaxtrio and transformers, loaded cores
REQUEST_S: Final = 120.0
SERVE_STOP_S: Final = 120.0


def _exports(stdout: str) -> dict[str, str]:
    """The variables of serve's one ``export`` line."""
    (line,) = [line for line in stdout.splitlines() if line.startswith("export ")]
    return dict(word.split("=", 1) for word in shlex.split(line.split("#", 1)[0])[1:])


async def _until_serving(process: trio.Process) -> str:
    buffer = b""
    with trio.fail_after(SERVE_START_S):
        while b"# serving" not in buffer:
            chunk = await process.stdout.receive_some()
            assert chunk, f"serve exited early: {buffer!r}"
            buffer += chunk
    return buffer.decode()


async def test_serve_answers_a_chat_request_from_a_vllm_server(vllm_server: VllmServer, tmp_path: Path):
    out_dir = tmp_path / "serve"
    cmd = [sys.executable, "-m", "relaxtrio", "serve", "--rollout-backend", "vllm",
           "--hf-checkpoint", str(vllm_server.model_dir), "--engine-url", vllm_server.url,
           "--sessions", "1", "--output-dir", str(out_dir), "--rollout-max-response-len", "8",
           "--log-level", "WARNING"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = await trio.lowlevel.open_process(cmd, stdout=subprocess.PIPE, env=env)
    try:
        exports = _exports(await _until_serving(process))
        with trio.fail_after(REQUEST_S):
            async with httpx.AsyncClient(timeout=REQUEST_S) as http:
                reply = await http.post(
                    exports["RELAX_BASE_URL"] + "v1/chat/completions",
                    headers={"Authorization": f"Bearer {exports['RELAX_SESSION_ID']}"},
                    json={"model": "m", "messages": [{"role": "user", "content": "What is 2 + 2?"}],
                          "max_tokens": 8})
        assert reply.status_code == 200, reply.text
        answer = reply.json()["choices"][0]["message"]["content"]
        process.send_signal(signal.SIGINT)
        with trio.fail_after(SERVE_STOP_S):
            tail = b""
            while chunk := await process.stdout.receive_some():
                tail += chunk
            code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert code == 0, tail.decode(errors="replace")
    dump = load_dump(out_dir / "serve_dump.json")
    session = dump.session(exports["RELAX_SESSION_ID"])
    nodes = session["forest"]["nodes"]
    assert [n["kind"] for n in nodes] == ["observation", "response"]
    assert nodes[1]["messages"][0]["content"] == answer
    assert session["num_requests"] == 1
    report = await trio.to_thread.run_sync(replay_dump, dump, vllm_server.model_dir)
    print(f"\nserve on vLLM: answered {answer!r}; replay: {report.lines()[-1]}")
    assert report.first is None, report.lines()  # vLLM's logprobs are the trainer's
