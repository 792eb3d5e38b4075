"""DeepEyes-style "thinking with images" (openai SDK): the model looks at the dataset image, zooms
into regions it chooses with a bounding-box crop tool, sees each crop as an image in the next
turn, and answers.

The environment:

- **Input.** The task's first user message carries the dataset image as an ``image_url`` data URI
  (relaxtrio converts the row's ``<image>`` placeholder and ``images`` field, mapped with
  ``--multimodal-keys '{"image": "images"}'``, into that shape before the agent starts).
- **Tool.** ``image_zoom_in_tool(bbox_2d=[x1, y1, x2, y2], label=...)`` crops that box (pixels of
  the original image, clamped to it) out of the original image and enlarges it so that its
  shorter side is at least ``MIN_VIEW_SIDE`` pixels (small text becomes legible). Its result is a
  tool message whose content is a text part and an ``image_url`` part (a PNG data URI): an image
  observation in the next turn. A malformed or degenerate box gets a text-only result saying
  what is wrong, and the model may try again.
- **Turns.** Up to ``DEEPEYES_MAX_TURNS`` model replies (default 5); every reply with tool calls
  is answered and the conversation continues, so a model can zoom several times (a crop of a
  crop's region, or another region). The first reply without tool calls is the final one.
- **Reward** on the final answer only (an object, ``--reward-key score``): ``accuracy`` is 1.0
  when the text between ``<answer>`` and ``</answer>`` equals ``metadata.answer`` (case and
  surrounding space ignored), else 0.0; ``tool_bonus`` is 1.0 when the answer is right *and*
  at least one crop succeeded; ``score = accuracy + TOOL_BONUS_WEIGHT * tool_bonus``. The bonus
  only pays for tool use that led to a right answer, so zooming is never rewarded by itself.

Export is implicit: one conversation, whose lineage carries the dataset image and every crop.
Metadata: ``crops``, ``invalid_crops``, ``turns``, ``answered``.

Settings: ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` (the model), ``DEEPEYES_MAX_TURNS``,
``DEEPEYES_MAX_TOKENS`` (per reply, default 512). Run: ``python app/env_deepeyes.py --input-json
IN --output-json OUT`` (``run_agent_app.sh`` maps relaxtrio's ``RELAX_`` variables).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from openai import OpenAI
from PIL import Image

MIN_BOX_SIDE = 4  # pixels of the original image: a thinner box shows nothing
MIN_VIEW_SIDE = 112  # pixels: crops are enlarged to at least this on their shorter side
MAX_VIEW_SIDE = 896  # pixels: and at most this on their longer side
TOOL_BONUS_WEIGHT = 0.2
TOOLS = [{"type": "function", "function": {
    "name": "image_zoom_in_tool",
    "description": "Zoom in on a region of the original image; returns the region, enlarged, as an image.",
    "parameters": {"type": "object", "properties": {
        "bbox_2d": {"type": "array", "items": {"type": "number"}, "minItems": 4, "maxItems": 4,
                    "description": "the region as [x1, y1, x2, y2], in pixels of the original image"},
        "label": {"type": "string", "description": "what you expect to find in the region"},
    }, "required": ["bbox_2d"]},
}}]
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def first_image(messages: list[dict[str, Any]]) -> Image.Image:
    """The first ``image_url`` data URI of the messages, decoded.

    Raises:
        ValueError: no message carries a data-URI image.
    """
    for message in messages:
        content = message.get("content")
        for part in content if isinstance(content, list) else []:
            url = part.get("image_url", {}).get("url", "") if part.get("type") == "image_url" else ""
            if url.startswith("data:"):
                return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")
    raise ValueError("the task has no data-URI image")


def parse_box(arguments: str, size: tuple[int, int]) -> tuple[tuple[int, int, int, int], str]:
    """The tool call's box, clamped to the image and rounded outwards, and its label.

    Raises:
        ValueError: the arguments are not a JSON object, ``bbox_2d`` is not four finite numbers,
            or the clamped box is thinner than ``MIN_BOX_SIDE``; the message says which.
    """
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        raise ValueError("the arguments are not JSON") from None
    box = args.get("bbox_2d") if isinstance(args, dict) else None
    if (not isinstance(box, list) or len(box) != 4
            or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in box)):
        raise ValueError("bbox_2d must be four numbers [x1, y1, x2, y2]")
    width, height = size
    x1, y1 = max(0, math.floor(min(box[0], box[2]))), max(0, math.floor(min(box[1], box[3])))
    x2, y2 = min(width, math.ceil(max(box[0], box[2]))), min(height, math.ceil(max(box[1], box[3])))
    if x2 - x1 < MIN_BOX_SIDE or y2 - y1 < MIN_BOX_SIDE:
        raise ValueError(f"the box {box} covers less than {MIN_BOX_SIDE}x{MIN_BOX_SIDE} pixels of the "
                         f"{width}x{height} image")
    return (x1, y1, x2, y2), str(args.get("label") or "")


def zoom(image: Image.Image, box: tuple[int, int, int, int]) -> Image.Image:
    """The box's region, enlarged so its shorter side is at least ``MIN_VIEW_SIDE`` pixels (and
    its longer side at most ``MAX_VIEW_SIDE``)."""
    crop = image.crop(box)
    scale = max(1.0, MIN_VIEW_SIDE / min(crop.size))
    scale = min(scale, max(1.0, MAX_VIEW_SIDE / max(crop.size)))
    return crop.resize((round(crop.width * scale), round(crop.height * scale)), Image.Resampling.BICUBIC)


def data_uri(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def tool_result(image: Image.Image, arguments: str) -> tuple[list[dict[str, Any]], bool]:
    """The content of one zoom call's tool message, and whether the crop succeeded."""
    try:
        box, label = parse_box(arguments, image.size)
    except ValueError as exc:
        return [{"type": "text", "text": f"Zoom failed: {exc}. Try another box."}], False
    where = f"[{', '.join(map(str, box))}]" + (f" ({label})" if label else "")
    return [{"type": "text", "text": f"Zoomed in on {where}:"},
            {"type": "image_url", "image_url": {"url": data_uri(zoom(image, box))}}], True


