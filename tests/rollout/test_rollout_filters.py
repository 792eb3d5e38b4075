"""Dynamic sampling filters and the eval scoring path (no filter, its own reward key)."""

from __future__ import annotations

import pytest
from tests.support.groups import group_of

from relaxtrio import ExportError
from relaxtrio.config import RolloutConfig
from relaxtrio.rollout.filters import (
    DynamicFilterOutput,
    FilterVerdict,
    check_reward_nonzero_std,
    run_dynamic_filter,
)
from relaxtrio.rollout.step import ScoredGroup, score_group


def test_builtin_filter_drops_groups_whose_rewards_are_all_equal() -> None:
    assert check_reward_nonzero_std([], [1.0, 0.0, 1.0]) == DynamicFilterOutput(keep=True)
    assert check_reward_nonzero_std([], [1.0, 1.0]) == DynamicFilterOutput(keep=False, reason="zero_std")
    assert check_reward_nonzero_std([], [0.3]).keep is False  # a single reward has no spread
    assert check_reward_nonzero_std([], [1.0, None, 0.0]).keep is True  # unset rewards ignored


@pytest.mark.parametrize(
    ("verdict", "reason"),
    [(False, None), (DynamicFilterOutput(False, "too easy!"), "too_easy_"),
     (DynamicFilterOutput(False, ""), None)],
)
async def test_a_dropping_verdict_is_returned_with_a_metric_safe_reason(verdict, reason) -> None:
    assert await run_dynamic_filter(lambda samples, rewards: verdict, [], []) == DynamicFilterOutput(False, reason)


async def test_keeping_verdicts_and_bad_filters() -> None:
    assert await run_dynamic_filter(lambda s, r: True, [], []) == DynamicFilterOutput(True)
    assert await run_dynamic_filter(lambda s, r: DynamicFilterOutput(True, "kept"), [], []) == DynamicFilterOutput(True)
    with pytest.raises(ExportError, match=r"must return a bool or a DynamicFilterOutput\(keep, reason\), got int"):
        await run_dynamic_filter(lambda s, r: 1, [], [])
    with pytest.raises(ExportError, match="dynamic_filter hook failed: KeyError"):
        await run_dynamic_filter(lambda s, r: {}["x"], [], [])


async def test_score_group_runs_the_filter_on_train_groups_with_their_rewards() -> None:
    seen = []

    def spy(samples, rewards):
        seen.append((len(samples), rewards))
        return check_reward_nonzero_std(samples, rewards)

    config = RolloutConfig(dynamic_filter=spy)
    assert [s.reward for s in (await score_group(group_of([[0.0], [1.0]]), config)).scored] == [0.0, 1.0]
    group = group_of([[1.0], [1.0]])
    verdict = await score_group(group, config)
    assert verdict == FilterVerdict(group=group, source="dynamic_filter", reason="zero_std")
    assert verdict.message == "Filtered 1 group: dynamic sampling filter: zero_std"
    assert verdict.metric == "rollout/dynamic_filter/drop_zero_std"
    assert seen == [(2, [0.0, 1.0]), (2, [1.0, 1.0])]


async def test_custom_advantage_returning_none_filters_the_group_without_a_metric() -> None:
    group = group_of([[1.0], [0.0]])
    verdict = await score_group(group, RolloutConfig(custom_advantage=lambda exports: None,
                                               dynamic_filter=check_reward_nonzero_std))
    assert verdict == FilterVerdict(group=group, source="custom_advantage")
    assert verdict.message == "Filtered 1 group: the custom advantage function returned None"
    assert verdict.metric is None


async def test_eval_groups_are_never_filtered() -> None:
    config = RolloutConfig(dynamic_filter=lambda s, r: False)
    scored = await score_group(group_of([[1.0], [1.0]], mode="eval"), config)
    assert isinstance(scored, ScoredGroup)
    assert [s.reward for s in scored.scored] == [1.0, 1.0]


async def test_eval_reward_key_overrides_reward_key_in_eval_only() -> None:
    config = RolloutConfig(reward_key="train_score", eval_reward_key="accuracy")
    rewards = [[{"train_score": 0.2, "accuracy": 1.0}], [{"train_score": 0.4, "accuracy": 0.0}]]
    assert [s.reward for s in (await score_group(group_of(rewards, mode="eval"), config)).scored] == [1.0, 0.0]
    assert [s.reward for s in (await score_group(group_of(rewards), config)).scored] == [0.2, 0.4]


async def test_an_eval_session_without_any_reward_is_an_error() -> None:
    with pytest.raises(ExportError, match="session 1 wrote no reward"):
        await score_group(group_of([[1.0], [None]], mode="eval"), RolloutConfig())
