"""``python -m relaxtrio doctor``'s integration checks (relaxtrio.tools.doctor_integration).

Each check fails on an agent built to fail it, run for real as in tests/tools/test_doctor.py (a
subprocess against the real API; the tiny model on the embedded engine, or a scripted engine
where the check needs a given reply), plus the pure rules on hand-made observations.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import attrs
import pytest
import trio

from relaxtrio._errors import ConfigError
from relaxtrio.cli.tool_flags import add_doctor_parser, doctor_config
from relaxtrio.cli.train_flags import add_train_parser
from relaxtrio.config import AgentConfig, GenerationConfig
from relaxtrio.engine.server import EngineConfig, serve_engine
from relaxtrio.models import load_tokenizer
from relaxtrio.testing.scripted_server import Rule, rules_engine, serve_scripted_engine
from relaxtrio.tools.doctor import DoctorConfig, DoctorReport, run_doctor
from relaxtrio.tools.doctor_checks import Observation, RequestRecord
from relaxtrio.tools.doctor_integration import (
    INTEGRATION_CHECKS,
    IntegrationConfig,
    evaluate_integration,
    longest_hold_s,
)

AGENT = r'''
import json, os, sys
from openai import OpenAI

mode = sys.argv[1]
client = OpenAI(base_url=os.environ["RELAX_BASE_URL"], api_key=os.environ["RELAX_SESSION_ID"],
                timeout=700 if mode == "medium_timeout" else 3600, max_retries=2)
task = json.load(open(os.environ["RELAX_INPUT_JSON"]))
out = os.environ["RELAX_OUTPUT_JSON"]

def ask(messages, **kw):
    # The scripted replies (think, tools) are longer than the tiny model's 4-token turns.
    limit = 64 if mode in ("think", "tools") else 4
    reply = client.chat.completions.create(model="m", messages=messages, max_tokens=limit, **kw)
    return {"role": "assistant", "content": reply.choices[0].message.content or ""}

if mode == "branch":
    # Drops the first reply and asks again with a format-error note: two leaves under the task.
    ask(task["messages"])
    ask(task["messages"] + [{"role": "user", "content": "Format error: answer with one number."}])
    json.dump({"reward": 1.0}, open(out, "w"))
elif mode == "two_contexts":
    records = []
    for name in ("main", "searcher_0"):
        messages = [{"role": "system", "content": f"You are the {name} agent."}] + task["messages"]
        messages.append(ask(messages))
        records.append(json.dumps({"name": name, "messages": messages, "reward": 1.0}))
    open(out, "w").write("\n".join(records) + "\n")
elif mode == "tools":
    tools = [{"type": "function", "function": {"name": "add", "description": "Adds two numbers.",
              "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                               "b": {"type": "number"}}}}}]
    ask(task["messages"], tools=tools)
    json.dump({"reward": 1.0}, open(out, "w"))
else:  # ok, medium_timeout, think
    ask(task["messages"])
    json.dump({"reward": 1.0}, open(out, "w"))
'''


async def _doctor(model_dir: Path, tmp_path: Path, mode: str, *, reply: str | None = None,
                  **integration) -> DoctorReport:
    """Runs the doctor on AGENT's ``mode``; ``reply``: a scripted engine answers every turn with it."""
    (tmp_path / "agent.py").write_text(AGENT)
    cfg = DoctorConfig(
        agent=AgentConfig(command=f"{sys.executable} agent.py {mode}", cwd=tmp_path, timeout_s=60.0,
                          term_grace_s=0.5),
        generation=GenerationConfig(max_response_tokens=4 if reply is None else 64, tool_call_parser=None),
        hf_checkpoint=model_dir, output_dir=tmp_path / "doctor", first_request_s=30.0,
        integration=IntegrationConfig(**integration))
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            if reply is None:
                url = await nursery.start(serve_engine, EngineConfig(model_path=model_dir, max_running_requests=2))
            else:
                tokenizer = load_tokenizer(model_dir)
                engine = rules_engine(tokenizer, tokenizer.eos_token_id, [Rule(match=".", reply=reply)])
                url = await nursery.start(serve_scripted_engine, engine)
            report = await run_doctor(attrs.evolve(cfg, engine_urls=(url,)))
            nursery.cancel_scope.cancel()
    assert [c.name for c in report.checks][-len(INTEGRATION_CHECKS):] == list(INTEGRATION_CHECKS)
    return report


def _failed(report: DoctorReport) -> list[str]:
    return [c.name for c in report.checks if c.status == "fail"]


