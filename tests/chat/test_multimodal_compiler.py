"""Compiler id views of observations with images: rollout ids keep one placeholder per image,
training ids are the processor expansion, and the dummy-prefix delta applies to both views."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tests.support.images import closed_port_url, data_url
from tests.support.chat import observation
from transformers import Qwen2VLProcessor

from relaxtrio import InvalidRequestError
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.media.images import decode_image_url
from relaxtrio.models import load_tokenizer

# A Qwen2-VL-style template (system default, images rendered in place inside any content list).
QWEN2_VL_STYLE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'image_url' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif 'text' in part %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

IMG_A, IMG_B, IMG_C = data_url(56, 84, seed=1), data_url(28, 56, seed=2), data_url(84, 84, seed=3)


def _user(*parts: object) -> dict:
    content = [{"type": "image_url", "image_url": {"url": p}} if str(p).startswith("data:")
               else {"type": "text", "text": p} for p in parts]
    return {"role": "user", "content": content}


@pytest.fixture(scope="module", params=["chatml_tools_vision", "qwen2_vl_style"])
def vision_compiler(request: pytest.FixtureRequest, tiny_vlm_dir: Path, vlm_vision) -> ChatCompiler:
    """The tiny VLM's compiler under each vision template (the bundled one, a Qwen2-VL-style one)."""
    tokenizer = load_tokenizer(tiny_vlm_dir)
    if request.param == "qwen2_vl_style":
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.chat_template = QWEN2_VL_STYLE
    return ChatCompiler(tokenizer, vision=vlm_vision)


def _processor_expansion(compiler: ChatCompiler, text: str, urls: list[str]) -> list[int]:
    """What the Hugging Face processor does: replace each placeholder *in the text* with
    ``Qwen2VLProcessor.replace_image_token`` (transformers' own rule), then tokenize."""
    vision = compiler.vision
    grid = vision.image_processor(images=[decode_image_url(u) for u in urls], return_tensors="np")["image_grid_thw"]
    fake = SimpleNamespace(image_token="<|image_pad|>", image_processor=vision.image_processor)
    pieces = text.split("<|image_pad|>")
    assert len(pieces) == len(urls) + 1
    out = pieces[0]
    for k, piece in enumerate(pieces[1:]):
        out += Qwen2VLProcessor.replace_image_token(fake, {"image_grid_thw": grid}, k) + piece
    return compiler.tokenizer.encode(out, add_special_tokens=False)


def test_full_render_views_match_the_processor(vision_compiler: ChatCompiler) -> None:
    messages = [{"role": "system", "content": "Look closely."}, _user(IMG_A, "What is this?", IMG_B)]
    obs = observation(vision_compiler, messages, delta=False)
    pad = vision_compiler.vision.image_token_id
    assert obs.rollout_token_ids == vision_compiler.render(messages).token_ids  # the tokenizer ids of the render
    assert obs.rollout_token_ids.count(pad) == 2  # one placeholder per image
    text = vision_compiler.render(messages).text
    assert list(obs.token_ids) == _processor_expansion(vision_compiler, text, [IMG_A, IMG_B])
    assert obs.token_ids.count(pad) == sum(obs.multimodal.num_image_tokens) == 6 + 2
    payload = obs.multimodal
    assert payload.image_urls == (IMG_A, IMG_B)
    expected = vision_compiler.vision.image_processor(images=[decode_image_url(IMG_A), decode_image_url(IMG_B)],
                                                      return_tensors="np")
    assert np.array_equal(payload.pixel_values, expected["pixel_values"])
    assert payload.image_grid_thw.tolist() == [[1, 6, 4], [1, 4, 2]]
    assert payload.train_inputs["pixel_values"].shape == (24 + 8, 3 * 2 * 14 * 14)
    assert not payload.pixel_values.flags.writeable
    clone = pickle.loads(pickle.dumps(payload))  # the forest's payload stays pickle-able
    assert clone.image_urls == payload.image_urls and np.array_equal(clone.pixel_values, payload.pixel_values)


