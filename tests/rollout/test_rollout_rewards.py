"""Reward models (sync, async, per Group), reward metrics and pass rates, by hand."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing
from tests.support.groups import group_of, sample

from relaxtrio.config import RolloutConfig
from relaxtrio.rollout.rewards import (
    metadata_metrics,
    passrate_metrics,
    reward_metrics,
    score_rewards,
)
from relaxtrio.rollout.step import score_group


def _rewards(group) -> list:
    return [s.reward for session in group.sessions for s in session.samples]


async def test_sync_rm_scores_only_samples_without_an_agent_reward() -> None:
    seen = []

    def rm(sample):
        seen.append(sample.session_id)
        return 0.25

    group = group_of([[None], [1.0], [None]])
    await score_rewards(group, RolloutConfig(custom_rm=rm))
    assert _rewards(group) == [0.25, 1.0, 0.25]
    assert seen == [group.sessions[0].session_id, group.sessions[2].session_id]
    assert not group.dropped


async def test_async_rm_calls_of_one_group_run_concurrently() -> None:
    started, release = [], trio.Event()

    async def rm(sample):
        started.append(sample.session_id)
        await release.wait()  # every call must have started before any finishes
        return {"score": 1.0}

    group = group_of([[None], [None], [None]])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(score_rewards, group, RolloutConfig(custom_rm=rm, reward_key="score"))
        await trio.testing.wait_all_tasks_blocked()
        assert len(started) == 3
        release.set()
    assert _rewards(group) == [{"score": 1.0}] * 3


async def test_group_rm_is_one_call_in_session_then_export_order() -> None:
    calls = []

    def rm(samples):
        calls.append([(s.session_id, s.name) for s in samples])
        return [float(i) for i in range(len(samples))]

    group = group_of([[1.0, None], [None, 5.0]])  # agent rewards are overwritten too
    await score_rewards(group, RolloutConfig(custom_rm=rm, group_rm=True))
    ids = [s.session_id for s in group.sessions]
    assert calls == [[(ids[0], "main"), (ids[0], "searcher_0"), (ids[1], "main"), (ids[1], "searcher_0")]]
    assert _rewards(group) == [0.0, 1.0, 2.0, 3.0]


async def test_async_group_rm() -> None:
    async def rm(samples):
        await trio.lowlevel.checkpoint()
        return [7.0] * len(samples)

    group = group_of([[None], [None]])
    await score_rewards(group, RolloutConfig(custom_rm=rm, group_rm=True))
    assert _rewards(group) == [7.0, 7.0]


async def test_ordinary_rm_is_skipped_with_custom_advantage_but_not_in_eval() -> None:
    def rm(sample):
        return 1.0

    config = RolloutConfig(custom_rm=rm, custom_advantage=lambda slots: None)
    train = group_of([[None]])
    await score_rewards(train, config)
    assert _rewards(train) == [None]
    evaluation = group_of([[None]], mode="eval")
    await score_rewards(evaluation, config)
    assert _rewards(evaluation) == [1.0]


@pytest.mark.parametrize(
    ("rm", "group_rm", "reason"),
    [
        (lambda s: float("nan"), False, "must return a finite number or a reward object"),
        (lambda s: "good", False, "must return a finite number or a reward object"),
        (lambda s: 1 / 0, False, "reward hook failed: ZeroDivisionError"),
        (lambda samples: [1.0], True, "must return a list of 2 rewards"),
        (lambda samples: None, True, "got NoneType"),
    ],
)
async def test_bad_reward_models_drop_the_group(rm, group_rm, reason) -> None:
    group = group_of([[None], [None]])
    await score_rewards(group, RolloutConfig(custom_rm=rm, group_rm=group_rm))
    assert group.dropped and reason in group.dropped_reason


async def test_async_rm_error_is_reported_unwrapped() -> None:
    async def rm(sample):
        raise RuntimeError("scorer down")

    group = group_of([[None], [None]])
    await score_rewards(group, RolloutConfig(custom_rm=rm))
    assert group.dropped_reason == "reward hook failed: RuntimeError: scorer down"


async def test_scored_object_rewards_reach_the_estimator() -> None:
    group = group_of([[None], [None]])

    def rm(s):
        return {"score": float(s.session_id.endswith("s1")), "length": 2.0}

    config = RolloutConfig(custom_rm=rm, reward_key="score")
    await score_rewards(group, config)
    scored = await score_group(group, config)
    assert [s.reward for s in scored.scored] == [0.0, 1.0]
    assert [s.advantage for s in scored.scored] == pytest.approx([-1.0, 1.0], abs=1e-5)


# ---------------------------------------------------------------- metrics


def test_reward_metrics_raw_reward_and_object_fields() -> None:
    samples = [sample({"acc": 1.0, "len": 10, "note": "x"}), sample({"acc": 0.0, "len": 30}),
               sample({"acc": 1.0, "len": 20}), sample(None)]
    got = reward_metrics(samples, "acc")
    assert got["rollout/raw_reward"] == pytest.approx(2 / 3)
    assert (got["rollout/len/mean"], got["rollout/len/median"]) == (20.0, 20.0)
    assert (got["rollout/len/max"], got["rollout/len/min"]) == (30.0, 10.0)
    assert got["rollout/acc/mean"] == pytest.approx(2 / 3)
    assert not any("note" in k for k in got)
    assert reward_metrics([sample(0.5), sample(1.5)], None) == {"rollout/raw_reward": 1.0}


def test_metadata_metrics_skip_identifiers_and_flatten_lists() -> None:
    samples = [
        sample(1.0, export_metadata={"task_success": 1.0, "scores": [1, 2], "id": 5, "_private": 3,
                                     "flag": True, "name": "a", "rollout_turns": 4}),
        sample(1.0, export_metadata={"task_success": 0.0, "scores": [6]}),
    ]
    got = metadata_metrics(samples)
    assert got == {
        "scores/mean": 3.0, "scores/median": 2.0, "scores/max": 6.0, "scores/min": 1.0,
        "task_success/mean": 0.5, "task_success/median": 0.5, "task_success/max": 1.0,
        "task_success/min": 0.0,
    }


def test_pass_at_k_by_hand() -> None:
    # Group A: 4 Sessions, 1 success. pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 1/2;
    # pass@4 = 1. Group B: 4 Sessions, 0 successes: all 0.
    a = [[1.0], [0.0], [0.0], [0.0]]
    b = [[0.0], [0.0], [0.0], [0.0]]
    got = passrate_metrics([a, b])
    assert got == {"rollout/pass@1": pytest.approx(1 / 8), "rollout/pass@2": pytest.approx(1 / 4),
                   "rollout/pass@4": pytest.approx(1 / 2)}


def test_passrate_uses_the_one_representative_context_per_session() -> None:
    # main carries the outcome, searchers leave reward unset.
    group = [[1.0, None, None], [0.0, None, None]]
    assert passrate_metrics([group]) == {"rollout/pass@1": 0.5, "rollout/pass@2": 1.0}


@pytest.mark.parametrize(
    "bad",
    [
        [[1.0, 1.0], [0.0, None]],  # a Group RM rewarded every row: grouping lost
        [[None], [1.0]],  # a Session without representative reward
        [[0.5], [1.0]],  # not a 0/1 outcome
    ],
)
def test_passrate_skips_groups_that_break_the_rules(bad) -> None:
    got = passrate_metrics([bad, [[1.0], [1.0]]])
    assert got["rollout/passrate/skipped_groups"] == 1.0
    assert got["rollout/pass@1"] == 1.0  # the valid Group only


async def test_group_metrics_carry_the_reward_metrics() -> None:
    from relaxtrio.rollout.filters import FilterVerdict
    from relaxtrio.rollout.step import StepResult, group_metrics

    config = RolloutConfig(reward_key="acc", log_passrate=True)
    groups = [group_of([[{"acc": 1.0, "len": 4}], [{"acc": 0.0, "len": 2}]],
                       metadata=[[{"steps": 3}], [{"steps": 5}]])]
    result = StepResult(rollout_id=0, groups=tuple([await score_group(g, config) for g in groups]), dropped=(),
                        rollout_s=1.0, filtered=(
                            FilterVerdict(group=group_of([[1.0]]), source="dynamic_filter", reason="zero_std"),
                            FilterVerdict(group=group_of([[1.0]]), source="dynamic_filter"),
                            FilterVerdict(group=group_of([[1.0]]), source="custom_advantage")))
    row = group_metrics(result, config)
    assert row["rollout/raw_reward"] == 0.5 and row["rollout/len/mean"] == 3.0
    assert row["steps/mean"] == 4.0 and row["rollout/pass@1"] == 0.5 and row["rollout/pass@2"] == 1.0
    assert row["filtered_groups"] == 3.0 and row["rollout/dynamic_filter/drop_zero_std"] == 1.0
    assert math.isclose(row["reward_mean"], 0.5)
    assert "rollout/raw_reward" not in group_metrics(result)  # without a config: the base metrics


async def test_sessions_ended_by_a_context_overflow_are_counted_per_step() -> None:
    """Accepted and dropped Groups alike: the agent that could not recover usually fails its Group."""
    from relaxtrio.rollout.step import StepResult, group_metrics

    kept, dropped = group_of([[1.0], [0.0]]), group_of([[1.0], [1.0]])
    kept.sessions[1].overflowed_last = True
    dropped.sessions[0].overflowed_last = True
    dropped.sessions[1].context_overflows = 3  # overflowed earlier, then recovered (compacted)
    result = StepResult(rollout_id=0, groups=(await score_group(kept, RolloutConfig()),), dropped=(dropped,),
                        rollout_s=1.0)
    assert group_metrics(result)["overflow_ended_sessions"] == 2.0


async def test_images_shown_as_text_are_counted_per_step() -> None:
    from relaxtrio.rollout.step import StepResult, group_metrics

    group = group_of([[1.0], [0.0]])
    group.sessions[0].images_as_text, group.sessions[1].images_as_text = 2, 1
    result = StepResult(rollout_id=0, groups=(await score_group(group, RolloutConfig()),), dropped=(), rollout_s=1.0)
    assert group_metrics(result)["images_as_text"] == 3.0
