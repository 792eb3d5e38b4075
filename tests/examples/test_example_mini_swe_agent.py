"""examples/mini_swe_agent: the real ``mini`` CLI (mini-swe-agent 2.4.6) fixing a tiny repository.

The scripted engine plays the model in mini-swe-agent's text format (one ``mswea_bash_command``
block per reply); the command runs for real in the Session's copy of the repository, and the
repository's own test decides the reward.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tests.support.examples import assert_response_masks, run_example

from relaxtrio.testing.scripted_server import Rule

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("mini") is None and not (
    Path(__import__("sys").executable).parent / "mini").exists(), reason="mini-swe-agent is not installed")]

_END = r"<\|im_end\|>\n<\|im_start\|>assistant\n$"
FIX = "THOUGHT: add subtracts; make it add.\n\n```mswea_bash_command\nsed -i 's/a - b/a + b/' calc.py\n```"
SUBMIT = "THOUGHT: fixed.\n\n```mswea_bash_command\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"
PROSE = "I would change the minus sign in calc.py to a plus sign."
SOLVE = [
    Rule(match=r"<returncode>0</returncode>.*" + _END, reply=SUBMIT),
    Rule(match=r"Please solve this issue:.*" + _END, reply=FIX),
]


async def test_mini_swe_agent_fixes_the_repository(tiny_model_dir: Path, tmp_path: Path) -> None:
    run = await run_example("mini_swe_agent", tmp_path, tiny_model_dir, rules=SOLVE, command="rollout")
    assert run.returncode == 0, run.output[-3000:]
    [sample] = run.samples
    assert sample["name"] is None and sample["reward"] == 1.0
    assert sample["metadata"]["tests_passed"] and sample["metadata"]["steps"] == 2
    assert assert_response_masks(sample) == 2


async def test_a_format_error_branch_is_left_out_by_the_final_policy(tiny_model_dir: Path,
                                                                     tmp_path: Path) -> None:
    # First reply is prose: mini-swe-agent drops it and resends the history plus a format-error
    # message (a second branch under the task); that branch then fixes and submits.
    rules = [SOLVE[0], Rule(match=r"Format error.*" + _END, reply=FIX),
             Rule(match=r"Please solve this issue:.*" + _END, reply=PROSE)]
    run = await run_example("mini_swe_agent", tmp_path, tiny_model_dir, rules=rules, command="rollout",
                            args=["--agentic-export-policy", "final"])
    assert run.returncode == 0, run.output[-3000:]
    [session] = run.sessions()
    assert len(session["forest"]["leaves"]) == 2
    [sample] = run.samples
    assert sample["reward"] == 1.0 and sample["metadata"]["steps"] == 2
    assert assert_response_masks(sample) == 2  # the fix and the submit; the prose is not trained
    assert sample["state_hash"] in session["forest"]["leaves"]