def score(final_text: str | None, answer: str, crops: int) -> dict[str, float]:
    """The reward object of a final reply (None: the turns ran out without one)."""
    found = _ANSWER.search(final_text or "")
    accuracy = 1.0 if found and found.group(1).strip().lower() == answer.strip().lower() else 0.0
    tool_bonus = 1.0 if accuracy and crops > 0 else 0.0
    return {"score": accuracy + TOOL_BONUS_WEIGHT * tool_bonus, "accuracy": accuracy, "tool_bonus": tool_bonus}


def run(client: OpenAI, messages: list[dict[str, Any]], max_turns: int, max_tokens: int) -> dict[str, Any]:
    """The tool loop on ``messages`` (extended in place); returns the final text and the counts."""
    image = first_image(messages)
    final, crops, invalid, turns = None, 0, 0, 0
    for _ in range(max_turns):
        turns += 1
        response = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                  max_tokens=max_tokens)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            final = message.content or ""
            break
        for call in message.tool_calls:
            if call.function.name == "image_zoom_in_tool":
                content, ok = tool_result(image, call.function.arguments)
            else:
                content, ok = [{"type": "text", "text": f"Unknown tool {call.function.name!r}."}], False
            crops, invalid = crops + ok, invalid + (not ok)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    return {"final": final, "crops": crops, "invalid_crops": invalid, "turns": turns}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input-json", type=Path, required=True)
    parser.add_argument("--output-json", type=Path, required=True)
    args = parser.parse_args()
    task = json.loads(args.input_json.read_text(encoding="utf-8"))
    # A request may be held while its Group starts or weights update: a long timeout.
    client = OpenAI(timeout=3600, max_retries=2)
    result = run(client, task["messages"], int(os.environ.get("DEEPEYES_MAX_TURNS", "5")),
                 int(os.environ.get("DEEPEYES_MAX_TOKENS", "512")))
    reward = score(result["final"], str(task["metadata"]["answer"]), result["crops"])
    metadata = {"crops": result["crops"], "invalid_crops": result["invalid_crops"], "turns": result["turns"],
                "answered": result["final"] is not None}
    args.output_json.write_text(json.dumps({"reward": reward, "metadata": metadata}), encoding="utf-8")


if __name__ == "__main__":
    main()
