"""Writes examples/deepeyes_agentic/data: small scenes with one tiny number somewhere, and the
questions over them (``python make_data.py``; seeded, so the rows are reproducible).

Each 160x160 image has a few coloured boxes and one two-digit number drawn in a small font on a
white tag: too small to read at the resolution a vision model sees the whole image at, readable
once the agent crops around it. The task row keeps the dataset's ``<image>`` placeholder and the
image path in ``images`` (``--multimodal-keys '{"image": "images"}'``), the answer and the tag's
box in ``metadata``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

HERE = Path(__file__).resolve().parent
SIZE = 160
NUM_IMAGES = 4
COLOURS = ["#c0392b", "#2980b9", "#27ae60", "#8e44ad", "#f39c12", "#16a085"]
QUESTION = ("<image>A small number is written on a white tag somewhere in this image. What is it? "
            "You may zoom in with the image_zoom_in_tool, several times if needed. "
            "Give the final answer between <answer> and </answer>.")


def make_image(rng: random.Random) -> tuple[Image.Image, str, list[int]]:
    """One scene, its number, and the tag's box ``[x1, y1, x2, y2]`` in pixels."""
    image = Image.new("RGB", (SIZE, SIZE), "#dfe6e9")
    draw = ImageDraw.Draw(image)
    for _ in range(5):
        x, y = rng.randrange(0, SIZE - 40), rng.randrange(0, SIZE - 40)
        draw.rectangle([x, y, x + rng.randrange(16, 40), y + rng.randrange(16, 40)], fill=rng.choice(COLOURS))
    number = str(rng.randrange(10, 100))
    x, y = rng.randrange(4, SIZE - 20), rng.randrange(4, SIZE - 14)
    box = [x, y, x + 15, y + 10]
    draw.rectangle(box, fill="white")
    draw.text((x + 2, y), number, fill="black", font=ImageFont.load_default(size=9))
    return image, number, box


def main() -> None:
    rng = random.Random(1)
    rows = []
    for i in range(NUM_IMAGES):
        image, number, box = make_image(rng)
        name = f"scene_{i}.png"
        image.save(HERE / "data" / name)
        rows.append({"input": [{"role": "user", "content": QUESTION}], "images": [name],
                     "metadata": {"answer": number, "tag_box": box}})
    with (HERE / "data" / "train.jsonl").open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    main()
