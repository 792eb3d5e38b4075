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


@_needs("claude")
async def test_claude_code_fixes_the_repository(tiny_model_dir: Path, tmp_path: Path) -> None:
    await _run_cli("claude_code", tmp_path, tiny_model_dir,
                   _call("Bash", {"command": FIX, "description": "Make add add"}))


@_needs("codex")
async def test_codex_fixes_the_repository(tiny_model_dir: Path, tmp_path: Path) -> None:
    await _run_cli("codex", tmp_path, tiny_model_dir, _call("exec_command", {"cmd": FIX}))


@_needs("opencode")
async def test_opencode_fixes_the_repository(tiny_model_dir: Path, tmp_path: Path) -> None:
    run, sample = await _run_cli("opencode", tmp_path, tiny_model_dir,
                                 _call("bash", {"command": FIX, "description": "Make add add"}))
    [session] = run.sessions()
    assert len(session["forest"]["leaves"]) == 2  # the title conversation and the task
    assert sample["state_hash"] in session["forest"]["leaves"]


@_needs("qwen")
async def test_qwen_code_fixes_the_repository(tiny_model_dir: Path, tmp_path: Path) -> None:
    # qwen-code refuses ``sed -i`` on a file it has not read (read_file takes absolute paths
    # only, unknown to a scripted reply): the fix edits through python instead.
    fix = "python -c \"import pathlib; p = pathlib.Path('calc.py'); p.write_text(p.read_text().replace('a - b', 'a + b'))\""
    await _run_cli("qwen_code", tmp_path, tiny_model_dir,
                   _call("run_shell_command", {"command": fix, "description": "Make add add", "is_background": False}))
