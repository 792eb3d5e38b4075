"""relaxtrio.rollout.advantages: GRPO normalization and the primary reward scalar."""

from __future__ import annotations

import math

import pytest

from relaxtrio._errors import ExportError, InvalidRequestError
from relaxtrio.rollout.advantages import grpo_advantages, scalar_reward


def test_two_rewards_become_minus_one_plus_one() -> None:
    adv = grpo_advantages([0.0, 1.0], eps=0.0)
    assert adv == [-1.0, 1.0]  # population std of (0, 1) is 0.5


def test_known_values_population_std() -> None:
    rewards = [1.0, 2.0, 3.0, 4.0]
    std = math.sqrt(1.25)  # mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 over n = 4
    adv = grpo_advantages(rewards, eps=1e-6)
    expected = [(r - 2.5) / (std + 1e-6) for r in rewards]
    assert adv == pytest.approx(expected, abs=1e-12)
    assert math.fsum(adv) == pytest.approx(0.0, abs=1e-12)


def test_mean_zero_and_unit_std_for_arbitrary_group() -> None:
    rewards = [0.3, -1.7, 2.2, 0.0, 5.5, 0.3, -0.1]
    adv = grpo_advantages(rewards, eps=0.0)
    n = len(adv)
    assert math.fsum(adv) / n == pytest.approx(0.0, abs=1e-12)
    assert math.sqrt(math.fsum(a * a for a in adv) / n) == pytest.approx(1.0, abs=1e-12)
    # the order follows the input: the largest reward gets the largest advantage
    assert max(range(n), key=adv.__getitem__) == rewards.index(5.5)


def test_all_equal_rewards_give_exact_zeros() -> None:
    assert grpo_advantages([0.1, 0.1, 0.1]) == [0.0, 0.0, 0.0]
    assert grpo_advantages([1.0] * 8, std_normalize=False) == [0.0] * 8


def test_single_sample_and_empty_group() -> None:
    assert grpo_advantages([3.0]) == [0.0]
    assert grpo_advantages([]) == []


def test_dr_grpo_variant_only_centers() -> None:
    assert grpo_advantages([1.0, 2.0, 6.0], std_normalize=False) == pytest.approx([-2.0, -1.0, 3.0])


@pytest.mark.parametrize("bad", [math.nan, math.inf, True, "1.0", None])
def test_non_finite_or_non_numeric_reward_is_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match=r"rewards\[1\]"):
        grpo_advantages([0.0, bad, 1.0])  # type: ignore[list-item]


def test_negative_eps_is_rejected() -> None:
    with pytest.raises(ValueError, match="eps"):
        grpo_advantages([0.0, 1.0], eps=-1.0)


def test_scalar_reward_number_and_object() -> None:
    assert scalar_reward(1, None) == 1.0
    assert scalar_reward(0.25, "score") == 0.25  # a number ignores reward_key
    assert scalar_reward({"score": 0.5, "len": 12}, "score") == 0.5


def test_scalar_reward_missing_reward() -> None:
    with pytest.raises(ExportError, match="reward is missing") as info:
        scalar_reward(None, "score")
    assert info.value.param == "reward"
    assert not isinstance(info.value, InvalidRequestError)  # agent output, not a 400


def test_scalar_reward_object_without_key_configured() -> None:
    with pytest.raises(ExportError, match="configure reward_key") as info:
        scalar_reward({"score": 1.0}, None)
    assert "score" in str(info.value)


def test_scalar_reward_key_absent_lists_keys() -> None:
    with pytest.raises(ExportError, match=r"no key 'acc' \(keys: len, score\)") as info:
        scalar_reward({"score": 1.0, "len": 3}, "acc")
    assert info.value.param == "reward.acc"


@pytest.mark.parametrize("bad", [math.nan, -math.inf, "1", True, None, [1.0]])
def test_scalar_reward_value_must_be_finite_number(bad: object) -> None:
    with pytest.raises(ExportError) as info:
        scalar_reward({"score": bad}, "score")
    assert info.value.param == "reward.score"
    if bad is not None and not isinstance(bad, (str, list)):
        with pytest.raises(ExportError):
            scalar_reward(bad, None)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the other estimators
# One Group of rewards (1, 2, 6): mean 3, centered (-2, -1, 3), population std sqrt(14 / 3).


def test_dr_grpo_is_the_centered_reward() -> None:
    from relaxtrio.rollout.advantages import dr_grpo_advantages

    assert dr_grpo_advantages([1.0, 2.0, 6.0]) == [-2.0, -1.0, 3.0]
    assert dr_grpo_advantages([4.0, 4.0]) == [0.0, 0.0]


def test_rloo_subtracts_the_mean_of_the_other_rewards() -> None:
    from relaxtrio.rollout.advantages import rloo_advantages

    # 1 - (2 + 6) / 2 = -3;  2 - (1 + 6) / 2 = -1.5;  6 - (1 + 2) / 2 = 4.5
    assert rloo_advantages([1.0, 2.0, 6.0]) == pytest.approx([-3.0, -1.5, 4.5], abs=1e-12)
    assert rloo_advantages([0.0, 1.0]) == [-1.0, 1.0]  # 0 - 1, 1 - 0
    assert rloo_advantages([5.0]) == [0.0]  # no other sample to compare with
    assert rloo_advantages([]) == []


def test_reinforce_plus_plus_baseline_group_step_is_the_centered_reward() -> None:
    from relaxtrio.rollout.advantages import reinforce_plus_plus_baseline_advantages

    # the batch normalization is the trainer's whitening (test_train_estimators.py)
    assert reinforce_plus_plus_baseline_advantages([1.0, 2.0, 6.0]) == [-2.0, -1.0, 3.0]


@pytest.mark.parametrize(
    ("estimator", "std_normalize", "expected"),
    [
        ("grpo", True, [-2 / math.sqrt(14 / 3), -1 / math.sqrt(14 / 3), 3 / math.sqrt(14 / 3)]),
        ("grpo", False, [-2.0, -1.0, 3.0]),
        ("gspo", True, [-2 / math.sqrt(14 / 3), -1 / math.sqrt(14 / 3), 3 / math.sqrt(14 / 3)]),
        ("dr_grpo", True, [-2.0, -1.0, 3.0]),
        ("rloo", True, [-3.0, -1.5, 4.5]),
        ("reinforce_plus_plus_baseline", True, [-2.0, -1.0, 3.0]),
    ],
)
def test_group_advantages_dispatches_every_estimator(estimator, std_normalize, expected) -> None:
    from relaxtrio.rollout.advantages import group_advantages

    got = group_advantages(estimator, [1.0, 2.0, 6.0], std_normalize=std_normalize)
    assert got == pytest.approx(expected, abs=1e-5)  # eps 1e-6 in GRPO's denominator


def test_unknown_estimator_is_rejected() -> None:
    from relaxtrio.rollout.advantages import group_advantages

    with pytest.raises(ValueError, match="unknown advantage estimator"):
        group_advantages("ppo", [1.0])  # type: ignore[arg-type]