@pytest.mark.slow
async def test_a_branched_history_fails_strict_and_passes_final(tiny_model_dir: Path, tmp_path: Path) -> None:
    strict = await _doctor(tiny_model_dir, tmp_path, "branch")
    assert "export_policy" in _failed(strict)
    check = strict.check("export_policy")
    assert check.detail.startswith("strict implicit export refuses this history")
    assert "2 leaves with a response" in check.detail and "--agentic-export-policy final" in check.fix
    final = await _doctor(tiny_model_dir, tmp_path, "branch", export_policy="final")
    assert final.ok, "\n".join(final.lines())
    assert final.check("export_policy").detail == "final exports the last leaf; 1 other branch(es) are not trained"


@pytest.mark.slow
async def test_two_exported_contexts_without_custom_advantage(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = await _doctor(tiny_model_dir, tmp_path, "two_contexts")
    assert _failed(report) == ["multi_context_credit"]
    check = report.check("multi_context_credit")
    assert check.detail.startswith("the Session exported 2 contexts and no custom advantage is configured")
    assert "--agentic-custom-advantage-path" in check.fix and "--use-dynamic-batch-size" in check.fix
    assert report.check("export_policy").detail == "explicit export (2 record(s)): the policy does not apply"
    credited = await _doctor(tiny_model_dir, tmp_path, "two_contexts", custom_advantage=True)
    assert credited.check("multi_context_credit").status == "pass"


@pytest.mark.slow
async def test_reasoning_left_in_the_text_by_a_missing_parser(tiny_model_dir: Path, tmp_path: Path) -> None:
    report = await _doctor(tiny_model_dir, tmp_path, "think", reply="<think>2 and 3 make 5</think>5")
    assert _failed(report) == ["parsers"]
    check = report.check("parsers")
    assert check.detail.startswith("a reply's text holds reasoning markup '<think>' that the reasoning "
                                   "parser (none) left in content")
    assert "--agentic-reasoning-parser" in check.fix


@pytest.mark.slow
async def test_a_tool_call_left_in_the_text_by_a_missing_parser(tiny_model_dir: Path, tmp_path: Path) -> None:
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    report = await _doctor(tiny_model_dir, tmp_path, "tools", reply=call)
    assert _failed(report) == ["parsers"]
    check = report.check("parsers")
    assert "tool-call markup '<tool_call>'" in check.detail and "(none) left as text" in check.detail
    assert "--agentic-tool-call-parser" in check.fix and "hermes" in check.fix
    # Without tools in the request the same text is the harness's own protocol: not flagged.
    plain = await _doctor(tiny_model_dir, tmp_path, "think", reply=call)
    assert plain.check("parsers").status == "pass"


@pytest.mark.slow
async def test_too_few_external_slots_and_a_client_timeout_below_the_longest_hold(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    report = await _doctor(tiny_model_dir, tmp_path, "medium_timeout", external_slots=3,
                           agentic_concurrency=2, n_samples_per_prompt=2, partial_rollout=True)
    assert _failed(report) == ["capacity", "longest_hold"]
    capacity = report.check("capacity")
    assert capacity.detail.startswith("the executor's 3 slots are fewer than the 4 required: T=4")
    hold = report.check("longest_hold")
    # 600 s barrier + 60 s of agent time + 300 s update: 960 s, the client waits 700 s.
    assert hold.detail.startswith("the client gives up after 700 s but a request can be held 960 s")
    assert report.check("client_timeout").status == "pass"  # 700 s >= --min-client-timeout 600 s


def _obs(tmp_path: Path, timeouts: list[float | None]) -> Observation:
    requests = [RequestRecord(method="POST", path="/agentic_api/v1/chat/completions", status=200,
                              supported=True, client_timeout_s=t) for t in timeouts]
    return Observation(log_path=tmp_path / "agent.log", started=True, requests=requests, return_code=0)


def _check(obs: Observation, name: str, **integration) -> tuple[str, str]:
    checks = evaluate_integration(obs, IntegrationConfig(**integration), agent_timeout_s=1800,
                                  tool_call_parser="hermes", reasoning_parser=None)
    check = next(c for c in checks if c.name == name)
    return check.status, check.detail


def test_the_capacity_rows_of_the_formula(tmp_path: Path) -> None:
    obs = _obs(tmp_path, [3600])
    assert _check(obs, "capacity")[0] == "pass"  # no executor declared
    assert _check(obs, "capacity", external_slots=4, agentic_concurrency=2, n_samples_per_prompt=2)[0] == "pass"
    # Eval with G=8 derives C = ceil(4 / 8) = 1, E = 8: max(T, E_peak) = 8 slots ...
    status, detail = _check(obs, "capacity", external_slots=7, agentic_concurrency=2, n_samples_per_prompt=2,
                            eval_group_sizes=(8,))
    assert status == "fail" and "fewer than the 8 required" in detail
    # ... and T + E_peak = 12 when train Sessions stay resident during eval.
    status, detail = _check(obs, "capacity", external_slots=8, agentic_concurrency=2, n_samples_per_prompt=2,
                            eval_group_sizes=(8,), prelaunch=True)
    assert status == "fail" and "fewer than the 12 required" in detail


def test_the_longest_hold(tmp_path: Path) -> None:
    assert longest_hold_s(IntegrationConfig(), 1800) == 600
    assert longest_hold_s(IntegrationConfig(fully_async=True), 1800) == 600 + 1800 + 300
    assert longest_hold_s(IntegrationConfig(first_request_timeout_s=0), 1800) == float("inf")
    assert _check(_obs(tmp_path, [3600]), "longest_hold") == (
        "pass", "client timeout 3600 s >= longest hold 600 s (--agent-first-request-timeout 600 s)")
    status, detail = _check(_obs(tmp_path, [3600, 1200]), "longest_hold", prelaunch=True)
    assert status == "fail" and detail.startswith("the client gives up after 1200 s but a request can be "
                                                  "held 2700 s")
    status, detail = _check(_obs(tmp_path, [None]), "longest_hold", partial_rollout=True)
    assert status == "pass" and detail.startswith("the client announces no timeout; make sure it waits >= 2700 s")


def test_all_leaves_without_custom_advantage_fails_before_any_export(tmp_path: Path) -> None:
    obs = _obs(tmp_path, [3600])
    status, detail = _check(obs, "multi_context_credit", export_policy="all-leaves")
    assert status == "fail" and detail.startswith("--agentic-export-policy all-leaves exports every leaf")
    assert _check(obs, "multi_context_credit", export_policy="all-leaves", custom_advantage=True)[0] == "pass"


def _doctor_args(tmp_path: Path, *flags: str) -> DoctorConfig:
    parser = argparse.ArgumentParser()
    add_doctor_parser(parser.add_subparsers(dest="command"))
    return doctor_config(parser.parse_args(["doctor", "--agent-cwd", str(tmp_path), "--agent-command", "true",
                                            *flags]))


def test_the_doctor_flags_become_the_integration_settings(tmp_path: Path) -> None:
    plain = _doctor_args(tmp_path).integration
    assert plain == IntegrationConfig()
    cfg = _doctor_args(tmp_path, "--agentic-export-policy", "final", "--agent-external-slots", "8",
                       "--agentic-concurrency", "2", "--n-samples-per-prompt", "4",
                       "--n-samples-per-eval-prompt", "8", "16", "--agentic-eval-concurrency", "1",
                       "--partial-rollout", "--train-first-request-timeout", "0", "--update-time", "60").integration
    assert cfg == IntegrationConfig(export_policy="final", external_slots=8, agentic_concurrency=2,
                                    n_samples_per_prompt=4, eval_group_sizes=(8, 16), agentic_eval_concurrency=1,
                                    partial_rollout=True, first_request_timeout_s=0, update_s=60)
    with pytest.raises(ConfigError, match="--agent-external-slots must be >= 1"):
        _doctor_args(tmp_path, "--agent-external-slots", "0")
    with pytest.raises(ConfigError, match="--update-time"):
        _doctor_args(tmp_path, "--update-time", "-1")


def test_the_doctor_holds_with_trainings_agent_timeout_by_default(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers(dest="command"))
    train = parser.parse_args(["train"]).agent_timeout
    doctor = _doctor_args(tmp_path, "--partial-rollout")
    assert doctor.agent.timeout_s == train == AgentConfig(command="true", cwd=tmp_path).timeout_s
    # The default estimate is the run's: 600 s barrier + 1800 s of agent time + 300 s update.
    checks = evaluate_integration(_obs(tmp_path, [2000]), doctor.integration, agent_timeout_s=doctor.agent.timeout_s,
                                  tool_call_parser=None, reasoning_parser=None)
    hold = next(c for c in checks if c.name == "longest_hold")
    assert hold.status == "fail" and "can be held 2700 s" in hold.detail
