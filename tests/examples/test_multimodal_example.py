"""examples/vision_zoom through ``python -m relaxtrio rollout``: the dataset image, then an image
that the agent's own tool produced (a tool result with an ``image_url`` part)."""

from __future__ import annotations

import pytest

from pathlib import Path

from tests.support.examples import assert_response_masks, run_example

from relaxtrio.testing.scripted_server import Rule

pytestmark = pytest.mark.slow  # starts real processes

_END = r"<\|im_end\|>\n<\|im_start\|>assistant\n$"
_IMAGE = r"<\|vision_start\|>(<\|image_pad\|>)+<\|vision_end\|>"
RULES = [
    Rule(match=r"top_right quadrant, enlarged:" + _IMAGE + r"\n</tool_response>" + _END,
         reply="The top right quadrant is green."),
    Rule(match=r"^.*" + _IMAGE + r"What colour is the top right quadrant\?.*colour\." + _END,
         reply='<tool_call>\n{"name": "zoom", "arguments": {"quadrant": "top_right"}}\n</tool_call>'),
]


async def test_vision_agent_sends_the_dataset_image_and_a_tool_image(tiny_vlm_dir: Path,
                                                                      tmp_path: Path) -> None:
    run = await run_example("vision_zoom", tmp_path, tiny_vlm_dir, rules=RULES, command="rollout",
                            args=["--multimodal-keys", '{"image": "images"}'])
    assert run.returncode == 0, run.output[-3000:]
    [sample] = run.samples
    assert sample["name"] is None and sample["reward"] == 1.0 and sample["metadata"]["zooms"] == 1
    assert assert_response_masks(sample) == 2
    assert sample["num_multimodal_inputs"] >= 1
    assert run.engine is not None and len(run.engine.calls) == 2
