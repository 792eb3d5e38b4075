"""The trainer wires each loss option in: the gradient of a step equals the hand-built one.

A step with plain SGD at lr 1 and no gradient clipping moves every parameter by exactly
``-grad``, so comparing parameter deltas compares gradients.
"""

from __future__ import annotations

import math
from pathlib import Path

import attrs
import pytest
import torch
from tests.train.train_helpers import FakeSample, make_samples, with_rollout_logprobs

from relaxtrio.forest import WeightSpan
from relaxtrio.testing.scored import scored_samples
from relaxtrio.train import TrainConfig, Trainer
from relaxtrio.train.batching import collate
from relaxtrio.train.logprobs import (
    entropy_from_logits,
    forward_logits,
    logprobs_from_logits,
)

BASE = TrainConfig(lr=1.0, max_grad_norm=1e9, micro_batch_size=8)


def _gradient(model_dir: Path, cfg: TrainConfig, samples, advantages) -> dict[str, torch.Tensor]:
    trainer = Trainer.from_pretrained(model_dir, cfg)
    trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=1.0)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.last_stats = trainer.train_step(scored_samples(samples, advantages))
    return {k: before[k] - v.detach() for k, v in trainer.model.named_parameters()}


def _manual_gradient(model_dir: Path, samples, loss_fn) -> dict[str, torch.Tensor]:
    """``grad loss_fn(logits, logprobs, batch)`` of the initial model, one batch, temperature 1."""
    trainer = Trainer.from_pretrained(model_dir, BASE)
    batch = collate(samples, None, list(range(len(samples))), pad_token_id=0, device="cpu")
    logits = forward_logits(trainer.model, batch.token_ids, batch.attention_mask, autocast_bf16=False)
    logprobs = logprobs_from_logits(logits, batch.token_ids, batch.attention_mask)
    loss_fn(logits, logprobs, batch).backward()
    return {k: v.grad.detach().clone() for k, v in trainer.model.named_parameters()}


def _assert_same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], scale: float = 1.0) -> None:
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad * scale, rtol=1e-4, atol=1e-6, msg=name)


def _on_policy(model_dir: Path, samples, offset: float = 0.0) -> list[FakeSample]:
    trainer = Trainer.from_pretrained(model_dir, BASE)
    return with_rollout_logprobs(samples, trainer.compute_logprobs(samples), offset=offset)


def test_entropy_bonus_gradient(tiny_model_dir: Path) -> None:
    samples = _on_policy(tiny_model_dir, make_samples(3, seed=21))
    got = _gradient(tiny_model_dir, attrs.evolve(BASE, entropy_coef=0.1), samples, [0.0] * 3)

    def loss(logits, logprobs, batch):
        ent = entropy_from_logits(logits)
        return -0.1 * (ent * batch.loss_mask).sum() / batch.loss_mask.sum()

    _assert_same(got, _manual_gradient(tiny_model_dir, samples, loss))


@pytest.mark.parametrize(("kind", "scale"), [("k1", 1.0), ("k3", 0.0)])
def test_kl_loss_gradient_at_the_reference(tiny_model_dir: Path, kind: str, scale: float) -> None:
    # At the initial weights current == reference: k1's gradient is the mean grad log p, k3's 0.
    samples = _on_policy(tiny_model_dir, make_samples(3, seed=22))
    cfg = attrs.evolve(BASE, use_kl_loss=True, kl_loss_coef=0.3, kl_loss_type=kind)
    got = _gradient(tiny_model_dir, cfg, samples, [0.0] * 3)

    def loss(logits, logprobs, batch):
        return 0.3 * (logprobs * batch.loss_mask).sum() / batch.loss_mask.sum()

    _assert_same(got, _manual_gradient(tiny_model_dir, samples, loss), scale=scale)


