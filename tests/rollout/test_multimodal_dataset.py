"""Dataset images: ``<image>`` placeholders joined with --multimodal-keys, and the conversions to
OpenAI ``image_url`` content at the process boundary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tests.support.images import data_url, decode_data_url, make_image, png_bytes

from relaxtrio import ConfigError, InvalidRequestError
from relaxtrio.media.images import decode_image_url, image_parts, to_image_url
from relaxtrio.rollout.dataset import load_prompts

KEYS = {"image": "images"}


def _write(path: Path, *rows: dict) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def test_placeholders_join_images_in_order_and_become_image_urls(tmp_path: Path) -> None:
    (tmp_path / "imgs").mkdir()
    rgba = make_image(30, 20, seed=1, mode="RGBA")
    rgba.save(tmp_path / "imgs" / "a.png")
    kept = data_url(28, 28, seed=2)
    data = _write(tmp_path / "data.jsonl",
                  {"input": [{"role": "user", "content": "<image>Describe this image."}],
                   "images": ["imgs/a.png"], "metadata": {"answer": "cat"}},
                  {"input": "Compare <image> with <image>.", "images": [kept, "https://example.com/b.png"]},
                  {"input": "A single <image>", "images": "https://example.com/c.png"})
    first, second, third = load_prompts(data, multimodal_keys=KEYS)

    assert first.messages[0]["content"] == [
        {"type": "image", "image": str((tmp_path / "imgs" / "a.png").resolve())},
        {"type": "text", "text": "Describe this image."},
    ]
    payload = first.session_input()
    assert payload["metadata"] == {"answer": "cat"}
    [message] = payload["messages"]
    image_part, text_part = message["content"]
    assert text_part == {"type": "text", "text": "Describe this image."}
    assert image_part["type"] == "image_url"
    converted = decode_data_url(image_part["image_url"]["url"])
    assert converted.mode == "RGB" and converted.size == (30, 20)
    assert np.array_equal(_pixels(converted), _pixels(rgba.convert("RGB")))
    json.dumps(payload)  # what RELAX_INPUT_JSON receives is plain JSON

    content = second.session_input()["messages"][0]["content"]
    assert content == [
        {"type": "text", "text": "Compare "},
        {"type": "image_url", "image_url": {"url": kept}},  # data: kept verbatim
        {"type": "text", "text": " with "},
        {"type": "image_url", "image_url": {"url": "https://example.com/b.png"}},  # never fetched
        {"type": "text", "text": "."},
    ]
    assert [p.url for p in image_parts(second.session_input()["messages"])] == [kept, "https://example.com/b.png"]
    assert third.session_input()["messages"][0]["content"][1] == {
        "type": "image_url", "image_url": {"url": "https://example.com/c.png"}}


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"input": "<image> and <image>", "images": ["https://x/1.png"]},
         "data.jsonl:1: the prompt has 2 <image> placeholder(s) but 'images' has 1 image(s)"),
        ({"input": "no placeholder", "images": ["https://x/1.png", "https://x/2.png"]},
         "data.jsonl:1: the prompt has 0 <image> placeholder(s) but 'images' has 2 image(s)"),
        ({"input": "<image> here"}, "the prompt has 1 <image> placeholder(s) but 'images' has 0 image(s)"),
        ({"input": "<image>", "images": ["missing.png"]},
         "data.jsonl:1: images[0]: image file 'missing.png' not found"),
        ({"input": "<image>", "images": [3]}, "images[0] must be a path or URL string, got int"),
        ({"input": [{"role": "system", "content": "<image>"}, {"role": "user", "content": "hi"}],
          "images": ["https://x/1.png"]}, "messages[0] is a system message"),
    ],
)
def test_mismatches_and_bad_images_are_clear_errors(tmp_path: Path, row: dict, message: str) -> None:
    data = _write(tmp_path / "data.jsonl", row)
    with pytest.raises(ConfigError) as caught:
        load_prompts(data, multimodal_keys=KEYS)
    assert message in str(caught.value)


def test_unsupported_modality_and_plain_text_without_keys(tmp_path: Path) -> None:
    data = _write(tmp_path / "data.jsonl", {"input": "keep <image> as text", "images": ["x.png"]})
    with pytest.raises(ConfigError, match="modality 'video' is not supported"):
        load_prompts(data, multimodal_keys={"video": "videos"})
    [prompt] = load_prompts(data)  # without --multimodal-keys the row is plain text, as before
    assert prompt.session_input() == {"messages": [{"role": "user", "content": "keep <image> as text"}]}


def test_to_image_url_converts_paths_bytes_and_images(tmp_path: Path) -> None:
    source = make_image(17, 9, seed=3)
    jpeg = png_bytes(source, fmt="JPEG")
    path = tmp_path / "pic.jpg"
    path.write_bytes(jpeg)
    expected = _pixels(decode_image_url(to_image_url(jpeg)))  # JPEG is lossy: compare decoded pixels

    for value in (path, str(path), jpeg, bytearray(jpeg), {"bytes": jpeg}, {"path": str(path)}):
        url = to_image_url(value)
        assert url.startswith("data:image/png;base64,")
        assert np.array_equal(_pixels(decode_data_url(url)), expected)
    assert to_image_url("pic.jpg", base_dir=tmp_path) == to_image_url(path)
    palette = source.convert("P")
    assert decode_data_url(to_image_url(palette)).mode == "RGB"
    assert np.array_equal(_pixels(decode_data_url(to_image_url(source))), _pixels(source))  # PNG: lossless
    for kept in ("data:image/jpeg;base64,AAAA", "http://example.com/a.png", "https://example.com/a.png"):
        assert to_image_url(kept) == kept

    with pytest.raises(InvalidRequestError, match="not a readable image"):
        to_image_url(b"not an image", where="row 3 images[0]")
    with pytest.raises(InvalidRequestError, match="must be a path, URL, bytes or image, got int"):
        to_image_url(5)
    with pytest.raises(InvalidRequestError, match="not found"):
        to_image_url(tmp_path / "absent.png")


def test_decode_image_url_refuses_remote_and_malformed_urls() -> None:
    image = decode_image_url(data_url(12, 10, seed=4), where="messages[0].content[0].image_url.url")
    assert image.size == (12, 10) and image.mode == "RGB"
    with pytest.raises(InvalidRequestError, match="remote image URLs are not fetched") as caught:
        decode_image_url("https://example.com/a.png", where="messages[1].content[0].image_url.url")
    assert caught.value.param == "messages[1].content[0].image_url.url"
    with pytest.raises(InvalidRequestError, match="base64 data URL"):
        decode_image_url("data:image/png,rawbytes")
    with pytest.raises(InvalidRequestError, match="must be a data:image"):
        decode_image_url("aGVsbG8=")
