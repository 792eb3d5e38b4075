"""LoRA (peft): only adapter weights train; the merged weights are what the adapted model computes."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import torch
from tests.train.train_helpers import make_samples, with_rollout_logprobs

from relaxtrio.testing.scored import scored_samples
from relaxtrio.train import TrainConfig, Trainer

LORA = TrainConfig(lr=5e-2, lora_rank=4, micro_batch_size=8)


def _on_policy(trainer: Trainer, samples):
    return with_rollout_logprobs(samples, trainer.compute_logprobs(samples))


def test_only_adapter_weights_train(tiny_model_dir: Path) -> None:
    trainer = Trainer.from_pretrained(tiny_model_dir, LORA)
    assert trainer.lora and trainer.ref_model is None
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    plain = Trainer.from_pretrained(tiny_model_dir, TrainConfig())
    samples = _on_policy(trainer, make_samples(4, seed=41))
    # B starts at zero: before the first update the adapted model is the base model
    assert trainer.compute_logprobs(samples) == plain.compute_logprobs(samples)
    trainer.train_step(scored_samples(samples, [1.0, -1.0, 0.5, -0.5]))
    trainer.train_step(scored_samples(samples, [1.0, -1.0, 0.5, -0.5]))
    for name, value in trainer.model.named_parameters():
        if name in frozen:
            assert torch.equal(value, frozen[name]), name
    assert trainer.compute_logprobs(samples) != plain.compute_logprobs(samples)


def test_saved_weights_are_base_plus_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer.from_pretrained(tiny_model_dir, LORA)
    samples = _on_policy(trainer, make_samples(3, seed=42))
    trainer.train_step(scored_samples(samples, [1.0, -1.0, 0.5]))
    out = trainer.save_weights(tmp_path / "weights")
    reloaded = Trainer.from_pretrained(out, TrainConfig())  # plain HF weights, no peft
    assert not any("lora" in n for n, _ in reloaded.model.named_parameters())
    got, expected = reloaded.compute_logprobs(samples), trainer.compute_logprobs(samples)
    for a, b in zip(got, expected, strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5
    # The merge is out of place: saving twice gives the same file, and training goes on.
    again = Trainer.from_pretrained(trainer.save_weights(tmp_path / "again"), TrainConfig())
    assert again.compute_logprobs(samples) == got
    ckpt = trainer.save_checkpoint(tmp_path / "ckpt")
    assert Trainer.from_pretrained(ckpt, TrainConfig()).compute_logprobs(samples) == got


def test_kl_loss_reference_is_the_base_model(tiny_model_dir: Path) -> None:
    cfg = attrs.evolve(LORA, use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="k3")
    trainer = Trainer.from_pretrained(tiny_model_dir, cfg)
    samples = _on_policy(trainer, make_samples(3, seed=43))
    assert trainer.train_step(scored_samples(samples, [1.0, -1.0, 0.5])).kl_loss == 0.0
    assert trainer.train_step(scored_samples(samples, [1.0, -1.0, 0.5])).kl_loss > 0.0


def test_lora_target_modules_and_alpha(tiny_model_dir: Path) -> None:
    trainer = Trainer.from_pretrained(
        tiny_model_dir, attrs.evolve(LORA, lora_target_modules=("q_proj", "v_proj"), lora_alpha=4.0))
    names = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert names and all(("q_proj" in n or "v_proj" in n) for n in names)
    layer = trainer.model.get_base_model().model.layers[0].self_attn.q_proj
    assert layer.scaling["default"] == pytest.approx(4.0 / 4)
    with pytest.raises(ValueError, match="lora_rank must be an int >= 0"):
        TrainConfig(lora_rank=-1)
    with pytest.raises(ValueError, match="--lora-target-modules needs at least one"):
        TrainConfig(lora_rank=2, lora_target_modules=())
