"""relaxtrio.train.estimators: KL-shaped returns and whitening, by hand and through the trainer."""

from __future__ import annotations

import math
from pathlib import Path

import attrs
import pytest
import torch
from tests.train.train_helpers import make_samples, with_rollout_logprobs

from relaxtrio.testing.scored import scored_samples
from relaxtrio.train import TrainConfig, Trainer
from relaxtrio.train.estimators import kl_shaped_advantages, whiten_advantages


def _t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_base_credit_is_broadcast_over_trained_tokens_only() -> None:
    adv, kl = kl_shaped_advantages([2.0, -1.0], [_t([0, 1, 1, 0, 1]), _t([0, 0, 1])])
    assert adv[0].tolist() == [0.0, 2.0, 2.0, 0.0, 2.0]
    assert adv[1].tolist() == [0.0, 0.0, -1.0]
    assert kl is None


def test_kl_shaping_subtracts_the_kl_still_to_come() -> None:
    # mask 0 1 1 0 1; KL_t = old - ref = (-, 0.2, 0.1, [off mask], 0.3)
    mask = _t([0, 1, 1, 0, 1])
    old = _t([0.0, -1.0, -2.0, -5.0, -0.5])
    ref = _t([0.0, -1.2, -2.1, -9.0, -0.8])
    adv, kl = kl_shaped_advantages([1.0], [mask], old_logprobs=[old], ref_logprobs=[ref], kl_coef=0.5)
    # sums to go over trained tokens: t=1: 0.2+0.1+0.3 = 0.6, t=2: 0.4, t=4: 0.3
    torch.testing.assert_close(adv[0], _t([0.0, 1 - 0.5 * 0.6, 1 - 0.5 * 0.4, 0.0, 1 - 0.5 * 0.3]))
    assert kl == pytest.approx(0.2, abs=1e-6)  # (0.2 + 0.1 + 0.3) / 3


def test_kl_shaping_needs_both_logprob_lists() -> None:
    with pytest.raises(ValueError, match="old_logprobs and ref_logprobs"):
        kl_shaped_advantages([1.0], [_t([0, 1])], kl_coef=0.1)


def test_whitening_is_token_weighted_over_the_whole_step() -> None:
    # token values 1, 1 | -1 | 3: mean 1, population variance (0 + 0 + 4 + 4) / 4 = 2
    adv = [_t([0.0, 1.0, 1.0]), _t([0.0, -1.0]), _t([0.0, 3.0])]
    masks = [_t([0, 1, 1]), _t([0, 1]), _t([0, 1])]
    out = whiten_advantages(adv, masks)
    s = 1 / math.sqrt(2 + 1e-8)
    torch.testing.assert_close(torch.cat(out), _t([0.0, 0.0, 0.0, 0.0, -2 * s, 0.0, 2 * s]))


def test_whitening_with_nothing_trained_is_a_no_op() -> None:
    out = whiten_advantages([_t([0.0, 0.0])], [_t([0, 0])])
    assert out[0].tolist() == [0.0, 0.0]


def _step_gradient(trainer: Trainer, samples, advantages) -> dict[str, torch.Tensor]:
    trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=1.0)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train_step(scored_samples(samples, advantages))
    return {k: before[k] - v.detach() for k, v in trainer.model.named_parameters()}  # = grad


def test_normalize_advantages_equals_training_on_whitened_credit(tiny_model_dir: Path) -> None:
    cfg = TrainConfig(lr=1.0, max_grad_norm=1e9)
    samples = make_samples(3, seed=11)
    base = [1.0, -1.0, 3.0]
    counts = [sum(s.loss_mask) for s in samples]
    tokens = [a for a, n in zip(base, counts, strict=True) for _ in range(n)]
    mean = sum(tokens) / len(tokens)
    std = math.sqrt(sum((t - mean) ** 2 for t in tokens) / len(tokens) + 1e-8)
    whitened = [(a - mean) / std for a in base]

    plain = Trainer.from_pretrained(tiny_model_dir, cfg)
    samples = with_rollout_logprobs(samples, plain.compute_logprobs(samples))
    expected = _step_gradient(plain, samples, whitened)
    trainer = Trainer.from_pretrained(tiny_model_dir, attrs.evolve(cfg, normalize_advantages=True))
    got = _step_gradient(trainer, samples, base)
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-4, atol=1e-7)


def test_kl_shaping_at_the_initial_weights_changes_nothing(tiny_model_dir: Path) -> None:
    # The reference is a frozen copy of the initial weights, so on the first step KL(old||ref) = 0.
    samples = make_samples(3, seed=12)
    trainer = Trainer.from_pretrained(tiny_model_dir, TrainConfig(lr=1e-3, kl_coef=0.5))
    assert trainer.ref_model is not None
    samples = with_rollout_logprobs(samples, trainer.compute_logprobs(samples))
    stats = trainer.train_step(scored_samples(samples, [1.0, -1.0, 0.5]))
    assert stats.reward_shaping_kl == 0.0
    # the next step sees moved weights: a positive shaping KL on average is not guaranteed per
    # token, but it is nonzero
    stats = trainer.train_step(scored_samples(samples, [1.0, -1.0, 0.5]))
    assert stats.reward_shaping_kl != 0.0 and math.isfinite(stats.reward_shaping_kl)
