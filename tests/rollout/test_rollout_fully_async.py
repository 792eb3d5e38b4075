"""Fully async (docs/scheduling.md#fully-async): the staleness bound in weight versions, Groups
waiting for weights with their budgets paused, the rollout running ahead, the final backfill."""

from __future__ import annotations

import argparse

import attrs
import pytest
import trio
from tests.support.clock import RealTimeLimit
from tests.support.groups import group_of
from tests.support.pipeline import open_test_pipeline, prompts
from tests.support.sessions import add_session

from relaxtrio import ConfigError
from relaxtrio._errors import RelaxError
from relaxtrio.cli.train_config import train_config
from relaxtrio.cli.train_flags import add_train_parser
from relaxtrio.config import RolloutConfig
from relaxtrio.forest import WeightSpan
from relaxtrio.nursery.group import Group
from relaxtrio.nursery.session import Session
from relaxtrio.rollout.accounting import group_stages
from relaxtrio.rollout.fully_async import WeightWindow, backfill_ahead, version_index
from relaxtrio.rollout.step import group_metrics
from relaxtrio.rollout.step_book import StepBook
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine


def _versioned(group: Group, *labels_per_session: tuple[str, ...]) -> Group:
    """Gives each Session's samples spans sampled by the labelled weight versions."""
    for session, labels in zip(group.sessions, labels_per_session, strict=True):
        session.samples[:] = [attrs.evolve(s, weight_versions=tuple(
            WeightSpan(label, i, i + 1) for i, label in enumerate(labels))) for s in session.samples]
    return group


def test_version_index_reads_step_labels_and_maps_others_to_the_start() -> None:
    assert version_index("step-3") == 3
    assert version_index("default", start=5) == 5
    assert version_index("step-3x", start=1) == 1


async def test_sample_older_than_the_bound_is_dropped_and_counted() -> None:
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=2, max_staleness=1,
                           show_progress=False)
    weights = WeightWindow(max_staleness=1, loaded=3)  # step 3 trains policy version 3
    fresh = _versioned(group_of([[1.0], [0.0]]), ("step-3",), ("step-2", "step-3"))
    stale = _versioned(group_of([[1.0], [0.0]]), ("step-1", "step-2"), ("step-1",))
    book = StepBook.open(3, config, group_stages([], []), warnings_before=0, backfilled=0)
    assert await book.file(fresh, config, weights) is not None
    assert await book.file(stale, config, weights) is None
    assert stale.dropped_reason is not None and "stale" in stale.dropped_reason
    assert "weight version 1, 2 versions behind" in stale.dropped_reason
    result = book.result(aborted=0, stages=group_stages([], []), barrier_warnings=0)
    assert result.dropped == (stale,)
    metrics = group_metrics(result, config)
    assert metrics["stale_groups"] == 1.0 and metrics["stale_samples"] == 2.0
    assert metrics["dropped_groups"] == 1.0 and metrics["num_groups"] == 1.0


async def test_without_a_bound_no_sample_is_stale() -> None:
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, show_progress=False)
    old = _versioned(group_of([[1.0]]), ("step-0",))
    book = StepBook.open(9, config, group_stages([], []), warnings_before=0, backfilled=0)
    assert await book.file(old, config, WeightWindow(loaded=9)) is not None
    assert book.stale_groups == 0


def test_max_staleness_must_not_be_negative() -> None:
    with pytest.raises(ConfigError, match="max_staleness"):
        RolloutConfig(max_staleness=-1)


def _in_runtime(budget_s: float, rollout_id: int) -> tuple[Group, Session]:
    """A leased Group of one Session past its barrier: its budget is running."""
    group = Group(group_id="train:group_w")
    session = add_session(group, budget_s=budget_s)
    group.lease(rollout_id)
    group.note_request(session)
    assert session.budget.running
    return group, session


async def _request_through_update(group: Group, session: Session, weights: WeightWindow, *,
                                  update_s: float, push_s: float) -> float:
    """Step ``group.rollout_id`` closes with the Session's next request at the gate; the trainer
    trains for ``update_s``, then pushes for ``push_s``. Returns when the request may generate
    (trio time). Run it inside the Session's budget scope, as the agent wait is."""
    allowed_at: list[float] = []

    async def request() -> None:
        await group.wait_generation_allowed(session)
        allowed_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        weights.apply([group], next_step=group.rollout_id + 1)  # step close
        nursery.start_soon(request)
        await trio.sleep(update_s)
        with weights.pushing([group]):
            await trio.sleep(push_s)
        weights.loaded_version(weights.loaded + 1, [group], next_step=group.rollout_id + 1)
    return allowed_at[0] if allowed_at else float("nan")


