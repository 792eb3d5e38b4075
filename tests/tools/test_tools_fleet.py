"""``doctor`` and ``serve`` generate through the same fleet code as ``train``: a fleet of one.

Each command opens its engine with :func:`relaxtrio.fleet.connect.open_fleet` (via
:func:`relaxtrio.tools.serve.open_engine`); the fleet announces itself with one log line naming
its workers, and a launched engine logs where a launched fleet's engines log
(``<output dir>/engines/engine-0.log``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import httpx
import pytest
import trio

from relaxtrio.config import AgentConfig, GenerationConfig
from relaxtrio.engine.server import EngineConfig, serve_engine
from relaxtrio.rollout.dumps import load_dump
from relaxtrio.tools.doctor import DoctorConfig, run_doctor
from relaxtrio.tools.serve import ServeConfig, ServeSummary, run_serve

FLEET_LOG = "relaxtrio.fleet.fleet"

AGENT = r'''
import json, os
from openai import OpenAI

client = OpenAI(base_url=os.environ["RELAX_BASE_URL"], api_key=os.environ["RELAX_SESSION_ID"],
                timeout=1800, max_retries=2)
messages = list(json.load(open(os.environ["RELAX_INPUT_JSON"]))["messages"])
client.chat.completions.create(model="m", messages=messages, max_tokens=4)
json.dump({"reward": 1.0}, open(os.environ["RELAX_OUTPUT_JSON"], "w"))
'''


def _fleet_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == FLEET_LOG and r.getMessage().startswith("fleet: ")
            and "worker(s)" in r.getMessage() and "healthy" not in r.getMessage()]


@pytest.mark.slow
async def test_doctor_runs_its_agent_on_a_launched_fleet_of_one(
        tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=FLEET_LOG)
    (tmp_path / "agent.py").write_text(AGENT)
    out = tmp_path / "doctor"
    cfg = DoctorConfig(
        agent=AgentConfig(command=f"{sys.executable} agent.py", cwd=tmp_path, timeout_s=120.0,
                          term_grace_s=0.5),
        generation=GenerationConfig(max_response_tokens=4, tool_call_parser=None),
        hf_checkpoint=tiny_model_dir, output_dir=out, first_request_s=120.0,
        engine_args=("--max-running-requests", "2"))
    with trio.fail_after(300):
        report = await run_doctor(cfg)
    assert report.ok, "\n".join(report.lines())
    [line] = _fleet_lines(caplog)
    assert line.startswith("fleet: 1 worker(s): http://127.0.0.1:")
    assert "RELAXTRIO_ENGINE_URL=" in (out / "engines" / "engine-0.log").read_text()


async def test_serve_generates_through_a_fleet_of_one(
        tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=FLEET_LOG)
    lines: list[str] = []
    serving = trio.Event()

    def announce(line: str) -> None:
        lines.append(line)
        if line.startswith("# serving"):
            serving.set()

    summary: list[ServeSummary] = []
    stopped = trio.Event()
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_engine, EngineConfig(model_path=tiny_model_dir,
                                                                 max_running_requests=2))
            cfg = ServeConfig(hf_checkpoint=tiny_model_dir, engine_urls=(url,),
                              output_dir=tmp_path / "serve",
                              generation=GenerationConfig(max_response_tokens=4,
                                                          tool_call_parser=None))

            async def serve() -> None:
                summary.append(await run_serve(cfg, announce=announce))
                stopped.set()

            nursery.start_soon(serve)
            await serving.wait()
            env = dict(word.split("=", 1) for word in lines[0].split("#")[0].split()[1:])
            token = env["RELAX_SESSION_ID"].strip("'")
            async with httpx.AsyncClient(timeout=60) as http:
                reply = await http.post(
                    env["RELAX_BASE_URL"].strip("'") + "v1/chat/completions",
                    headers={"Authorization": f"Bearer {token}"},
                    json={"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
            assert reply.status_code == 200, reply.text
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C sends: serve writes its dump
            await stopped.wait()
            nursery.cancel_scope.cancel()
    assert _fleet_lines(caplog) == [f"fleet: 1 worker(s): {url}"]
    assert summary[0].stopped_by == "SIGINT"
    session = load_dump(summary[0].dump_path).session(token)
    assert [n["kind"] for n in session["forest"]["nodes"]] == ["observation", "response"]
