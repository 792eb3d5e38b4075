"""examples/claude_code with the real CLI at the edges of what it sends and waits for.

Tool search (``ENABLE_TOOL_SEARCH``): on, Claude Code 2.1.332 sends a ``ToolSearch`` tool plus a
placeholder tool with ``defer_loading: true``; relaxtrio answers 400 naming the variable and
``defer_loading``, and the CLI sends the request again without deferred tools, so the Session
stays clean and no deferred tool reaches the prompt. Off (the example's setting), no 400 at all.

Retry envelope: Claude Code's stream watchdog gives up on a stream that has sent nothing for
300 s (the floor of ``CLAUDE_STREAM_IDLE_TIMEOUT_MS``: a lower value is raised to it, so the test
cannot shorten it and holds for real) and sends the request again; it exits at once on a
``Retry-After`` over 60 s, which relaxtrio never sends. relaxtrio holds requests for minutes (a
Group waiting to start, a weight update). A generation held 330 s must cost no sample and add no
branch. With Buffered SSE's ping every 15 s the watchdog does not fire (the job's log shows no
client disconnect), and were it to fire, the resent request would have to find the held
generation: either way one generation answers the task turn.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from tests.examples.test_example_coding_clis import FIX, _call, _rules
from tests.support.examples import REPO, ExampleRun, assert_response_masks, run_example

from relaxtrio.models import load_tokenizer
from relaxtrio.testing.scripted_engine import Reply
from relaxtrio.testing.scripted_server import rules_engine

pytestmark = [pytest.mark.slow,  # starts real processes
              pytest.mark.skipif(not (REPO / ".tools/npm/bin/claude").exists(),
                                 reason="claude is not installed (scripts/install_clis.sh)")]

BASH_FIX = _call("Bash", {"command": FIX, "description": "Make add add"})
HOLD_S = 330.0


def _decoded(run: ExampleRun, model_dir: Path) -> str:
    [sample] = run.samples
    return load_tokenizer(model_dir).decode(sample["token_ids"])


def _check_fixed(run: ExampleRun) -> dict:
    assert run.returncode == 0, run.output[-3000:]
    [sample] = run.samples
    assert sample["reward"] == 1.0 and sample["metadata"]["tests_passed"] is True
    assert assert_response_masks(sample) == 2  # the Bash call, then the final text
    return sample


@pytest.mark.parametrize("tool_search", ["true", "false"])
async def test_tool_search_is_refused_by_name_and_claude_code_goes_on_without_it(
        tool_search: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    run = await run_example("claude_code", tmp_path, tiny_model_dir, rules=_rules(BASH_FIX), command="rollout",
                            args=["--agentic-export-policy", "final"], agent_env=[f"ENABLE_TOOL_SEARCH={tool_search}"])
    _check_fixed(run)
    refusals = [line for line in run.output.splitlines() if "request rejected" in line]
    if tool_search == "true":
        assert refusals and all("defer_loading" in line and "ENABLE_TOOL_SEARCH=false" in line for line in refusals)
    else:
        assert not refusals
    prompt = _decoded(run, tiny_model_dir)
    assert "DeferredToolPlaceholder" not in prompt and '"name": "ToolSearch"' not in prompt


async def test_a_generation_held_past_the_cli_watchdog_costs_no_sample_and_no_branch(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    tokenizer = load_tokenizer(tiny_model_dir)
    engine = rules_engine(tokenizer, tokenizer.eos_token_id, _rules(BASH_FIX))
    choose = engine.replies
    assert callable(choose)
    held, gate = trio.Event(), trio.Event()

    def hold_first_task_turn(input_ids: tuple[int, ...]) -> Reply:
        reply = choose(input_ids)
        if reply.text == BASH_FIX and not held.is_set():
            held.set()
            return Reply(text=reply.text, finish=reply.finish, gate=gate)
        return reply

    engine.replies = hold_first_task_turn

    async def open_gate_late() -> None:
        await held.wait()
        await trio.sleep(HOLD_S)  # real time: the CLI's watchdog runs on the wall clock
        gate.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(open_gate_late)
        run = await run_example("claude_code", tmp_path, tiny_model_dir, engine=engine, command="rollout",
                                args=["--agentic-export-policy", "final", "--agent-timeout", "900"], timeout_s=1000)
    assert gate.is_set()
    _check_fixed(run)
    task_turns = [rid for ids, _, rid in engine.calls if choose(ids).text == BASH_FIX]
    assert len(task_turns) == 1, task_turns  # the resent request got the held generation
    [session] = run.sessions()
    [metrics] = [json.loads(line) for line in (run.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics["unexported_branches"] == 0 and metrics["aborted_requests"] == 0, metrics
    assert run.samples[0]["state_hash"] in session["forest"]["leaves"]
