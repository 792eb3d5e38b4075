"""``python -m relaxtrio doctor``: one passing openai-SDK agent and one broken agent per contract
step, each run for real (subprocess, real API, the tiny model on the embedded engine in-process),
each failure asserted by its own message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio

from relaxtrio.config import AgentConfig, GenerationConfig
from relaxtrio.tools.doctor import DoctorConfig, DoctorReport, run_doctor
from relaxtrio.tools.doctor_integration import INTEGRATION_CHECKS
from relaxtrio.engine.server import EngineConfig, serve_engine

# One openai-SDK agent; its argv[1] picks how it breaks the contract.
pytestmark = pytest.mark.slow  # starts real processes

AGENT = r'''
import json, os, sys, time
from openai import OpenAI

mode = sys.argv[1]
if mode == "import_error":
    import relaxtrio_doctor_no_such_module  # noqa: F401 (fails before any request)
if mode == "silent":
    time.sleep(3600)
# The SDK's default retries: an empty reply of the tiny random model (a 500) is sampled again.
client = OpenAI(base_url=os.environ["RELAX_BASE_URL"], api_key=os.environ["RELAX_SESSION_ID"],
                timeout=5 if mode == "short_timeout" else 1800, max_retries=2)
task = json.load(open(os.environ["RELAX_INPUT_JSON"]))
messages = list(task["messages"])
print("agent: task has", len(messages), "messages", flush=True)
if mode == "legacy_endpoint":
    client.completions.create(model="m", prompt="2 + 3 =", max_tokens=4)
assert os.environ["RELAX_MAX_RESPONSE_TOKENS"] == "4" and int(os.environ["RELAX_MAX_CONTEXT_TOKENS"]) > 0
for turn in range(2):
    asked = 100_000 if mode == "greedy_output" and turn == 0 else 4  # a harness sized for a large model
    reply = client.chat.completions.create(model="m", messages=messages, max_tokens=asked)
    content = reply.choices[0].message.content or ""
    if mode == "altered_replay":
        content = content.strip() + " (edited)"
    messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "Sure?"}]
    if mode == "greedy_output":
        break  # the reply filled the small window: a second turn would not fit
messages.pop()
out = os.environ["RELAX_OUTPUT_JSON"]
if mode == "crash":
    print("agent: giving up", file=sys.stderr)
    print("\x1b[31mred\x00\x07", file=sys.stderr)  # terminal escapes must not reach the user's terminal
    sys.exit(3)
if mode == "bad_json":
    open(out, "w").write("{reward: 1")
elif mode == "foreign_export":
    record = {"name": "main", "messages": [{"role": "user", "content": "never sent"},
                           {"role": "assistant", "content": "never answered"}], "reward": 1.0}
    open(out, "w").write(json.dumps(record) + "\n")
elif mode == "no_reward":
    json.dump({"metadata": {"note": "forgot the reward"}}, open(out, "w"))
else:
    json.dump({"reward": 1.0}, open(out, "w"))
'''

CHECKS = ["starts", "first_request", "endpoint", "client_timeout", "output_room", "assistant_replay",
          "exit_code", "output", "export", "reward", *INTEGRATION_CHECKS]


async def _doctor(model_dir: Path, tmp_path: Path, mode: str, **overrides) -> DoctorReport:
    (tmp_path / "agent.py").write_text(AGENT)
    command = overrides.pop("command", f"{sys.executable} agent.py {mode}")
    cfg = DoctorConfig(
        agent=AgentConfig(command=command, cwd=tmp_path, timeout_s=60.0, term_grace_s=0.5),
        generation=overrides.pop("generation", GenerationConfig(max_response_tokens=4, tool_call_parser=None)),
        hf_checkpoint=model_dir, output_dir=tmp_path / "doctor",
        first_request_s=overrides.pop("first_request_s", 30.0), **overrides)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_engine, EngineConfig(model_path=model_dir, max_running_requests=2))
            report = await run_doctor(attrs.evolve(cfg, engine_urls=(url,)))
            nursery.cancel_scope.cancel()
    assert [c.name for c in report.checks] == CHECKS
    return report


def _failed(report: DoctorReport) -> list[str]:
    return [c.name for c in report.checks if c.status == "fail"]


async def test_a_contract_following_agent_passes_every_check(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = await _doctor(tiny_model_dir, tmp_path, "ok")
    assert report.ok, "\n".join(report.lines())
    assert report.check("client_timeout").detail == "read timeout 1800 s"
    assert report.check("endpoint").detail == "2 requests to /agentic_api/chat/completions"
    assert report.lines()[-1] == "doctor: all 15 checks passed"
    assert report.check("output_room").detail.startswith("asks for 4 output tokens; ")


async def test_no_first_request_within_the_limit(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = await _doctor(tiny_model_dir, tmp_path, "silent", first_request_s=3.0)
    assert _failed(report) == ["first_request"]
    check = report.check("first_request")
    assert check.detail.startswith("no request reached the API within 3 s (the agent was stopped)")
    assert "RELAX_BASE_URL" in check.fix and report.check("exit_code").status == "skip"


async def test_an_agent_that_fails_before_its_first_request_is_pointed_at_its_output(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    report = await _doctor(tiny_model_dir, tmp_path, "import_error")
    check = report.check("first_request")
    assert check.status == "fail" and check.detail == "the agent exited (code 1) without sending a request"
    assert "read its output tail below" in check.fix and "RELAX_BASE_URL" not in check.fix
    assert any("ModuleNotFoundError" in line for line in report.lines())


@pytest.mark.parametrize("script", ["agent.py", "agent_stdlib.py"])
async def test_the_quiz_example_passes_with_the_default_task(
    tiny_model_dir: Path, tmp_path: Path, script: str
) -> None:
    """Both quiz agents (the openai SDK and the standard library's urllib) pass every check."""
    example = Path(__file__).resolve().parents[2] / "examples" / "quiz_feedback"
    cfg = DoctorConfig(
        agent=AgentConfig(command=f"{sys.executable} {script}", cwd=example, timeout_s=60.0,
                          term_grace_s=0.5, env={"QUIZ_MAX_TOKENS": "4"}),
        generation=GenerationConfig(max_response_tokens=4, tool_call_parser=None),
        hf_checkpoint=tiny_model_dir, output_dir=tmp_path / "doctor", first_request_s=30.0)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_engine, EngineConfig(model_path=tiny_model_dir,
                                                                 max_running_requests=2))
            report = await run_doctor(attrs.evolve(cfg, engine_urls=(url,)))
            nursery.cancel_scope.cancel()
    assert report.ok, "\n".join(report.lines())  # its KeyError 'answer' before the default task had one


