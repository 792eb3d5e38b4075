"""examples/deepeyes_agentic: DeepEyes-style thinking with images through ``python -m relaxtrio
rollout`` (the dataset image, then several crop turns whose results are images, one of them a
bad box, and a reward on the final answer), plus the environment's crop, box checks and reward."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
from pathlib import Path
from types import ModuleType

import pytest
from PIL import Image
from tests.support.examples import EXAMPLES, assert_response_masks, run_example

from relaxtrio.testing.scripted_server import Rule

HERE = EXAMPLES / "deepeyes_agentic"
_END = r"<\|im_end\|>\n<\|im_start\|>assistant\n$"
_IMAGE = r"<\|vision_start\|>(<\|image_pad\|>)+<\|vision_end\|>"


def _env() -> ModuleType:
    found = importlib.util.spec_from_file_location("env_deepeyes", HERE / "app" / "env_deepeyes.py")
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def _zoom(*box: float, label: str | None = None) -> str:
    arguments: dict[str, object] = {"bbox_2d": list(box)}
    if label:
        arguments["label"] = label
    return f'<tool_call>\n{json.dumps({"name": "image_zoom_in_tool", "arguments": arguments})}\n</tool_call>'


# scene_0: the tag "44" at [62, 30, 77, 40]. A coarse crop, a degenerate box, a tight crop, the answer.
RULES = [
    Rule(match=r"Zoomed in on \[60, 28, 80, 42\]:" + _IMAGE + r"\n</tool_response>" + _END,
         reply="The tag reads 44. <answer>44</answer>"),
    Rule(match=r"Zoom failed: the box .*</tool_response>" + _END, reply=_zoom(60, 28, 80, 42)),
    Rule(match=r"Zoomed in on \[40, 10, 100, 60\] \(white tag\):" + _IMAGE + r"\n</tool_response>" + _END,
         reply=_zoom(70, 35, 71, 36)),
    Rule(match=r"^.*" + _IMAGE + r"A small number is written.*</answer>\." + _END,
         reply=_zoom(40, 10, 100, 60, label="white tag")),
]


@pytest.mark.slow  # starts real processes
async def test_crops_come_back_as_images_over_several_turns(tiny_vlm_dir: Path, tmp_path: Path) -> None:
    run = await run_example("deepeyes_agentic", tmp_path, tiny_vlm_dir, rules=RULES, command="rollout",
                            args=["--multimodal-keys", '{"image": "images"}', "--reward-key", "score"])
    assert run.returncode == 0, run.output[-3000:]
    [sample] = run.samples
    assert sample["name"] is None
    assert sample["metadata"].items() >= {"crops": 2, "invalid_crops": 1, "turns": 4, "answered": True}.items()
    assert assert_response_masks(sample) == 4
    assert run.engine is not None and len(run.engine.calls) == 4
    # The lineage's media: the dataset image and both crops.
    assert sample["num_multimodal_inputs"] == 3
    assert sample["reward"] == {"score": pytest.approx(1.2), "accuracy": 1.0, "tool_bonus": 1.0}
    metrics = [json.loads(line) for line in (run.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["rollout/raw_reward"] == pytest.approx(1.2)  # --reward-key score


def _png(size: tuple[int, int]) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, "white").save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_a_crop_is_the_box_enlarged_and_a_bad_box_is_named() -> None:
    env = _env()
    image = Image.open(HERE / "data" / "scene_0.png").convert("RGB")
    content, ok = env.tool_result(image, json.dumps({"bbox_2d": [77, 40, 62, 30], "label": "tag"}))
    assert ok and content[0] == {"type": "text", "text": "Zoomed in on [62, 30, 77, 40] (tag):"}
    url = content[1]["image_url"]["url"]
    crop = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert crop.size == (168, 112)  # 15x10 enlarged to a 112-pixel shorter side
    assert env.parse_box('{"bbox_2d": [-5, 150.5, 20.2, 170]}', (160, 160)) == ((0, 150, 21, 160), "")
    for arguments, says in [("{", "not JSON"), ('{"bbox_2d": [1, 2, 3]}', "four numbers"),
                            ('{"bbox_2d": [1, 2, "3", 4]}', "four numbers"), ('{"bbox_2d": [1, 1, 3, 30]}', "less than"),
                            ('{"bbox_2d": [170, 170, 200, 200]}', "less than")]:
        content, ok = env.tool_result(image, arguments)
        assert not ok and says in content[0]["text"] and len(content) == 1
    messages = [{"role": "system", "content": "s"},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": _png((5, 7))}}]}]
    assert env.first_image(messages).size == (5, 7)
    with pytest.raises(ValueError, match="no data-URI image"):
        env.first_image(messages[:1])


def test_the_reward_pays_the_right_answer_and_tool_use_only_with_it() -> None:
    score = _env().score
    assert score("I see <answer> 44 </answer>", "44", crops=1) == {"score": 1.2, "accuracy": 1.0, "tool_bonus": 1.0}
    assert score("<answer>44</answer>", "44", crops=0) == {"score": 1.0, "accuracy": 1.0, "tool_bonus": 0.0}
    assert score("<answer>45</answer>", "44", crops=3) == {"score": 0.0, "accuracy": 0.0, "tool_bonus": 0.0}
    assert score("44", "44", crops=1)["accuracy"] == 0.0  # no answer tags
    assert score(None, "44", crops=2)["score"] == 0.0  # the turns ran out


def test_every_shipped_tag_is_inside_its_image() -> None:
    for line in (HERE / "data" / "train.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert row["input"][0]["content"].count("<image>") == len(row["images"]) == 1
        with Image.open(HERE / "data" / row["images"][0]) as image:
            x1, y1, x2, y2 = row["metadata"]["tag_box"]
            assert 0 <= x1 < x2 <= image.width and 0 <= y1 < y2 <= image.height
