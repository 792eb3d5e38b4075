"""Hooks that port: relaxtrio's and Relax's signatures, sync or async, checked at start-up; a hook
that fails drops only its Group (reason and metric), unless it fails every Group of a step."""

from __future__ import annotations

import collections
import types

import pytest
import trio
from tests.support.groups import group_of

from relaxtrio._errors import ConfigError
from relaxtrio.config import RolloutConfig
from relaxtrio.rollout.accounting import GroupStages
from relaxtrio.rollout.filters import DynamicFilterOutput, FilterVerdict, run_dynamic_filter
from relaxtrio.rollout.hooks import HookError, hook_failure_kind, hook_style, load_hook
from relaxtrio.rollout.rewards import score_rewards
from relaxtrio.rollout.step import ScoredGroup, group_metrics, score_group
from relaxtrio.rollout.step_book import StepBook

ARGS = types.SimpleNamespace(reward_key="score", n_samples_per_prompt=2)
NO_STAGES = GroupStages(resident=0, prepare=0, prepare_ready=0, leased=0, runtime=0, interrupted=0, finished=0)
RelaxVerdict = collections.namedtuple("RelaxVerdict", "keep reason")  # duck-typed like Relax's


def _rewards(group) -> list:
    return [s.reward for session in group.sessions for s in session.samples]


@pytest.mark.parametrize(
    ("path", "kind", "style"),
    [("tests.support.rewards.length_reward", "reward", "relaxtrio"),
     ("tests.support.rewards.relax_reward", "reward", "relax"),
     ("tests.support.rewards.group_rank_reward", "group_reward", "relaxtrio"),
     ("tests.support.rewards.relax_group_reward", "group_reward", "relax"),
     ("tests.support.rewards.keep_none", "dynamic_filter", "relaxtrio"),
     ("tests.support.rewards.relax_filter", "dynamic_filter", "relax"),
     ("tests.support.credit.outcome_times_usefulness", "custom_advantage", "relaxtrio")],
)
def test_both_signatures_load(path, kind, style) -> None:
    fn = load_hook(path, flag="--x", kind=kind)
    assert hook_style(fn, kind, flag="--x") == style


@pytest.mark.parametrize("kind", ["reward", "group_reward", "dynamic_filter", "custom_advantage"])
def test_a_wrong_signature_is_a_startup_error_naming_the_hook_and_both_shapes(kind) -> None:
    with pytest.raises(ConfigError) as info:
        load_hook("tests.support.rewards.three_arguments", flag="--custom-rm-path", kind=kind)
    message = str(info.value)
    assert message.startswith("--custom-rm-path: three_arguments(a, b, c) does not fit the")
    assert "fn(args, " in message and "(Relax), sync or async" in message
    assert info.value.param == "--custom-rm-path"


async def test_relax_reward_models_get_args_sync_and_async() -> None:
    group = group_of([[None], [None]])
    rm = load_hook("tests.support.rewards.relax_reward", flag="--custom-rm-path", kind="reward")
    await score_rewards(group, RolloutConfig(custom_rm=rm, reward_key="score", hook_args=ARGS))
    assert _rewards(group) == [{"score": 1.0, "key_seen": 1.0}] * 2

    group = group_of([[None], [None], [None]])
    grm = load_hook("tests.support.rewards.relax_group_reward", flag="--custom-rm-path", kind="group_reward")
    await score_rewards(group, RolloutConfig(custom_rm=grm, group_rm=True, hook_args=ARGS))
    assert _rewards(group) == [0.0, 1.0, 2.0]


async def test_relax_filter_and_verdict_object_filter_the_group() -> None:
    seen = []

    def relax_filter(args, samples, **kwargs):
        seen.append((args, len(samples)))
        return RelaxVerdict(keep=False, reason="too easy")

    group = group_of([[1.0], [0.0]])
    verdict = await score_group(group, RolloutConfig(dynamic_filter=relax_filter, hook_args=ARGS))
    assert verdict == FilterVerdict(group=group, source="dynamic_filter", reason="too_easy")
    assert seen == [(ARGS, 2)]


async def test_async_filter_and_async_custom_advantage_are_awaited() -> None:
    async def keep(samples, rewards):
        await trio.lowlevel.checkpoint()
        return DynamicFilterOutput(keep=rewards != [1.0, 1.0])

    assert (await run_dynamic_filter(keep, [], [0.0, 1.0])).keep
    assert not (await run_dynamic_filter(keep, [], [1.0, 1.0])).keep

    async def relax_credit(args, metadata_by_slot):
        await trio.lowlevel.checkpoint()
        return [{None: float(args.n_samples_per_prompt)} for _ in metadata_by_slot]

    scored = await score_group(group_of([[1.0], [0.0]]),
                               RolloutConfig(custom_advantage=relax_credit, hook_args=ARGS))
    assert isinstance(scored, ScoredGroup) and [s.advantage for s in scored.scored] == [2.0, 2.0]


def _book(config: RolloutConfig) -> StepBook:
    return StepBook.open(3, config, NO_STAGES, warnings_before=0, backfilled=0)


async def test_a_failing_hook_drops_its_group_with_the_reason_and_a_metric() -> None:
    def credit(metadata_by_slot):
        if len(metadata_by_slot) == 3:
            raise ValueError("boom")
        return [{None: 0.5} for _ in metadata_by_slot]

    config = RolloutConfig(rollout_batch_size=1, custom_advantage=credit, show_progress=False)
    book = _book(config)
    bad, good = group_of([[1.0]] * 3), group_of([[1.0]] * 2)
    assert await book.file(bad, config) is None
    assert await book.file(good, config) is not None
    assert bad.dropped_reason == "custom_advantage hook failed: ValueError: boom"
    assert hook_failure_kind(bad.dropped_reason) == "custom_advantage"
    result = book.result(aborted=0, stages=NO_STAGES, barrier_warnings=0)
    assert result.dropped == (bad,) and len(result.groups) == 1
    row = group_metrics(result, config)
    assert row["rollout/hook_failures/custom_advantage"] == 1.0 and row["dropped_groups"] == 1.0


async def test_a_raising_reward_model_is_counted_per_hook() -> None:
    def rm(sample):
        raise RuntimeError("judge unreachable")

    config = RolloutConfig(rollout_batch_size=1, custom_rm=rm, show_progress=False)
    book = _book(config)
    group = group_of([[None], [None]])
    await score_rewards(group, config)
    assert group.dropped_reason == "reward hook failed: RuntimeError: judge unreachable"
    await book.file(group, config)
    assert book.hook_failures == {"reward": 1}


async def test_a_hook_that_fails_every_group_of_a_step_stops_the_run() -> None:
    def credit(metadata_by_slot):
        raise KeyError("main")

    config = RolloutConfig(rollout_batch_size=2, custom_advantage=credit, show_progress=False)
    book = _book(config)
    for _ in range(2):
        await book.file(group_of([[1.0], [0.0]]), config)
    with pytest.raises(HookError, match=r"every Group of rollout 3 failed in a hook \(2\); the first: "
                                        r"custom_advantage hook failed: KeyError: 'main'"):
        book.result(aborted=0, stages=NO_STAGES, barrier_warnings=0)
