"""score_group: each Group's rewards become base credits through the configured estimator."""

from __future__ import annotations

import pytest

from relaxtrio import InvalidRequestError
from relaxtrio.config import RolloutConfig
from relaxtrio.forest import SessionForest, TrainingSample
from relaxtrio.nursery.agent import ActiveBudget
from relaxtrio.nursery.group import Group
from relaxtrio.nursery.session import Session
from relaxtrio.rollout.step import score_group


def _group(rewards: list[float]) -> Group:
    group = Group(group_id="train:group_000001")
    for i, reward in enumerate(rewards):
        session = Session(session_id=f"s{i}", group=group, index=i, input_payload={},
                          forest=SessionForest(f"s{i}"), budget=ActiveBudget(total_s=1.0))
        session.samples.append(TrainingSample(
            name=None, session_id=f"s{i}", token_ids=(1, 2, 3), prompt_length=1,
            loss_mask=(0, 1, 1), rollout_logprobs=(0.0, -1.0, -1.0), reward=reward,
            status="completed", weight_versions=(), metadata={}))
        group.sessions.append(session)
    return group


@pytest.mark.parametrize(
    ("estimator", "std", "expected"),
    [
        ("grpo", True, [-1.0, -1.0, 1.0, 1.0]),  # rewards (0, 0, 2, 2): mean 1, std 1
        ("grpo", False, [-1.0, -1.0, 1.0, 1.0]),
        ("dr_grpo", True, [-1.0, -1.0, 1.0, 1.0]),
        ("rloo", True, [-4 / 3, -4 / 3, 4 / 3, 4 / 3]),  # 0 - (0 + 2 + 2) / 3
        ("reinforce_plus_plus_baseline", True, [-1.0, -1.0, 1.0, 1.0]),
    ],
)
def test_score_group_uses_the_configured_estimator(estimator, std, expected) -> None:
    config = RolloutConfig(advantage_estimator=estimator, grpo_std_normalization=std)
    scored = score_group(_group([0.0, 0.0, 2.0, 2.0]), config)
    assert list(scored.advantages) == pytest.approx(expected, abs=1e-5)
    assert list(scored.rewards) == [0.0, 0.0, 2.0, 2.0]


def test_grpo_std_normalization_switch_changes_the_scale() -> None:
    rewards = [0.0, 4.0]  # centered (-2, 2), std 2
    on = score_group(_group(rewards), RolloutConfig())
    off = score_group(_group(rewards), RolloutConfig(grpo_std_normalization=False))
    assert list(on.advantages) == pytest.approx([-1.0, 1.0], abs=1e-5)
    assert list(off.advantages) == [-2.0, 2.0]


@pytest.mark.parametrize("estimator", ["rloo", "reinforce_plus_plus_baseline"])
def test_estimators_with_their_own_baseline_refuse_custom_advantage(estimator: str) -> None:
    with pytest.raises(InvalidRequestError, match=f"--advantage-estimator {estimator} cannot be "
                                                  "combined with --agentic-custom-advantage-path"):
        RolloutConfig(advantage_estimator=estimator, custom_advantage=lambda slots: None)


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "gspo"])
def test_grpo_family_accepts_custom_advantage(estimator: str) -> None:
    RolloutConfig(advantage_estimator=estimator, custom_advantage=lambda slots: None)


def test_unknown_estimator_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="advantage_estimator must be one of"):
        RolloutConfig(advantage_estimator="ppo")  # type: ignore[arg-type]
