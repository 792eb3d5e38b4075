"""examples/claude_code, codex, opencode and qwen_code: the real CLIs (installed by scripts/install_clis.sh)
fix a tiny repository through ``python -m relaxtrio rollout``.

The CLIs' own prompts are 6.5k-19k tokens, beyond what a tiny model can follow, so a scripted
engine plays the model: it answers the harness's first request with a call of the harness's own
shell tool (hermes ``<tool_call>`` text, which relaxtrio parses and returns as the protocol's
tool-use item), and the request that carries the tool's result with a final text. The tool runs
for real in the Session's copy of the repository, and the repository's test decides the reward.
opencode's title request (another system prompt: a side conversation in its own subtree) gets a
short title; ``--agentic-export-policy final`` trains the main conversation only. Any other
request finds no rule and fails the test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tests.support.examples import REPO, assert_response_masks, run_example

from relaxtrio.testing.scripted_server import Rule

pytestmark = pytest.mark.slow  # starts real processes

BIN = REPO / ".tools" / "npm" / "bin"
_END = r"<\|im_end\|>\n<\|im_start\|>assistant\n$"
FIX = "sed -i 's/a - b/a + b/' calc.py"


def _call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _needs(cli: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not (BIN / cli).exists(), reason=f"{cli} is not installed (scripts/install_clis.sh)")


def _rules(tool_call: str) -> list[Rule]:
    return [
        Rule(match=r"You are a title generator.*" + _END, reply="Fix calc.add"),  # opencode's side call
        Rule(match=r"</tool_response>.*" + _END, reply="Fixed calc.add; the test passes now. Done."),
        Rule(match=r"calc\.add returns the wrong result.*" + _END, reply=tool_call),
    ]


async def _run_cli(example: str, tmp_path: Path, model_dir: Path, tool_call: str):
    run = await run_example(example, tmp_path, model_dir, rules=_rules(tool_call), command="rollout",
                            args=["--agentic-export-policy", "final"])
    assert run.returncode == 0, run.output[-3000:]
    [sample] = run.samples
    assert sample["name"] is None
    assert sample["reward"] == 1.0 and sample["metadata"]["tests_passed"] is True
    assert assert_response_masks(sample) == 2  # the tool call, then the final text
    return run, sample


def _turn_limits(run) -> set[int]:
    """The token limit each generation was given (the request's own, cut to the window's room)."""
    assert run.engine is not None
    return {sampling.max_new_tokens for _, sampling, _ in run.engine.calls}


@_needs("claude")
async def test_claude_code_fixes_the_repository(tiny_model_dir: Path, tmp_path: Path) -> None:
    run, _ = await _run_cli("claude_code", tmp_path, tiny_model_dir,
                            _call("Bash", {"command": FIX, "description": "Make add add"}))
    # CLAUDE_CODE_MAX_OUTPUT_TOKENS from RELAX_MAX_RESPONSE_TOKENS (--rollout-max-response-len 512):
    # unmapped, Claude Code asks an unknown model for 32000 tokens a turn.
    assert _turn_limits(run) == {512}


@_needs("codex")
async def test_codex_fixes_the_repository(tiny_model_dir: Path, tmp_path: Path) -> None:
    run, _ = await _run_cli("codex", tmp_path, tiny_model_dir, _call("exec_command", {"cmd": FIX}))
    # With its default features Codex sends its sub-agent tools as a Responses namespace tool:
    # served, the model sees them as function tools (it was a 400 on every request).
    assert run.engine is not None
    prompt = run.engine.tokenizer.decode(run.engine.calls[0][0])
    assert '"name": "spawn_agent"' in prompt


@_needs("opencode")
async def test_opencode_fixes_the_repository(tiny_model_dir: Path, tmp_path: Path) -> None:
    run, sample = await _run_cli("opencode", tmp_path, tiny_model_dir,
                                 _call("bash", {"command": FIX, "description": "Make add add"}))
    assert _turn_limits(run) == {512}  # the model's limit.output from RELAX_MAX_RESPONSE_TOKENS
    [session] = run.sessions()
    assert len(session["forest"]["leaves"]) == 2  # the title conversation and the task
    assert sample["state_hash"] in session["forest"]["leaves"]


SUBTASK = "SUBTASK-7f3: apply the fix with exec_command"
_SUB = r'(?<!"message": ")' + SUBTASK  # the sub-agent's own task text, not the parent's call of it


@_needs("codex")
async def test_codex_spawns_a_sub_agent_through_relaxtrio(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Codex's default namespace tool end to end: the policy calls ``spawn_agent`` (returned as a
    ``function_call`` with its namespace), Codex starts the sub-agent, and the sub-agent's own
    requests reach relaxtrio with its task as their user message."""
    rules = [
        Rule(match=_SUB + r".*</tool_response>.*" + _END, reply="Sub-agent: fixed calc.add."),
        Rule(match=_SUB + r".*" + _END, reply=_call("exec_command", {"cmd": FIX})),
        Rule(match=r"</tool_response>.*</tool_response>.*" + _END, reply="Delegated; done."),
        Rule(match=r"</tool_response>.*" + _END, reply=_call("wait_agent", {})),
        Rule(match=r"calc\.add returns the wrong result.*" + _END, reply=_call("spawn_agent", {"message": SUBTASK})),
        Rule(match=r".*", reply="Done."),
    ]
    run = await run_example("codex", tmp_path, tiny_model_dir, rules=rules, command="rollout",
                            args=["--agentic-export-policy", "final"])
    assert run.returncode == 0, run.output[-3000:]
    assert run.engine is not None
    prompts = [run.engine.tokenizer.decode(ids) for ids, _, _ in run.engine.calls]
    sub = re.compile(_SUB)
    as_user = re.compile(r"<\|im_start\|>user\n(?:(?!<\|im_end\|>).)*" + SUBTASK, re.S)
    assert any(as_user.search(p) for p in prompts), "no request of the spawned sub-agent reached relaxtrio"
    assert any('"name": "spawn_agent"' in p and not sub.search(p) for p in prompts)  # the parent's turns


@_needs("qwen")
async def test_qwen_code_fixes_the_repository(tiny_model_dir: Path, tmp_path: Path) -> None:
    # qwen-code refuses ``sed -i`` on a file it has not read (read_file takes absolute paths
    # only, unknown to a scripted reply): the fix edits through python instead.
    fix = "python -c \"import pathlib; p = pathlib.Path('calc.py'); p.write_text(p.read_text().replace('a - b', 'a + b'))\""
    await _run_cli("qwen_code", tmp_path, tiny_model_dir,
                   _call("run_shell_command", {"command": fix, "description": "Make add add", "is_background": False}))