async def test_session_waiting_for_weights_across_a_step_does_not_time_out(autojump_clock) -> None:
    # --max-staleness 0: a Group kept past step 0's close may not sample with version 0 again,
    # so its request waits for version 1 through the update and the push, its budget paused.
    group, session = _in_runtime(budget_s=10.0, rollout_id=0)
    weights = WeightWindow(max_staleness=0, gate=True)
    with session.budget.scope:
        allowed = await _request_through_update(group, session, weights, update_s=100.0, push_s=30.0)
    assert allowed == 130.0 > session.budget.total_s  # wall time past --agent-timeout
    assert not session.budget.scope.cancelled_caught and session.budget.running
    assert session.budget.remaining_s() == 10.0 and not group.paused


async def test_budget_pauses_through_the_weight_push(autojump_clock) -> None:
    # No bound: the kept Group samples during the update (its budget runs), and only the push,
    # where the engines hold every request, is paused.
    group, session = _in_runtime(budget_s=10.0, rollout_id=0)
    weights = WeightWindow(gate=True)
    with session.budget.scope:
        allowed = await _request_through_update(group, session, weights, update_s=4.0, push_s=60.0)
        assert allowed == 0.0 and trio.current_time() == 64.0
        assert session.budget.remaining_s() == 6.0


async def test_without_the_wait_the_budget_runs_out_during_the_update(autojump_clock) -> None:
    # The control: a Session that keeps its budget running through a long update times out.
    group, session = _in_runtime(budget_s=10.0, rollout_id=0)
    with session.budget.scope:
        await trio.sleep(100.0)
    assert session.budget.scope.cancelled_caught and trio.current_time() == 10.0


def _task_index(tokenizer, ids) -> int:
    text = tokenizer.decode(list(ids))
    return int(text.rsplit("task ", 1)[1].split("<", 1)[0].split()[0])


def _engine(tokenizer, gated: dict[int, trio.Event],
            arrived: dict[int, trio.Event] | None = None) -> ScriptedEngine:
    """Answers ``fine``; the turns of the tasks in ``gated`` wait for their event, and a request
    of a task in ``arrived`` sets that task's event."""
    def reply(ids) -> Reply:
        task = _task_index(tokenizer, ids)
        if arrived and task in arrived:
            arrived[task].set()
        return Reply(text="fine", gate=gated.get(task))

    return ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id, replies=reply)


@pytest.mark.slow  # starts agent processes
async def test_rollout_runs_ahead_more_than_one_step_keeping_unfinished_sessions(
        tokenizer, tmp_path) -> None:
    # --max-staleness 1: after step 0 closes the rollout leases steps 1 and 2 (two steps ahead);
    # step 2's Group waits for version 1 (it would sample tokens two versions stale), and task
    # 1's Session is still unfinished when steps 1 and 2 open and close.
    release = trio.Event()
    engine = _engine(tokenizer, {1: release})
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, agentic_concurrency=3,
                           fully_async=True, max_staleness=1, max_refills=0, show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}] * 6),
                                      config=config) as (pipeline, _):
            first = await pipeline.run_step(0)
            assert backfill_ahead(pipeline, 0, steps_left=3) == 2
            slow, ahead = pipeline.resident_groups
            assert (slow.rollout_id, ahead.rollout_id) == (1, 2)
            assert not slow.paused and ahead.paused  # version 0 loaded: step 2 waits for weights
            engine.weight_version = "step-1"  # "the update and the push" of step 0
            pipeline.weights.loaded_version(1, pipeline.resident_groups, next_step=1)
            assert not ahead.paused
            await ahead.wait_finished()
            second = await pipeline.run_step(1)  # takes the Group leased two steps ahead
            assert not slow.finished and slow in pipeline.resident_groups  # kept, not dropped
            assert backfill_ahead(pipeline, 1, steps_left=2) == 1  # step 3's Group
            release.set()
            third = await pipeline.run_step(2)
    assert [g.group.prompt_index for g in (*first.groups, *second.groups, *third.groups)] == [0, 2, 1]
    assert not first.dropped and not second.dropped and not third.dropped
    assert second.groups[0].samples[0].metadata["start_rollout_id"] == 2  # leased for step 2


