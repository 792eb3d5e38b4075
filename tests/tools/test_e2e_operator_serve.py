"""``python -m relaxtrio serve --operator-port 0``: the printed operator line opens
``/debug_state`` (and only with its token); the agents' listener serves no debug route."""

from __future__ import annotations

import pytest

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import trio

pytestmark = pytest.mark.slow  # starts real processes


async def test_serve_prints_an_operator_token_that_opens_debug_state(tiny_model_dir: Path, tmp_path: Path,
                                                                     shared_engine_url: str) -> None:
    cmd = [sys.executable, "-m", "relaxtrio", "serve", "--hf-checkpoint", str(tiny_model_dir),
           "--engine-url", shared_engine_url, "--sessions", "2", "--output-dir", str(tmp_path / "serve"), "--operator-port", "0",
           "--log-level", "WARNING"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = await trio.lowlevel.open_process(cmd, stdout=subprocess.PIPE, env=env)
    try:
        with trio.fail_after(180):
            buffer = b""
            while b"# serving" not in buffer:
                chunk = await process.stdout.receive_some()
                assert chunk, f"serve exited early: {buffer!r}"
                buffer += chunk
            lines = buffer.decode().splitlines()
            [operator] = [line for line in lines if line.startswith("# operator:")]
            token = operator.split("#token=")[1].split()[0]
            url = operator.split()[-1].removesuffix("/debug_state")
            assert url.startswith("http://127.0.0.1:")
            exports = [dict(w.split("=", 1) for w in shlex.split(line.split("#", 1)[0])[1:])
                       for line in lines if line.startswith("export ")]
            agent_url = exports[0]["RELAX_BASE_URL"]
            agent_root = agent_url.rstrip("/").removesuffix("/agentic_api")
            assert agent_root != url
            async with httpx.AsyncClient(timeout=60) as http:
                agent = {"Authorization": f"Bearer {exports[0]['RELAX_SESSION_ID']}"}
                assert (await http.get(url + "/debug_state")).status_code == 401
                assert (await http.get(url + "/debug_state", headers=agent)).status_code == 401
                for path in ("/debug_state", "/dashboard", "/agentic_api/debug_state"):
                    response = await http.get(agent_root + path, headers=agent)
                    assert response.status_code == 404, path
                    assert exports[1]["RELAX_SESSION_ID"] not in response.text
                state = (await http.get(url + "/debug_state",
                                        headers={"Authorization": f"Bearer {token}"})).json()
                assert state["kind"] == "serve" and state["totals"]["session_count"] == 2
                assert sorted(s["session_id"] for g in state["groups"] for s in g["sessions"]) == \
                    sorted(e["RELAX_SESSION_ID"] for e in exports)
                assert (await http.get(url + "/dashboard")).status_code == 200
            process.send_signal(signal.SIGINT)
            while await process.stdout.receive_some():
                pass
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
