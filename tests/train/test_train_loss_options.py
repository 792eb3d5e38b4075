"""Policy-loss options against hand-computed examples: dual clip, the GSPO sequence ratio, token
weights, the three aggregations, reference-KL estimators and the off-policy corrections."""

from __future__ import annotations

import math

import pytest
import torch

from relaxtrio.forest import WeightSpan
from relaxtrio.train.loss import LossDenominators, aggregate, policy_loss, reference_kl
from relaxtrio.train.offpolicy import (
    icepop_weights,
    newest_version_loss_mask,
    opsm_mask,
    tis_weights,
)


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


# ---------------------------------------------------------------- dual clip


def test_dual_clip_caps_negative_advantage_tokens_at_c() -> None:
    ratios = [4.0, 2.0, 4.0, 0.5]
    adv = [-1.0, -1.0, 1.0, -1.0]
    old = _t([[0.0] + [-1.0] * 4])
    logprobs = (old + torch.log(_t([[1.0, *ratios]]))).requires_grad_(True)
    mask = _t([[0, 1, 1, 1, 1]])
    loss, stats = policy_loss(logprobs, old, _t([[0.0, *adv]]), mask,
                              clip_eps_low=0.2, clip_eps_high=0.28, clip_ratio_c=3.0)
    # (4, -1): max(4, 1.28) = 4, capped at 3 | (2, -1): 2 < 3 stays | (4, +1): max(-4, -1.28) =
    # -1.28 (no dual clip for A > 0) | (0.5, -1): max(0.5, 0.8) = 0.8
    assert loss.item() == pytest.approx((3.0 + 2.0 - 1.28 + 0.8) / 4, abs=1e-6)
    assert stats["dual_clip_fraction"] == 0.25
    loss.backward()
    # the capped token and the two clipped ones get no gradient; (2, -1): d/dlp (2 e^lp...) = 2 / 4
    torch.testing.assert_close(logprobs.grad, _t([[0.0, 0.0, 0.5, 0.0, 0.0]]))


def test_dual_clip_needs_c_above_one() -> None:
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        policy_loss(z, z, z, z, clip_ratio_c=1.0)


# ---------------------------------------------------------------- GSPO sequence ratio


