"""The trainer on vision-language samples: merged image inputs reach the model, in batch order."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.support.images import data_url, full_forward_logprobs
from tests.support.chat import observation

from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.forest import TrainingSample
from relaxtrio.media.vision import VisionProcessor
from relaxtrio.testing.scored import scored_samples
from relaxtrio.train import TrainConfig, Trainer, merge_multimodal_inputs, token_logprobs
from relaxtrio.train.batching import collate


def _user(text: str, *urls: str) -> dict:
    return {"role": "user", "content": [*({"type": "image_url", "image_url": {"url": u}} for u in urls),
                                        {"type": "text", "text": text}]}


def _sample(compiler: ChatCompiler, model, seed: int, turns: list[dict]) -> TrainingSample:
    """obs, response, obs, response ... with random response ids and on-policy rollout logprobs."""
    rng = random.Random(seed)
    ids: list[int] = []
    rollout: list[int] = []
    mask: list[int] = []
    payloads = []
    prompt_length = None
    for k, message in enumerate(turns):
        obs = observation(compiler, [message], delta=k > 0)
        ids += obs.token_ids
        rollout += obs.rollout_token_ids
        mask += [0] * len(obs.token_ids)
        if obs.multimodal is not None:
            payloads.append(obs.multimodal)
        if prompt_length is None:
            prompt_length = len(ids)
        response = [rng.randrange(100, 1500) for _ in range(rng.randrange(3, 7))] + [2]  # 2 = <|im_end|>
        ids += response
        rollout += response
        mask += [1] * len(response)
    merged = merge_multimodal_inputs(payloads)
    full = full_forward_logprobs(model, ids, compiler.vision.image_token_id, merged, 1)
    logprobs = [0.0] + [lp if m else 0.0 for lp, m in zip(full, mask[1:], strict=True)]
    return TrainingSample(name=None, session_id=f"s{seed}", token_ids=ids, prompt_length=prompt_length,
                          loss_mask=mask, rollout_logprobs=logprobs, reward=1.0, status="completed",
                          weight_versions=(), metadata={}, rollout_token_ids=rollout,
                          multimodal_inputs=payloads)


@pytest.fixture(scope="module")
def samples(tiny_vlm_dir: Path, vlm_model) -> list[TrainingSample]:
    compiler = ChatCompiler.from_pretrained(tiny_vlm_dir)
    return [
        _sample(compiler, vlm_model, 1, [_user("What is it?", data_url(56, 84, seed=1)),
                                         _user("Compare with these.", data_url(28, 56, seed=2),
                                               data_url(28, 28, seed=3))]),
        _sample(compiler, vlm_model, 2, [_user("No image, just text."), _user("Now one.", data_url(84, 56, seed=4))]),
        _sample(compiler, vlm_model, 3, [_user("Plain text only.")]),
    ]


def test_collate_merges_images_row_major_with_type_ids(samples: list[TrainingSample], vlm_vision) -> None:
    batch = collate(samples, [1.0, 1.0, 1.0], [1, 0, 2], pad_token_id=0, device="cpu",
                    image_token_id=vlm_vision.image_token_id)
    inputs = batch.model_inputs
    expected = [row for i in (1, 0) for p in samples[i].multimodal_inputs for row in p.image_grid_thw.tolist()]
    assert inputs["image_grid_thw"].tolist() == expected == [[1, 4, 6], [1, 6, 4], [1, 4, 2], [1, 2, 2]]
    assert inputs["pixel_values"].shape[0] == sum(t * h * w for t, h, w in expected)
    type_ids = inputs["mm_token_type_ids"]
    assert type_ids.shape == batch.token_ids.shape
    assert type_ids.sum().item() == sum(t * h * w // 4 for t, h, w in expected)  # placeholders == features
    assert not collate(samples, None, [2], pad_token_id=0, device="cpu", image_token_id=7).model_inputs


def test_padded_batch_logprobs_equal_each_unpadded_forward(tiny_vlm_dir: Path, samples) -> None:
    trainer = Trainer.from_pretrained(tiny_vlm_dir, TrainConfig(micro_batch_size=3))
    for sample, logprobs in zip(samples, trainer.compute_logprobs(samples), strict=True):
        for t, m in enumerate(sample.loss_mask):
            if m:
                assert abs(logprobs[t] - sample.rollout_logprobs[t]) < 1e-4, (sample.session_id, t)
    # token_logprobs takes the same merged inputs directly.
    batch = collate(samples, None, [0], pad_token_id=0, device="cpu",
                    image_token_id=trainer.model.config.image_token_id)
    with torch.no_grad():
        direct = token_logprobs(trainer.model, batch.token_ids, batch.attention_mask,
                                model_inputs=batch.model_inputs)[0]
    assert torch.allclose(direct, torch.tensor(trainer.compute_logprobs(samples[:1])[0]), atol=1e-5)


def test_train_step_on_vlm_samples(tiny_vlm_dir: Path, samples, tmp_path: Path) -> None:
    trainer = Trainer.from_pretrained(tiny_vlm_dir, TrainConfig(lr=1e-3, micro_batch_size=2))
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    stats = trainer.train_step(scored_samples(samples, [1.0, -0.5, 0.25]))
    assert math.isfinite(stats.loss) and math.isfinite(stats.grad_norm) and stats.grad_norm > 0
    assert stats.num_micro_batches == 2
    assert stats.rollout_logprob_abs_diff_max < 1e-4  # engine-style logprobs == trainer before the update
    after = dict(trainer.model.named_parameters())
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(k.startswith("model.visual.") for k in changed)  # gradients reach the vision tower
    assert any(k.startswith("model.language_model.") for k in changed)
    # A checkpoint keeps the image processor, so it can be served as a VLM again.
    checkpoint = trainer.save_checkpoint(tmp_path / "ckpt", tiny_vlm_dir)
    assert VisionProcessor.from_pretrained(checkpoint) is not None


def test_images_need_a_model_with_an_image_token(samples, tiny_model_dir: Path) -> None:
    trainer = Trainer.from_pretrained(tiny_model_dir, TrainConfig())
    with pytest.raises(ValueError, match="has no image_token_id"):
        trainer.compute_logprobs(samples[:1])
    assert np.asarray(samples[0].multimodal_inputs[0].pixel_values).dtype == np.float32
