"""The embedded engine generating from image input (in-process server, tiny random Qwen2-VL)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio
from tests.support.images import data_url, full_forward_logprobs
from tests.support.chat import observation

from relaxtrio import EngineRejectedError
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.engine.server import EngineConfig, serve_engine
from relaxtrio.sglang.client import SamplingParams, open_engine_client


@pytest.fixture
async def vlm_url(nursery: trio.Nursery, tiny_vlm_dir: Path) -> str:
    return await nursery.start(serve_engine, EngineConfig(model_path=tiny_vlm_dir, max_running_requests=4))


def _prompt(compiler: ChatCompiler, *urls: str, text: str = "Describe the images."):
    content = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    content.append({"type": "text", "text": text})
    return observation(compiler, [{"role": "user", "content": content}], delta=False)


def _logprobs(body: dict) -> list[float]:
    return [row[0] for row in body["meta_info"]["output_token_logprobs"]]


async def _generate(http: httpx.AsyncClient, ids, images, *, seed: int, temperature: float = 1.0) -> dict:
    payload = {
        "input_ids": list(ids),
        "sampling_params": {"max_new_tokens": 8, "temperature": temperature, "sampling_seed": seed,
                            "ignore_eos": True},
        "return_logprob": True,
    }
    if images:
        payload["image_data"] = list(images)
    response = await http.post("/generate", json=payload)
    assert response.status_code == 200, response.text
    return response.json()


async def test_engine_generates_from_images_with_full_forward_logprobs(
    vlm_url: str, vlm_compiler: ChatCompiler, vlm_model, vlm_vision
) -> None:
    one, two = data_url(56, 84, seed=1), data_url(28, 56, seed=2)
    obs = _prompt(vlm_compiler, one, two)
    assert obs.multimodal is not None and obs.multimodal.num_image_tokens == (6, 2)
    swapped_obs = _prompt(vlm_compiler, two, one)
    text_obs = observation(vlm_compiler, [{"role": "user", "content": "No image here."}], delta=False)
    async with httpx.AsyncClient(base_url=vlm_url, timeout=60) as http:
        results: dict[str, dict] = {}

        async def run(name: str, ids, images, seed: int, temperature: float) -> None:
            results[name] = await _generate(http, ids, images, seed=seed, temperature=temperature)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:  # image and text rows decode in one batch
                nursery.start_soon(run, "images", obs.rollout_token_ids, obs.multimodal.image_urls, 1, 1.0)
                nursery.start_soon(run, "swapped", swapped_obs.rollout_token_ids, (two, one), 2, 0.7)
                nursery.start_soon(run, "text", text_obs.rollout_token_ids, (), 3, 1.0)
        info = (await http.get("/server_info")).json()
        model_info = (await http.get("/model_info")).json()
    assert info["internal_states"][0]["max_batch_size_seen"] >= 2
    assert model_info["has_image_understanding"] is True

    body = results["images"]
    # The engine expanded each placeholder exactly once: its prompt is the training view.
    assert body["meta_info"]["prompt_tokens"] == len(obs.token_ids) == len(obs.rollout_token_ids) + 6 + 2 - 2
    train_inputs = obs.multimodal.train_inputs
    image_token = vlm_vision.image_token_id
    reference = full_forward_logprobs(vlm_model, obs.token_ids + tuple(body["output_ids"]), image_token,
                                      train_inputs, len(obs.token_ids))
    assert max(abs(a - b) for a, b in zip(_logprobs(body), reference, strict=True)) < 1e-4
    # The vision tower matters: the same ids with other pixels (same sizes) give other logprobs.
    other_obs = _prompt(vlm_compiler, data_url(56, 84, seed=5), data_url(28, 56, seed=6))
    assert other_obs.token_ids == obs.token_ids
    other = full_forward_logprobs(vlm_model, obs.token_ids + tuple(body["output_ids"]), image_token,
                                  other_obs.multimodal.train_inputs, len(obs.token_ids))
    assert max(abs(a - b) for a, b in zip(_logprobs(body), other, strict=True)) > 1e-3

    swapped = results["swapped"]  # temperature 0.7: logprobs are log_softmax(logits / T)
    reference = full_forward_logprobs(vlm_model, swapped_obs.token_ids + tuple(swapped["output_ids"]),
                                      image_token, swapped_obs.multimodal.train_inputs,
                                      len(swapped_obs.token_ids), temperature=0.7)
    assert max(abs(a - b) for a, b in zip(_logprobs(swapped), reference, strict=True)) < 1e-4

    text = results["text"]
    reference = full_forward_logprobs(vlm_model, text_obs.token_ids + tuple(text["output_ids"]), image_token,
                                      {}, len(text_obs.token_ids))
    assert max(abs(a - b) for a, b in zip(_logprobs(text), reference, strict=True)) < 1e-4


async def test_client_sends_image_data(vlm_url: str, vlm_compiler: ChatCompiler) -> None:
    obs = _prompt(vlm_compiler, data_url(56, 84, seed=1))
    params = SamplingParams(max_new_tokens=3, temperature=1.0, sampling_seed=7, ignore_eos=True)
    async with open_engine_client(vlm_url) as client:
        with trio.fail_after(30):
            result = await client.generate(obs.rollout_token_ids, params, rid="mm-client-1",
                                           image_data=obs.multimodal.image_urls)
            assert result.prompt_tokens == len(obs.token_ids)
            assert len(result.output_ids) == len(result.output_logprobs) == 3
            # Without the images, the placeholder has nothing to stand for: a clear 400.
            with pytest.raises(EngineRejectedError) as caught:
                await client.generate(obs.rollout_token_ids, params, rid="mm-client-2")
    assert caught.value.status_code == 400
    assert "1 image placeholder token(s) but image_data is empty" in str(caught.value)


@pytest.mark.parametrize(
    ("images", "placeholders", "message"),
    [
        (["https://example.com/cat.png"], 1, "remote image URLs are not fetched"),
        (["data:image/png;base64,%%%"], 1, "invalid base64"),
        (["data:image/png;base64,aGVsbG8="], 1, "not a readable image"),
        ([data_url(28, 28), data_url(28, 28, seed=1)], 1, "1 image placeholder token(s) for 2 image(s)"),
        ([[data_url(28, 28)]], 1, "batch form"),
    ],
)
async def test_engine_refuses_unusable_images(
    vlm_url: str, vlm_compiler: ChatCompiler, images: list, placeholders: int, message: str
) -> None:
    ids = list(_prompt(vlm_compiler, *[data_url(28, 28)] * placeholders).rollout_token_ids)
    async with httpx.AsyncClient(base_url=vlm_url, timeout=30) as http:
        response = await http.post("/generate", json={"input_ids": ids, "image_data": images,
                                                      "sampling_params": {"max_new_tokens": 2}})
    assert response.status_code == 400, response.text
    assert message in response.text


async def test_engine_accepts_bare_base64_and_url_objects(vlm_url: str, vlm_compiler: ChatCompiler) -> None:
    url = data_url(28, 56, seed=4)
    ids = list(_prompt(vlm_compiler, url, url).rollout_token_ids)
    async with httpx.AsyncClient(base_url=vlm_url, timeout=30) as http:
        response = await http.post("/generate", json={
            "input_ids": ids, "image_data": [url.partition(",")[2], {"url": url}],
            "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}})
    assert response.status_code == 200, response.text
    assert response.json()["meta_info"]["prompt_tokens"] == len(ids) - 2 + 2 * 2


async def test_text_only_engine_refuses_image_data(nursery: trio.Nursery, tiny_model_dir: Path) -> None:
    url = await nursery.start(serve_engine, EngineConfig(model_path=tiny_model_dir))
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        response = await http.post("/generate", json={"input_ids": [1, 2, 3], "image_data": [data_url(28, 28)]})
        info = (await http.get("/model_info")).json()
    assert response.status_code == 400
    assert "image_data is not supported: the served model is text-only" in response.text
    assert info["has_image_understanding"] is False