def test_delta_views_apply_the_dummy_trim_to_both(vision_compiler: ChatCompiler) -> None:
    delta = [{"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "crop:"},
                                                                 {"type": "image_url", "image_url": {"url": IMG_C}}]},
             _user("and this one?", IMG_A)]
    obs = observation(vision_compiler, delta, delta=True, message_offset=3)
    assert obs.rollout_token_ids == vision_compiler.render_delta(delta).token_ids
    rendered = vision_compiler.render_delta(delta)
    full_expanded = _processor_expansion(vision_compiler, rendered.text, [IMG_C, IMG_A])
    trim = len(vision_compiler.tokenizer.encode(rendered.text, add_special_tokens=False)) - len(obs.rollout_token_ids)
    assert list(obs.token_ids) == full_expanded[trim:]  # expanding after the trim == trimming after it
    assert obs.multimodal.image_urls == (IMG_C, IMG_A)
    assert obs.multimodal.num_image_tokens == (9, 6)


def test_delta_matches_the_full_render_of_a_prefix_stable_template(vision_compiler: ChatCompiler) -> None:
    first = [_user(IMG_A, "What is in the image?")]
    reply = {"role": "assistant", "content": "A cat."}
    second = _user("And here?", IMG_B)
    turn1 = observation(vision_compiler, first, delta=False)
    closed = vision_compiler.render([*first, reply], add_generation_prompt=False).text
    assert closed.endswith("<|im_end|>\n")
    reply_ids = vision_compiler.tokenizer.encode(closed[:-1], add_special_tokens=False)[len(turn1.rollout_token_ids):]
    turn2 = observation(vision_compiler, [second], delta=True, message_offset=2)
    full = observation(vision_compiler, [*first, reply, second], delta=False)
    assert turn1.rollout_token_ids + tuple(reply_ids) + turn2.rollout_token_ids == full.rollout_token_ids
    assert turn1.token_ids + tuple(reply_ids) + turn2.token_ids == full.token_ids
    # Turn 1's image is expanded once, in turn 1's node; turn 2 adds only its own image
    # (docs/client-quirks.md#images-expanded-twice).
    assert turn2.multimodal.image_urls == (IMG_B,)
    pad = vision_compiler.vision.image_token_id
    assert turn1.token_ids.count(pad) + turn2.token_ids.count(pad) == full.token_ids.count(pad) == 6 + 2


def test_text_observations_are_unchanged(vision_compiler: ChatCompiler) -> None:
    messages = [{"role": "user", "content": "plain text"}]
    full = observation(vision_compiler, messages, delta=False)
    assert full.token_ids == full.rollout_token_ids == vision_compiler.render(messages).token_ids
    assert full.multimodal is None
    delta = observation(vision_compiler, messages, delta=True)
    assert delta.token_ids == delta.rollout_token_ids == vision_compiler.render_delta(messages).token_ids


def test_unusable_images_are_client_errors(vision_compiler: ChatCompiler, tiny_model_dir: Path) -> None:
    # A remote image that cannot be fetched (test_multimodal_remote.py covers the fetch itself).
    remote = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": closed_port_url()}}]}]
    with pytest.raises(InvalidRequestError, match="cannot fetch remote image") as caught:
        observation(vision_compiler, remote, delta=True, message_offset=4)
    assert caught.value.param == "messages[4].content[0].image_url.url"
    # A literal placeholder in text would smuggle an image token without an image.
    with pytest.raises(InvalidRequestError, match="image placeholder text but no image_url part"):
        observation(vision_compiler, [_user("<|image_pad|>")], delta=False)
    with pytest.raises(InvalidRequestError, match="2 image placeholder token\\(s\\) for 1 image\\(s\\)"):
        observation(vision_compiler, [_user("<|image_pad|>", IMG_A)], delta=False)
    with pytest.raises(InvalidRequestError, match="url must be a non-empty string"):
        observation(vision_compiler, [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
                    delta=False)
    text_only = ChatCompiler(load_tokenizer(tiny_model_dir))
    with pytest.raises(InvalidRequestError, match="text-only and cannot take image input") as caught:
        observation(text_only, [_user("hi", IMG_A)], delta=False)
    assert caught.value.param == "messages[0].content[1].image_url.url"


def test_from_pretrained_attaches_the_vision_processor(tiny_vlm_dir: Path, tiny_model_dir: Path) -> None:
    assert ChatCompiler.from_pretrained(tiny_vlm_dir).vision is not None
    assert ChatCompiler.from_pretrained(tiny_model_dir).vision is None