@pytest.mark.slow  # starts agent processes
async def test_last_step_backfills_resident_groups_and_drops_none(tokenizer, tmp_path) -> None:
    # Over-sampling keeps task 1's Group resident past step 0. The last step is a final
    # backfill: its share is its target without the surplus, so the kept Group fills it. Before,
    # the backfill started a surplus Group that finished first, and the kept one was dropped.
    release = trio.Event()
    engine = _engine(tokenizer, {1: release})
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, over_sampling_batch_size=2,
                           fully_async=True, show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}] * 6),
                                      config=config) as (pipeline, _):
            first = await pipeline.run_step(0)
            [kept] = pipeline.resident_groups
            assert backfill_ahead(pipeline, 0, steps_left=1) == 0  # the kept Group is the debt
            release.set()
            last = await pipeline.run_step(1, last=True, steps_left=0)
            assert pipeline.resident_groups == () and pipeline.run_end_groups == ()
    assert [g.group.prompt_index for g in first.groups] == [0]
    assert [g.group for g in last.groups] == [kept]
    assert not first.dropped and not last.dropped
    assert len(engine.calls) == 2  # no surplus Group was started for the last step


@pytest.mark.slow  # starts agent processes
async def test_final_backfill_starts_no_surplus_to_drop(tokenizer, tmp_path) -> None:
    # A one-step run: its only step is the last, so it starts its target and no surplus.
    engine = _engine(tokenizer, {})
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, over_sampling_batch_size=3,
                           fully_async=True, show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}] * 6),
                                      config=config) as (pipeline, _):
            last = await pipeline.run_step(0, last=True, steps_left=0)
    assert len(last.groups) == 1 and not last.dropped
    assert len(engine.calls) == 1


@pytest.mark.slow  # starts agent processes
async def test_kept_session_waiting_for_weights_outlives_its_timeout_in_wall_time(
        tokenizer, tmp_path, mock_clock) -> None:
    # The trio clock moves only when this test jumps it (real agents rule out autojump). Task 1's
    # request is at the engine when step 0 closes; under --max-staleness 0 its Group then waits
    # for version 1, so 130 s of update and push spend none of its 10 s budget, and its answer,
    # sampled by the new weights, is trained at step 1. Before, the budget ran on and the
    # Session timed out during the update.
    release, arrived = trio.Event(), {1: trio.Event()}
    engine = _engine(tokenizer, {0: arrived[1], 1: release}, arrived)  # task 0 ends after 1 asked
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, over_sampling_batch_size=2,
                           fully_async=True, max_staleness=0, show_progress=False)
    async with RealTimeLimit(120):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}] * 6),
                                      config=config, timeout_s=10.0) as (pipeline, _):
            first = await pipeline.run_step(0)
            [kept] = pipeline.resident_groups
            [session] = kept.sessions
            assert kept.paused and not session.budget.running
            mock_clock.jump(100.0)  # the update
            with pipeline.weights.pushing(pipeline.resident_groups):
                mock_clock.jump(30.0)  # the push
            engine.weight_version = "step-1"  # the held request goes on with the new weights
            pipeline.weights.loaded_version(1, pipeline.resident_groups, next_step=1)
            assert not kept.paused and session.budget.remaining_s() == 10.0
            release.set()
            second = await pipeline.run_step(1, last=True, steps_left=0)
    assert trio.current_time() == 130.0
    assert session.status == "completed" and not first.dropped and not second.dropped
    assert [g.group for g in second.groups] == [kept] and second.stale_groups == 0


async def test_push_restarts_exactly_the_budgets_it_paused(autojump_clock) -> None:
    # Partial rollout: a paused Group's protected Session keeps its budget running; the push
    # pauses it and gives it back, and leaves the paused Session's budget paused.
    group = Group(group_id="train:group_p")
    protected, parked = add_session(group, budget_s=100.0), add_session(group, budget_s=100.0)
    group.lease(0)
    for session in group.sessions:
        group.note_request(session)
    protected.partial.note_aborted(protect=True)
    group.pause()
    group.resume()  # the pending protection takes effect
    group.pause()
    assert protected.budget.running and not parked.budget.running
    with WeightWindow().pushing([group]):
        await trio.sleep(30.0)
        assert not protected.budget.running
    assert protected.budget.running and not parked.budget.running
    assert protected.budget.remaining_s() == 100.0


def _train_config(*flags: str):
    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers(dest="command"))
    return train_config(parser.parse_args(["train", *flags]))


def test_max_staleness_flag_reaches_the_rollout_config() -> None:
    assert _train_config().rollout.max_staleness is None
    assert _train_config("--fully-async", "--max-staleness", "2").rollout.max_staleness == 2
    with pytest.raises(RelaxError, match="--max-staleness must be >= 0"):
        _train_config("--max-staleness", "-1")