def test_kl_loss_is_reported_separately_from_ppo_kl(tiny_model_dir: Path) -> None:
    samples = _on_policy(tiny_model_dir, make_samples(3, seed=23))
    trainer = Trainer.from_pretrained(
        tiny_model_dir, TrainConfig(lr=1e-2, use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="k3"))
    first = trainer.train_step(scored_samples(samples, [1.0, -1.0, 0.5]))
    assert first.kl_loss == 0.0 and first.ppo_kl == 0.0 and math.isnan(first.reward_shaping_kl)
    second = trainer.train_step(scored_samples(samples, [1.0, -1.0, 0.5]))
    assert second.kl_loss > 0  # the policy moved away from the frozen reference
    assert second.ppo_kl == 0.0  # one minibatch: old == current at the step's start


def test_tis_weight_multiplies_the_policy_gradient(tiny_model_dir: Path) -> None:
    raw = make_samples(3, seed=24)
    advantages = [1.0, -1.0, 0.5]
    plain = _gradient(tiny_model_dir, BASE, _on_policy(tiny_model_dir, raw), advantages)
    # the engine was 0.5 nats less confident on every token: weight min(e^0.5, 2) = 1.6487
    shifted = _on_policy(tiny_model_dir, raw, offset=-0.5)
    got = _gradient(tiny_model_dir, attrs.evolve(BASE, use_tis=True, tis_clip=2.0), shifted, advantages)
    _assert_same(got, plain, scale=math.exp(0.5))
    truncated = _gradient(tiny_model_dir, attrs.evolve(BASE, use_tis=True, tis_clip=1.2), shifted, advantages)
    _assert_same(truncated, plain, scale=1.2)


def test_icepop_drops_tokens_outside_the_band(tiny_model_dir: Path) -> None:
    raw = make_samples(2, seed=25)
    shifted = _on_policy(tiny_model_dir, raw, offset=-2.0)  # k = e^2 = 7.4 > 5 everywhere
    cfg = attrs.evolve(BASE, use_icepop=True)
    got = _gradient(tiny_model_dir, cfg, shifted, [1.0, -1.0])
    assert all(float(g.abs().max()) == 0.0 for g in got.values())


def test_opsm_masks_only_the_negative_sample(tiny_model_dir: Path) -> None:
    raw = make_samples(2, seed=26)
    drifted = _on_policy(tiny_model_dir, raw, offset=+0.5)  # rollout - current = 0.5 > delta
    cfg = attrs.evolve(BASE, use_opsm=True, opsm_delta=0.1)
    got = _gradient(tiny_model_dir, cfg, drifted, [-1.0, 1.0])
    expected = _gradient(tiny_model_dir, BASE, _on_policy(tiny_model_dir, raw), [0.0, 1.0])
    _assert_same(got, expected)


def test_dual_clip_reaches_the_trainer(tiny_model_dir: Path) -> None:
    # rollout logprobs as old, engine 2 nats less confident: ratio e^2 = 7.4 > c = 3 for A < 0
    samples = _on_policy(tiny_model_dir, make_samples(2, seed=27), offset=-2.0)
    cfg = attrs.evolve(BASE, use_rollout_logprobs_as_old=True, clip_ratio_c=3.0)
    trainer = Trainer.from_pretrained(tiny_model_dir, cfg)
    stats = trainer.train_step(scored_samples(samples, [-1.0, -1.0]))
    assert stats.dual_clip_fraction == 1.0 and stats.grad_norm == 0.0
    assert math.isnan(Trainer.from_pretrained(tiny_model_dir, BASE).train_step(scored_samples(samples, [1.0, 1.0])).dual_clip_fraction)


