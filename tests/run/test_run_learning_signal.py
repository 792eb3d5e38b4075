"""A step that cannot teach: one WARNING naming the cause and the remedy, and a metric in its row.

Built from scored Groups and trainer statistics directly (no agents, no engine, no trainer).
"""

from __future__ import annotations

import logging
import math

import attrs
import pytest
from tests.support.groups import group_of

from relaxtrio.config import RolloutConfig
from relaxtrio.rollout.step import ScoredGroup, StepResult, score_group
from relaxtrio.run.learning_signal import cannot_teach, check_learning_signal
from relaxtrio.train import TrainStats


def _stats(**fields: float) -> TrainStats:
    base = dict(loss=0.1, clip_fraction=0.0, ppo_kl=0.0, approx_kl_k3=0.0, entropy=math.nan,
                grad_norm=0.5, rollout_logprob_abs_diff=0.0, rollout_logprob_abs_diff_max=0.0,
                num_tokens=8, num_padded_tokens=12, num_samples=4, num_optimizer_steps=1,
                num_micro_batches=1, num_nonfinite_grad_steps=0, lr=1e-6, elapsed_s=0.1)
    return TrainStats(**{**base, **fields})


async def _step(*rewards: list[list[float]]) -> StepResult:
    config = RolloutConfig()
    groups = tuple([await score_group(group_of(r), config) for r in rewards])
    assert all(isinstance(g, ScoredGroup) for g in groups)
    return StepResult(rollout_id=3, groups=groups, dropped=(), rollout_s=1.0)  # type: ignore[arg-type]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


async def test_identical_rewards_in_every_group_warn_once_with_the_dynamic_filter(caplog) -> None:
    result = await _step([[1.0], [1.0]], [[0.0], [0.0], [0.0]])
    with caplog.at_level(logging.WARNING, logger="relaxtrio"):
        row = check_learning_signal(result, _stats(grad_norm=0.0))
    assert row == {"step_cannot_teach": 1.0, "step_cannot_teach_cause": "zero_advantage"}
    [line] = _warnings(caplog)
    assert line.startswith("rollout 3 cannot teach (zero_advantage): each of the 2 Groups had identical rewards")
    assert "--dynamic-sampling-filter-path relaxtrio.rollout.filters.check_reward_nonzero_std" in line


async def test_one_group_with_differing_rewards_teaches(caplog) -> None:
    result = await _step([[1.0], [1.0]], [[0.0], [1.0]])
    with caplog.at_level(logging.WARNING, logger="relaxtrio"):
        assert check_learning_signal(result, _stats()) == {"step_cannot_teach": 0.0}
    assert _warnings(caplog) == []


async def test_every_token_masked_names_the_masking_option() -> None:
    result = await _step([[0.0], [1.0]])
    offpolicy = cannot_teach(result.groups, _stats(num_tokens=0, offpolicy_masked_tokens=4, grad_norm=0.0))
    assert offpolicy is not None and offpolicy.cause == "all_masked"
    assert "--mask-offpolicy-in-partial-rollout removed all 4" in offpolicy.detail
    icepop = cannot_teach(result.groups, _stats(icepop_masked_fraction=1.0, grad_norm=0.0))
    assert icepop is not None and icepop.cause == "all_masked" and "--icepop-low" in icepop.remedy
    assert cannot_teach(result.groups, _stats(icepop_masked_fraction=0.5)) is None


async def test_every_token_clipped_and_a_zero_gradient() -> None:
    result = await _step([[0.0], [1.0]])
    clipped = cannot_teach(result.groups, _stats(clip_fraction=1.0))
    assert clipped is not None and clipped.cause == "all_clipped" and "--eps-clip" in clipped.remedy
    assert cannot_teach(result.groups, _stats(clip_fraction=0.99)) is None
    zero = cannot_teach(result.groups, _stats(grad_norm=0.0))
    assert zero is not None and zero.cause == "zero_gradient"


async def test_samples_without_sampled_tokens_come_first() -> None:
    result = await _step([[0.0], [1.0]])
    masked = [attrs.evolve(s, sample=attrs.evolve(s.sample, loss_mask=(0, 0, 0))) for s in result.groups[0].scored]
    groups = (attrs.evolve(result.groups[0], scored=tuple(masked)),)
    verdict = cannot_teach(groups, _stats(grad_norm=0.0))
    assert verdict is not None and verdict.cause == "no_response_tokens"


async def test_no_update_checks_only_the_samples() -> None:
    assert cannot_teach((await _step([[0.0], [1.0]])).groups, None) is None
    verdict = cannot_teach((await _step([[2.0], [2.0]])).groups, None)
    assert verdict is not None and verdict.cause == "zero_advantage"
    assert cannot_teach((), None) is None