async def test_a_first_request_asking_past_the_window_is_a_warning(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = await _doctor(tiny_model_dir, tmp_path, "greedy_output",
                           generation=GenerationConfig(max_response_tokens=4, tool_call_parser=None,
                                                       max_context_tokens=96))
    check = report.check("output_room")
    assert check.status == "warn" and report.ok, "\n".join(report.lines())
    assert check.detail.startswith("the first request asks for 100000 output tokens but the 96-token window leaves ")
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS" in check.fix and "       fix: " + check.fix in report.lines()


async def test_unsupported_endpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = await _doctor(tiny_model_dir, tmp_path, "legacy_endpoint")
    assert "endpoint" in _failed(report)
    check = report.check("endpoint")
    assert check.detail.startswith("POST /agentic_api/completions is not an endpoint relaxtrio serves "
                                   "(HTTP 404)")
    assert "chat/completions, responses or messages" in check.fix
    assert "openai.NotFoundError" in report.log_tail  # the agent's own traceback, in the tail


async def test_short_client_timeout_from_the_sdk_header(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = await _doctor(tiny_model_dir, tmp_path, "short_timeout")
    assert _failed(report) == ["client_timeout", "longest_hold"]  # 5 s is also below the 600 s barrier
    assert report.check("client_timeout").detail.startswith("the client's read timeout is 5 s")
    assert "OpenAI(timeout=1800" in report.check("client_timeout").fix


async def test_altered_assistant_replay(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = await _doctor(tiny_model_dir, tmp_path, "altered_replay")
    assert "assistant_replay" in _failed(report)
    detail = report.check("assistant_replay").detail
    assert detail.startswith("a request replayed an assistant message that relaxtrio did not answer")
    assert "(edited)" in detail and "relaxtrio had answered" in detail


async def test_non_zero_exit(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = await _doctor(tiny_model_dir, tmp_path, "crash")
    assert _failed(report) == ["exit_code"]
    assert report.check("exit_code").detail == "the agent exited with code 3"
    assert report.check("output").status == "skip"
    lines = report.lines()
    assert "    agent: giving up" in lines and lines[-1].startswith("doctor: 6 of 15 checks did not pass")
    assert "    \\x1b[31mred\\x00\\x07" in lines
    assert not any(ch in report.log_tail for ch in "\x1b\x00\x07")


async def test_invalid_output_json(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = await _doctor(tiny_model_dir, tmp_path, "bad_json")
    assert _failed(report) == ["output"]
    assert report.check("output").detail.startswith("RELAX_OUTPUT_JSON is not usable:")


async def test_export_matching_no_committed_state(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = await _doctor(tiny_model_dir, tmp_path, "foreign_export")
    assert _failed(report) == ["export"]
    assert report.check("export").detail == (
        "the export matches no committed state: explicit export does not match a committed Forest "
        "state (record 'main')")


async def test_no_reward_and_no_hook(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = await _doctor(tiny_model_dir, tmp_path, "no_reward")
    assert _failed(report) == ["reward"]
    assert report.check("reward").detail == "the context has no reward and no reward hook is configured"
    hooked = await _doctor(tiny_model_dir, tmp_path, "no_reward", reward_hook="--custom-rm-path")
    assert hooked.ok and hooked.check("reward").detail == "reward present (hook --custom-rm-path)"


async def test_command_not_found(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = await _doctor(tiny_model_dir, tmp_path, "ok", command="no-such-agent-binary --go")
    assert report.check("starts").detail.startswith("bash could not run the command (exit code 127")
    assert _failed(report) == ["starts"]  # what follows from it is skipped, not failed again
    assert report.check("first_request").detail == "the command did not run (see starts)"
    assert report.check("exit_code").status == "skip"
    assert report.lines()[-1].startswith("doctor: 14 of 15 checks did not pass (1 failed, 13 skipped): ")


def test_cli_exit_codes(tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    base = [sys.executable, "-m", "relaxtrio", "doctor", "--hf-checkpoint", str(tiny_model_dir),
            "--agent-cwd", str(tmp_path), "--rollout-max-response-len", "4",
            "--output-dir", str(tmp_path / "out")]
    ok = subprocess.run([*base, "--agent-command", f"{sys.executable} agent.py ok"], env=env,
                        capture_output=True, text=True, timeout=300, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "doctor: all 15 checks passed" in ok.stdout
    bad = subprocess.run([*base, "--agent-command", f"{sys.executable} agent.py crash"], env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode == 1 and "[FAIL] exit_code: the agent exited with code 3" in bad.stdout
    assert "       fix: exit 0 once RELAX_OUTPUT_JSON is written" in bad.stdout
