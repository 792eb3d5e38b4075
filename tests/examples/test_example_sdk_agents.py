"""examples/anthropic_tools and examples/agents_sdk through ``python -m relaxtrio rollout``.

The scripted engine answers with the tool call the harness declared (hermes ``<tool_call>``
text, parsed by relaxtrio into the protocol's own tool-use item), then with the final answer once
the tool result is in the prompt.
"""

from __future__ import annotations

import pytest

from pathlib import Path

from tests.support.examples import assert_response_masks, run_example

from relaxtrio.testing.scripted_server import Rule

pytestmark = pytest.mark.slow  # starts real processes

_TURN_END = r"<\|im_end\|>\n<\|im_start\|>assistant\n$"


async def test_anthropic_tool_use_loop(tiny_model_dir: Path, tmp_path: Path) -> None:
    rules = [
        Rule(match=r"<tool_response>\nNairobi\n</tool_response>" + _TURN_END,
             reply="The capital of Kenya is Nairobi."),
        Rule(match=r"capital of Kenya\?" + _TURN_END,
             reply='<tool_call>\n{"name": "lookup_capital", "arguments": {"country": "Kenya"}}\n</tool_call>'),
    ]
    run = await run_example("anthropic_tools", tmp_path, tiny_model_dir, rules=rules, command="rollout")
    assert run.returncode == 0, run.output[-3000:]
    [sample] = run.samples
    assert sample["name"] is None and sample["reward"] == 1.0 and sample["metadata"]["tool_uses"] == 1
    assert assert_response_masks(sample) == 2


async def test_agents_sdk_over_responses(tiny_model_dir: Path, tmp_path: Path) -> None:
    rules = [
        Rule(match=r"<tool_response>\n4200 m\n</tool_response>" + _TURN_END,
             reply="4.2 km is 4200 m. Answer: 4200"),
        Rule(match=r"metres are 4\.2 km\?" + _TURN_END,
             reply='<tool_call>\n{"name": "convert_length", "arguments": '
                   '{"value": 4.2, "from_unit": "km", "to_unit": "m"}}\n</tool_call>'),
    ]
    run = await run_example("agents_sdk", tmp_path, tiny_model_dir, rules=rules, command="rollout")
    assert run.returncode == 0, run.output[-3000:]
    [sample] = run.samples
    assert sample["name"] is None and sample["reward"] == 1.0 and sample["metadata"]["conversions"] == 1
    assert assert_response_masks(sample) == 2