def test_sequence_ratio_uses_the_mean_log_ratio_of_each_row() -> None:
    old = _t([[0.0, -1.0, -1.0, -1.0], [0.0, -1.0, -1.0, -1.0]])
    # row 0: token log ratios 0.2, -0.4, 0.5 -> mean 0.1 -> s = e^0.1 (inside [0.8, 1.2])
    # row 1: 0.5, 0.5, 0.5 -> s = e^0.5 = 1.65, clipped at 1.2 for A > 0
    delta = _t([[0.0, 0.2, -0.4, 0.5], [0.0, 0.5, 0.5, 0.5]])
    logprobs = (old + delta).requires_grad_(True)
    adv = _t([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    mask = _t([[0, 1, 1, 1], [0, 1, 1, 1]])
    loss, stats = policy_loss(logprobs, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.2,
                              policy_ratio="sequence", aggregation="sequence_mean")
    s0 = math.exp(0.1)
    assert loss.item() == pytest.approx((-s0 - 1.2) / 2, abs=1e-6)
    assert stats["clip_fraction"] == 0.5  # every token of row 1
    assert stats["ratio_mean"] == pytest.approx((3 * s0 + 3 * math.exp(0.5)) / 6, abs=1e-6)
    assert stats["ppo_kl"] == pytest.approx(-(0.3 + 1.5) / 6, abs=1e-6)  # per-token, unchanged
    loss.backward()
    # GSPO-token: d loss / d lp_t = -s0 * A / |row| / num_rows for row 0; row 1 is clipped
    torch.testing.assert_close(logprobs.grad, _t([[0.0] + [-s0 / 3 / 2] * 3, [0.0] * 4]))


def test_token_ratio_is_the_default_and_differs_from_sequence() -> None:
    old = torch.zeros(1, 3)
    logprobs = _t([[0.0, 0.3, -0.3]])
    adv, mask = _t([[0.0, 1.0, 1.0]]), _t([[0, 1, 1]])
    token, _ = policy_loss(logprobs, old, adv, mask, clip_eps_low=1.0, clip_eps_high=1.0)
    seq, _ = policy_loss(logprobs, old, adv, mask, clip_eps_low=1.0, clip_eps_high=1.0,
                         policy_ratio="sequence")
    assert token.item() == pytest.approx(-(math.exp(0.3) + math.exp(-0.3)) / 2, abs=1e-6)
    assert seq.item() == pytest.approx(-1.0, abs=1e-6)  # mean log ratio 0 -> s = 1


# ---------------------------------------------------------------- token weights


def test_token_weights_scale_each_token_and_keep_the_denominator() -> None:
    old = torch.zeros(1, 4)
    logprobs = torch.zeros(1, 4, requires_grad=True)
    adv, mask = _t([[0.0, 2.0, 2.0, 2.0]]), _t([[0, 1, 1, 1]])
    loss, stats = policy_loss(logprobs, old, adv, mask, token_weights=_t([[9.0, 0.5, 0.0, 1.0]]))
    assert loss.item() == pytest.approx(-(2 * 0.5 + 0 + 2 * 1.0) / 3, abs=1e-6)
    assert stats["pg_loss"] == pytest.approx(loss.item())
    loss.backward()
    torch.testing.assert_close(logprobs.grad, _t([[0.0, -1 / 3, 0.0, -2 / 3]]))


# ---------------------------------------------------------------- aggregation


def test_the_three_aggregations_by_hand() -> None:
    values = _t([[0.0, 1.0, 2.0, 3.0], [0.0, 6.0, 99.0, 99.0], [7.0, 7.0, 7.0, 7.0]])
    mask = _t([[0, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]])  # 3, 1 and 0 trained tokens
    assert aggregate(values, mask, "token_mean").item() == pytest.approx((1 + 2 + 3 + 6) / 4)
    # per row mean (2, 6) over the 2 rows that train anything
    assert aggregate(values, mask, "sequence_mean").item() == pytest.approx((2 + 6) / 2)
    # per row sum over the longest row's 3 tokens: (6 / 3 + 6 / 3) / 2
    assert aggregate(values, mask, "sequence_sum_norm").item() == pytest.approx(2.0)
    den = LossDenominators(num_tokens=8, num_samples=4, norm_tokens=10)
    assert aggregate(values, mask, "token_mean", den).item() == pytest.approx(12 / 8)
    assert aggregate(values, mask, "sequence_mean", den).item() == pytest.approx(8 / 4)
    assert aggregate(values, mask, "sequence_sum_norm", den).item() == pytest.approx(1.2 / 4)


def test_policy_loss_with_sequence_mean_weights_rows_not_tokens() -> None:
    old = torch.zeros(2, 4)
    adv = _t([[0.0, 1.0, 1.0, 1.0], [0.0, -3.0, 0.0, 0.0]])
    mask = _t([[0, 1, 1, 1], [0, 1, 0, 0]])
    token, _ = policy_loss(torch.zeros(2, 4), old, adv, mask)
    seq, _ = policy_loss(torch.zeros(2, 4), old, adv, mask, aggregation="sequence_mean")
    assert token.item() == pytest.approx((-3 + 3) / 4)
    assert seq.item() == pytest.approx((-1 + 3) / 2)


def test_unknown_aggregation_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(torch.zeros(1, 2), torch.ones(1, 2), "mean")  # type: ignore[arg-type]


# ---------------------------------------------------------------- reference KL


def test_reference_kl_estimators_by_hand() -> None:
    d = [0.5, -2.0, 30.0]  # logprobs - ref
    logprobs, ref = _t([d]), torch.zeros(1, 3)
    torch.testing.assert_close(reference_kl(logprobs, ref, "k1"), _t([d]))
    torch.testing.assert_close(reference_kl(logprobs, ref, "k2"), _t([[0.125, 2.0, 450.0]]))
    k3 = [math.exp(-x) - 1 + x for x in d]
    torch.testing.assert_close(reference_kl(logprobs, ref, "k3"), _t([k3]))
    # low_var_kl: d clamped to 20 -> k3(20) = 19.000000002, then clamped to 10; k3(-2) = 6.389
    low = [k3[0], math.exp(2.0) - 3.0, 10.0]
    torch.testing.assert_close(reference_kl(logprobs, ref, "low_var_kl"), _t([low]))
    assert reference_kl(_t([[0.0]]), _t([[0.0]]), "k3").item() == 0.0


def test_reference_kl_gradient_of_k3_is_one_minus_ref_over_current() -> None:
    logprobs = _t([[0.3]]).requires_grad_(True)
    reference_kl(logprobs, torch.zeros(1, 1), "k3").sum().backward()
    assert logprobs.grad.item() == pytest.approx(1 - math.exp(-0.3), abs=1e-6)


# ---------------------------------------------------------------- off-policy weights and masks


def test_tis_truncates_the_trainer_over_rollout_ratio() -> None:
    old = torch.log(_t([[1.0, 3.0, 0.5, 1.0, 7.0]]))
    rollout = torch.zeros(1, 5)
    mask = _t([[0, 1, 1, 1, 0]])
    w, stats = tis_weights(old, rollout, mask, clip_high=2.0, clip_low=0.6)
    torch.testing.assert_close(w, _t([[1.0, 2.0, 0.6, 1.0, 1.0]]))
    assert stats["tis_clip_fraction"] == pytest.approx(2 / 3)
    assert stats["tis_weight_mean"] == pytest.approx(3.6 / 3)


def test_icepop_keeps_the_weight_inside_the_band_and_masks_outside() -> None:
    old = torch.log(_t([[3.0, 0.4, 6.0, 1.0, 0.5, 5.0]]))
    w, stats = icepop_weights(old, torch.zeros(1, 6), torch.ones(1, 6), low=0.5, high=5.0)
    torch.testing.assert_close(w, _t([[3.0, 0.0, 0.0, 1.0, 0.5, 5.0]]), atol=1e-6, rtol=1e-6)
    assert stats["icepop_masked_fraction"] == pytest.approx(2 / 6)


def test_opsm_masks_negative_advantage_rows_that_drifted_too_far() -> None:
    current = torch.zeros(3, 3)
    # mean rollout - current over trained tokens: 0.3, 0.3, 0.05
    rollout = _t([[0.0, 0.2, 0.4], [0.0, 0.3, 0.3], [0.0, 0.05, 0.05]])
    adv = _t([[0.0, -1.0, -1.0], [0.0, 1.0, 1.0], [0.0, -1.0, -1.0]])
    mask = _t([[0, 1, 1], [0, 1, 1], [0, 1, 1]])
    keep, stats = opsm_mask(rollout, current, adv, mask, delta=0.1)
    torch.testing.assert_close(keep, _t([[1, 0, 0], [1, 1, 1], [1, 1, 1]]))
    assert stats["opsm_masked_fraction"] == pytest.approx(2 / 6)


def test_newest_version_mask_drops_tokens_of_older_attempts() -> None:
    spans = [WeightSpan("step-1", 1, 3), WeightSpan("step-2", 4, 6)]
    assert newest_version_loss_mask([0, 1, 1, 0, 1, 1, 0], spans) == [0, 0, 0, 0, 1, 1, 0]
    assert newest_version_loss_mask([0, 1, 1], []) == [0, 1, 1]
    same = [WeightSpan("v", 1, 2), WeightSpan("v", 2, 3)]
    assert newest_version_loss_mask([0, 1, 1], same) == [0, 1, 1]