def test_mask_offpolicy_trains_only_the_newest_weight_version(tiny_model_dir: Path) -> None:
    @attrs.frozen
    class VersionedSample(FakeSample):
        weight_versions: tuple = ()

    raw = make_samples(2, seed=28, min_len=12, max_len=12)
    logprobs = Trainer.from_pretrained(tiny_model_dir, BASE).compute_logprobs(raw)
    on_policy = with_rollout_logprobs(raw, logprobs)
    versioned, expected_samples = [], []
    for s in on_policy:
        start = s.loss_mask.index(1)
        mid = (start + 12) // 2
        spans = (WeightSpan("step-1", start, mid), WeightSpan("step-2", mid, 12))
        versioned.append(VersionedSample(s.token_ids, s.loss_mask, s.rollout_logprobs, spans))
        mask = [0] * mid + [1] * (12 - mid)
        expected_samples.append(FakeSample(s.token_ids, mask, [lp if m else 0.0 for lp, m in
                                                              zip(s.rollout_logprobs, mask, strict=True)]))
    cfg = attrs.evolve(BASE, mask_offpolicy_in_partial_rollout=True)
    got = _gradient(tiny_model_dir, cfg, versioned, [1.0, -1.0])
    _assert_same(got, _gradient(tiny_model_dir, BASE, expected_samples, [1.0, -1.0]))
    trainer = Trainer.from_pretrained(tiny_model_dir, cfg)
    stats = trainer.train_step(scored_samples(versioned, [1.0, -1.0]))
    assert stats.offpolicy_masked_tokens == sum(sum(s.loss_mask) for s in versioned) - stats.num_tokens > 0


def test_sequence_ratio_step_equals_token_ratio_on_policy(tiny_model_dir: Path) -> None:
    # at ratio 1 GSPO-token's gradient s * grad log p equals PPO's (both with sequence_mean)
    samples = _on_policy(tiny_model_dir, make_samples(3, seed=29))
    cfg = attrs.evolve(BASE, loss_aggregation="sequence_mean")
    token = _gradient(tiny_model_dir, cfg, samples, [1.0, -1.0, 0.5])
    seq = _gradient(tiny_model_dir, attrs.evolve(cfg, policy_ratio="sequence"), samples, [1.0, -1.0, 0.5])
    _assert_same(seq, token)


def test_driver_logs_only_the_metrics_a_configuration_produces(tiny_model_dir: Path) -> None:
    from relaxtrio.run.step import optional_train_metrics

    samples = _on_policy(tiny_model_dir, make_samples(2, seed=30))
    plain = Trainer.from_pretrained(tiny_model_dir, BASE).train_step(scored_samples(samples, [1.0, -1.0]))
    assert set(optional_train_metrics(plain)) == {"advantage_mean", "advantage_std"}
    cfg = attrs.evolve(BASE, use_kl_loss=True, use_tis=True, use_opsm=True, clip_ratio_c=3.0)
    full = Trainer.from_pretrained(tiny_model_dir, cfg).train_step(scored_samples(samples, [1.0, -1.0]))
    assert {"kl_loss", "tis_weight_mean", "tis_clip_fraction", "opsm_masked_fraction",
            "dual_clip_fraction"} <= set(optional_train_metrics(full))


def test_a_resumed_trainer_keeps_the_initial_policy_as_its_kl_reference(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = attrs.evolve(BASE, lr=1e-2, use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="k3")
    first = Trainer.from_pretrained(tiny_model_dir, cfg)
    samples = _on_policy(tiny_model_dir, make_samples(3, seed=31))
    first.train_step(scored_samples(samples, [1.0, -1.0, 0.5]))
    moved = first.save_weights(tmp_path / "moved")  # the weights a run checkpoint would hold
    resumed = Trainer.from_pretrained(moved, cfg, reference_dir=tiny_model_dir)
    initial = Trainer.from_pretrained(tiny_model_dir, BASE).model.state_dict()
    for name, value in resumed.ref_model.state_dict().items():
        torch.testing.assert_close(value, initial[name], rtol=0, atol=0, msg=name)
    # measured from the initial policy, the moved weights already have a positive KL
    assert resumed.train_step(scored_samples(samples, [1.0, -1.0, 0.5])).kl_loss > 0
    assert Trainer.from_pretrained(moved, cfg).train_step(scored_samples(samples, [1.0, -1.0, 0.5])).kl_loss == 0.0
