"""score_group: each Group's rewards become base credits through the configured estimator."""

from __future__ import annotations

import pytest
from tests.support.groups import exported_group, group_of
from tests.support.sessions import add_session

from relaxtrio import ConfigError
from relaxtrio.config import RolloutConfig
from relaxtrio.nursery.group import Group
from relaxtrio.rollout.step import score_group


def _group(rewards: list[float]) -> Group:
    return group_of([[r] for r in rewards])


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
async def test_score_group_uses_the_configured_estimator(estimator, std, expected) -> None:
    config = RolloutConfig(advantage_estimator=estimator, grpo_std_normalization=std)
    scored = await score_group(_group([0.0, 0.0, 2.0, 2.0]), config)
    assert [s.advantage for s in scored.scored] == pytest.approx(expected, abs=1e-5)
    assert [s.reward for s in scored.scored] == [0.0, 0.0, 2.0, 2.0]


async def test_grpo_std_normalization_switch_changes_the_scale() -> None:
    rewards = [0.0, 4.0]  # centered (-2, 2), std 2
    on = await score_group(_group(rewards), RolloutConfig())
    off = await score_group(_group(rewards), RolloutConfig(grpo_std_normalization=False))
    assert [s.advantage for s in on.scored] == pytest.approx([-1.0, 1.0], abs=1e-5)
    assert [s.advantage for s in off.scored] == [-2.0, 2.0]


@pytest.mark.parametrize("estimator", ["rloo", "reinforce_plus_plus_baseline"])
def test_estimators_with_their_own_baseline_refuse_custom_advantage(estimator: str) -> None:
    with pytest.raises(ConfigError, match=f"--advantage-estimator {estimator} cannot be "
                                                  "combined with --agentic-custom-advantage-path"):
        RolloutConfig(advantage_estimator=estimator, custom_advantage=lambda slots: None)


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "gspo"])
def test_grpo_family_accepts_custom_advantage(estimator: str) -> None:
    RolloutConfig(advantage_estimator=estimator, custom_advantage=lambda slots: None)


def test_unknown_estimator_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="advantage_estimator must be one of"):
        RolloutConfig(advantage_estimator="ppo")  # type: ignore[arg-type]


async def test_custom_advantage_receives_only_export_metadata() -> None:
    seen = []

    def record_input(metadata_by_slot):
        seen.append(metadata_by_slot)
        return [{name: 1.0 for name in slot} for slot in metadata_by_slot]

    group = exported_group([
        [{"name": "main", "metadata": {"outcome": 1.0}, "reward": 1.0},
         {"name": "searcher_0", "metadata": {"usefulness": 0.6}}],
        [{"name": "main", "metadata": {"outcome": 0.0}, "reward": 0.0},
         {"name": "searcher_0", "metadata": {"usefulness": 0.2}}],
    ])
    await score_group(group, RolloutConfig(custom_advantage=record_input))
    # The documented example input, exactly: no dataset metadata, tools, template kwargs or trace.
    assert seen == [[
        {"main": {"outcome": 1.0}, "searcher_0": {"usefulness": 0.6}},
        {"main": {"outcome": 0.0}, "searcher_0": {"usefulness": 0.2}},
    ]]


async def test_implicit_export_reaches_custom_advantage_under_the_key_none() -> None:
    from relaxtrio.forest import Conversation, SessionOutput, export_samples

    seen = []

    def record_input(metadata_by_slot):
        seen.append(metadata_by_slot)
        return [{None: 0.5} for _ in metadata_by_slot]

    group = Group(group_id="train:group_000003")
    session = add_session(group, session_id="s0", budget_s=1.0)
    forest = session.forest
    obs = forest.add_observation(forest.match(Conversation.from_wire([{"role": "user", "content": "q"}])),
                                 token_ids=[1, 2])
    forest.add_response(obs, {"role": "assistant", "content": "a"}, token_ids=[3], rollout_logprobs=[-1.0],
                        finish_reason="stop", request_id="q", rollout_id=0)
    session.samples.extend(export_samples(forest, SessionOutput(metadata={"score": 3}, reward=1.0),
                                          dataset_metadata={"id": 1}))
    scored = await score_group(group, RolloutConfig(custom_advantage=record_input))
    assert seen == [[{None: {"score": 3}}]]
    assert [s.advantage for s in scored.scored] == [0.5]


async def test_eval_never_calls_custom_advantage() -> None:
    # Evaluation never calls the hook: a hook error there would end the run.
    def hook(metadata_by_slot):
        raise AssertionError("custom advantage called during eval")

    config = RolloutConfig(custom_advantage=hook, reward_key="score")
    group = exported_group([
        [{"name": "main", "metadata": {"outcome": 1.0}, "reward": {"score": 1.0}},
         {"name": "searcher_0", "metadata": {"usefulness": 0.6}}],
        [{"name": "main", "metadata": {"outcome": 0.0}, "reward": {"score": 0.0}}],
    ], mode="eval")
    scored = await score_group(group, config)
    # Only rewarded contexts are scored in eval; siblings without a reward are not.
    assert [s.name for s in scored.samples] == ["main", "main"]
    assert [s.reward for s in scored.scored] == [1.0, 0.0]
