"""A vision agent (openai SDK): it sees the dataset image and may zoom into a quadrant with a tool
whose result is an image, then answers.

The task's first user message carries the dataset image as an ``image_url`` data URI (relaxtrio
converts the dataset's ``<image>`` + ``images`` field into that shape). The ``zoom`` tool crops
one quadrant of that image with pillow, scales it up 2x, and returns it as an image in the tool
result (text + ``image_url`` content parts). Reward: 1.0 when the final answer names the colour of
the quadrant the question asks about. Talks to ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import re
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI
from PIL import Image

QUADRANTS = ("top_left", "top_right", "bottom_left", "bottom_right")
TOOLS = [{"type": "function", "function": {
    "name": "zoom",
    "description": "Zoom into one quadrant of the image; returns the enlarged quadrant as an image.",
    "parameters": {"type": "object", "properties": {"quadrant": {"type": "string", "enum": list(QUADRANTS)}},
                   "required": ["quadrant"]},
}}]


def first_image(messages: list[dict[str, Any]]) -> Image.Image:
    for message in messages:
        for part in message.get("content") if isinstance(message.get("content"), list) else []:
            if part.get("type") == "image_url":
                data = part["image_url"]["url"].split(",", 1)[1]
                return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
    raise SystemExit("the task has no image")


def zoom(image: Image.Image, quadrant: str) -> list[dict[str, Any]]:
    if quadrant not in QUADRANTS:
        return [{"type": "text", "text": f"unknown quadrant {quadrant!r}; use one of {list(QUADRANTS)}"}]
    w, h = image.size
    left = w // 2 if quadrant.endswith("right") else 0
    top = h // 2 if quadrant.startswith("bottom") else 0
    crop = image.crop((left, top, left + w // 2, top + h // 2)).resize((w, h))
    buffer = io.BytesIO()
    crop.save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    return [{"type": "text", "text": f"{quadrant} quadrant, enlarged:"},
            {"type": "image_url", "image_url": {"url": url}}]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input-json", type=Path, required=True)
    parser.add_argument("--output-json", type=Path, required=True)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    task = json.loads(args.input_json.read_text(encoding="utf-8"))
    messages = task["messages"]
    answer = str(task.get("metadata", {}).get("answer", ""))
    image = first_image(messages)
    client = AsyncOpenAI(timeout=3600, max_retries=2)  # requests may be held for a long time
    zooms, final = 0, ""
    for _ in range(args.max_turns):
        response = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                        max_tokens=args.max_tokens)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            final = message.content or ""
            break
        for call in message.tool_calls:
            zooms += 1
            try:
                quadrant = str(json.loads(call.function.arguments or "{}").get("quadrant", ""))
            except json.JSONDecodeError:
                quadrant = ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": zoom(image, quadrant)})
    reward = 1.0 if answer and re.search(rf"\b{re.escape(answer)}\b", final, re.I) else 0.0
    args.output_json.write_text(json.dumps({"reward": reward, "metadata": {"zooms": zooms}}), encoding="utf-8")
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
