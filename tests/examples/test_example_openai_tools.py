"""examples/openai_tools: the openai-SDK tool loop, through ``python -m relaxtrio rollout``."""

from __future__ import annotations

import pytest

from pathlib import Path

from tests.support.examples import assert_response_masks, run_example

from relaxtrio.testing.scripted_server import Rule

pytestmark = pytest.mark.slow  # starts real processes

# Two parallel calculator calls, then (after both results) the answer.
CALLS = ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 20 + 17 * 3"}}\n</tool_call>')
RULES = [
    Rule(match=r"<tool_response>\n391\n</tool_response>\n<tool_response>\n391\n</tool_response>"
               r"<\|im_end\|>\n<\|im_start\|>assistant\n$", reply="Both give 391. The answer is 391."),
    Rule(match=r"What is 17 \* 23\?<\|im_end\|>\n<\|im_start\|>assistant\n$", reply=CALLS),
]


async def test_openai_tool_loop_exports_one_context_with_two_responses(tiny_model_dir: Path,
                                                                       tmp_path: Path) -> None:
    run = await run_example("openai_tools", tmp_path, tiny_model_dir, rules=RULES, command="rollout")
    assert run.returncode == 0, run.output[-3000:]
    [sample] = run.samples
    assert sample["name"] is None  # implicit export: the one linear conversation
    assert sample["reward"] == 1.0 and sample["metadata"]["tool_calls"] == 2
    assert assert_response_masks(sample) == 2
    assert run.engine is not None and len(run.engine.calls) == 2
