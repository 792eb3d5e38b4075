"""Dynamic batching: micro-batches packed by a padded-token budget give the unsplit gradient."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import torch
from tests.train.train_helpers import make_samples, with_rollout_logprobs

from relaxtrio.testing.scored import scored_samples
from relaxtrio.train import TrainConfig, Trainer
from relaxtrio.train.batching import plan_dynamic_micro_batches


def test_first_fit_decreasing_packing_by_hand() -> None:
    lengths = [10, 30, 5, 12, 8, 30]
    # longest first: 1 (30), 5 (30: 2 * 30 > 40), 3 (12: new bin), 0 (10: 2 * 12 <= 40),
    # 4 (8: 3 * 12 = 36 <= 40), 2 (5: 4 * 12 = 48 > 40, new bin)
    assert plan_dynamic_micro_batches(range(6), lengths, max_tokens=40) == [[1], [5], [3, 0, 4], [2]]
    assert plan_dynamic_micro_batches([0], [50], max_tokens=40) == [[0]]  # too long: alone
    assert plan_dynamic_micro_batches([2, 0], [4, 4, 4], max_tokens=100) == [[0, 2]]


def _delta(model_dir: Path, cfg: TrainConfig, samples, advantages):
    trainer = Trainer.from_pretrained(model_dir, cfg)
    trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=1.0)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    stats = trainer.train_step(scored_samples(samples, advantages))
    return {k: before[k] - v.detach() for k, v in trainer.model.named_parameters()}, stats


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "sequence_sum_norm"])
def test_dynamic_micro_batches_give_the_unsplit_gradient(tiny_model_dir: Path, aggregation: str) -> None:
    base = TrainConfig(lr=1.0, max_grad_norm=1e9, micro_batch_size=64, loss_aggregation=aggregation,
                       use_kl_loss=True, kl_loss_coef=0.2, kl_loss_type="k1", entropy_coef=0.05,
                       use_tis=True, normalize_advantages=True)
    raw = make_samples(7, seed=31, min_len=6, max_len=24)
    samples = with_rollout_logprobs(raw, Trainer.from_pretrained(tiny_model_dir, base).compute_logprobs(raw),
                                    offset=-0.1)
    advantages = [0.7, -1.2, 0.3, 1.5, -0.4, 0.0, 2.0]
    unsplit, one = _delta(tiny_model_dir, base, samples, advantages)
    dynamic = attrs.evolve(base, use_dynamic_batch_size=True, max_tokens_per_gpu=48)
    split, many = _delta(tiny_model_dir, dynamic, samples, advantages)
    assert one.num_micro_batches == 1 and many.num_micro_batches >= 3
    assert many.num_padded_tokens < 7 * 24  # packed by length, not padded to the longest
    for name, grad in unsplit.items():
        torch.testing.assert_close(split[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert many.loss == pytest.approx(one.loss, rel=1e-5, abs=1e-7)
    assert many.kl_loss == pytest.approx(one.kl_loss, abs=1e-7)
    assert many.tis_weight_mean == pytest.approx(one.tis_weight_mean, rel=1e-6)


def test_dynamic_batching_with_several_minibatches_trains(tiny_model_dir: Path) -> None:
    cfg = TrainConfig(lr=1e-3, num_minibatches=2, use_dynamic_batch_size=True, max_tokens_per_gpu=40)
    raw = make_samples(6, seed=32)
    samples = with_rollout_logprobs(raw, Trainer.from_pretrained(tiny_model_dir, cfg).compute_logprobs(raw))
    stats = Trainer.from_pretrained(tiny_model_dir, cfg).train_step(scored_samples(samples, [1.0, -1.0] * 3))
    assert stats.num_optimizer_steps == 2 and stats.num_micro_batches >= 2
    assert stats.rollout_logprob_abs_diff < 1e-5
