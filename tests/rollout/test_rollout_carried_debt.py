"""Fully async closing short and carried debt (docs/scheduling.md#fully-async): a step whose
stragglers are off the engine closes before its target, the next Groups to finish pay its
partition first, at most two partitions are open, the last step drains the debt, and every Group
is trained exactly once.

The agents run in-process with scripted timing (tests/support/scripted_agents.py), so the mock
clock gives exact times: a straggler is an agent that runs a 100 s tool after its first answer,
and it counts as one once it has been off the engine for ``straggler_s`` (5 s here).
"""

from __future__ import annotations

import pytest
import trio
from tests.support.pipeline import open_test_pipeline, prompts
from tests.support.scripted_agents import Turn, open_scripted_pipeline
from tests.support.sessions import add_session

from relaxtrio.config import RolloutConfig
from relaxtrio.nursery.group import Group
from relaxtrio.rollout.accounting import group_stages
from relaxtrio.rollout.fully_async import WeightWindow, backfill_ahead, may_close_short, straggling
from relaxtrio.rollout.step import StepResult, group_metrics
from relaxtrio.rollout.step_book import Partitions, StepBook
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine

STRAGGLER = (Turn(1.0, then_s=100.0), Turn(1.0))  # answers at t+1, tool until t+101, done at t+102


def _config(batch: int, **fields) -> RolloutConfig:
    fields.setdefault("straggler_s", 5.0)
    return RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=batch, agentic_concurrency=4,
                         fully_async=True, show_progress=False, **fields)


def _tasks(result: StepResult) -> list[int]:
    return [g.group.prompt_index for g in result.groups]


async def test_straggler_lets_the_step_close_short_and_the_next_group_pays_it(
        tokenizer, tmp_path, autojump_clock) -> None:
    # Step 0 needs 2 Groups; task 1 answers at t=1 and then runs a 100 s tool. When task 0
    # finishes (t=10) the step owes 1 Group and has 1 straggler: it closes short at once, the
    # rollout starts step 1's Groups plus one for the debt, and the first of them to finish
    # (t=11) pays step 0. Before, step 0 waited for the straggler until t=102.
    async with open_scripted_pipeline(tokenizer, prompts([{}] * 8), _config(2),
                                      {0: (Turn(10.0),), 1: STRAGGLER}, tmp_path) as (pipeline, agents):
        short = await pipeline.run_step(0, steps_left=2)
        assert trio.current_time() == 10.0
        assert _tasks(short) == [0] and short.carried_debt_groups == 1
        [straggler] = pipeline.resident_groups
        assert pipeline.backfill(1) == 2  # step 1's demand (2) + the debt (1) - the straggler
        paid = await pipeline.settle(short)
        assert trio.current_time() == 11.0 and paid.debt_wait_s == 1.0
        assert _tasks(paid)[0] == 0 and _tasks(paid)[1] in (2, 3) and len(paid.groups) == 2
        assert not straggler.finished and straggler in pipeline.resident_groups  # kept, not dropped
        metrics = group_metrics(paid)
        assert metrics["carried_debt_groups"] == 1.0 and metrics["debt_wait_s"] == 1.0
        assert metrics["num_groups"] == 2.0 and metrics["dropped_groups"] == 0.0
        assert await pipeline.settle(paid) == paid  # settled: nothing more to wait for
        assert sorted(task for _, task in agents.started) == [0, 1, 2, 3]


async def test_next_finished_groups_pay_the_previous_partition_before_the_current_one(
        tokenizer, tmp_path, autojump_clock) -> None:
    # Step 1 opens (t=10) while step 0 still owes 1 Group (no settle between them). Of the two
    # Groups step 1 starts, the first to finish (task 2, t=11) is filed into step 0, the second
    # (task 3, t=11.5) into step 1, which then closes short on the straggler; the straggler
    # pays step 1 at t=102.
    scripts = {0: (Turn(10.0),), 1: STRAGGLER, 2: (Turn(1.0),), 3: (Turn(1.5),)}
    async with open_scripted_pipeline(tokenizer, prompts([{}] * 8), _config(2), scripts,
                                      tmp_path) as (pipeline, _):
        first = await pipeline.run_step(0, steps_left=2)
        second = await pipeline.run_step(1, steps_left=1)
        assert trio.current_time() == 11.5 and second.carried_debt_groups == 1
        first = await pipeline.settle(first)
        assert first.debt_wait_s == 1.0  # paid at t=11, while step 1 ran
        second = await pipeline.settle(second)
        assert trio.current_time() == 102.0 and second.debt_wait_s == 90.5
    assert (_tasks(first), _tasks(second)) == ([0, 2], [3, 1])


async def test_a_third_partition_is_refused_while_the_first_still_owes(tokenizer, tmp_path,
                                                                      autojump_clock) -> None:
    # One Group per step, every agent a straggler, so nothing finishes and each step closes
    # short at an idle heartbeat: step 0 at t=10 owing its Group, step 1 at t=20 owing 2
    # together with step 0's (both stragglers count). Step 2 would be a third open partition.
    scripts = {i: STRAGGLER for i in range(4)}
    async with open_scripted_pipeline(tokenizer, prompts([{}] * 8), _config(1, idle_heartbeat_s=10.0),
                                      scripts, tmp_path) as (pipeline, _):
        first = await pipeline.run_step(0)
        assert trio.current_time() == 10.0
        second = await pipeline.run_step(1)
        assert trio.current_time() == 20.0
        assert (first.groups, second.groups) == ((), ())
        assert first.carried_debt_groups == second.carried_debt_groups == 1
        with pytest.raises(RuntimeError, match="rollout 0's partition still owes 1 group"):
            await pipeline.run_step(2)


async def test_final_backfill_drains_the_debt_and_drops_nothing(tokenizer, tmp_path,
                                                               autojump_clock) -> None:
    # Step 0's only Group is a straggler: the step closes short at its first idle heartbeat
    # (t=10). The last step pays step 0 first with the Group it starts (done at t=11), never
    # closes short, and takes the straggler itself at t=102: nothing is left to drop.
    async with open_scripted_pipeline(tokenizer, prompts([{}] * 8), _config(1, idle_heartbeat_s=10.0),
                                      {0: STRAGGLER}, tmp_path) as (pipeline, agents):
        first = await pipeline.run_step(0, steps_left=1)
        last = await pipeline.run_step(1, last=True, steps_left=0)
        assert trio.current_time() == 102.0
        first = await pipeline.settle(first)
        assert pipeline.resident_groups == () and pipeline.run_end_groups == ()
    assert (_tasks(first), _tasks(last)) == ([1], [0])
    assert first.debt_wait_s == 1.0 and last.carried_debt_groups == 0
    assert not first.dropped and not last.dropped and len(agents.started) == 2


async def test_every_group_is_trained_exactly_once_across_short_steps(tokenizer, tmp_path,
                                                                     autojump_clock) -> None:
    # Five steps of 2 Groups as the driver runs them (run, backfill, settle), every third task
    # a straggler: some steps close short, and every Group started is trained once or, at the
    # run's end, kept for an extension; none is lost, none trained twice.
    scripts = {i: (STRAGGLER if i % 3 == 1 else (Turn(1.0 + i % 2),)) for i in range(40)}
    results = []
    async with open_scripted_pipeline(tokenizer, prompts([{}] * 40), _config(2), scripts,
                                      tmp_path) as (pipeline, agents):
        for step in range(5):
            last = step == 4
            result = await pipeline.run_step(step, last=last, steps_left=4 - step)
            if not last:  # as the driver does (relaxtrio/run/step.py)
                backfill_ahead(pipeline, step, steps_left=4 - step)
                result = await pipeline.settle(result)
            results.append(result)
        run_end = {g.group_id for g in pipeline.run_end_groups}
    trained = [g.group.group_id for r in results for g in r.groups]
    assert all(len(r.groups) == 2 for r in results) and not any(r.dropped for r in results[:-1])
    assert {g.group_id for g in results[-1].dropped} == run_end  # dropped at the run's end, requeued
    assert len(set(trained)) == len(trained) == 10
    assert set(trained) | run_end == {group_id for group_id, _ in agents.started}
    assert not set(trained) & run_end
    assert sum(r.carried_debt_groups for r in results) >= 2


def _in_runtime() -> Group:
    """A leased Group of one Session past its barrier, whose generation returned at t=now."""
    group = Group(group_id="train:group_s")
    session = add_session(group)
    group.lease(0)
    group.note_request(session)
    with session.partial.track("rid-0"):
        pass
    return group


async def test_a_straggler_has_been_off_the_engine_for_straggler_s(autojump_clock) -> None:
    tool, busy, paused = _in_runtime(), _in_runtime(), _in_runtime()
    paused.pause()  # waiting for weights: it cannot pay before the update
    assert not straggling(tool, after_s=5.0)  # it just answered: between requests, or exiting
    await trio.sleep(5.0)
    with busy.sessions[0].partial.track("rid-1"):  # a generation in flight at the engine
        assert straggling(tool, after_s=5.0)
        assert not straggling(busy, after_s=5.0) and not straggling(paused, after_s=5.0)
        assert may_close_short(1, [tool, busy], WeightWindow(), next_step=1, straggler_s=5.0) == 1
        assert may_close_short(2, [tool, busy], WeightWindow(), next_step=1, straggler_s=5.0) == 0
    assert not straggling(busy, after_s=5.0) and straggling(busy, after_s=0.0)
    unleased = Group(group_id="train:group_u")
    add_session(unleased)
    assert not straggling(unleased, after_s=0.0)
    assert may_close_short(0, [tool], WeightWindow(), next_step=1, straggler_s=5.0) == 0
    # --max-staleness 0: step 1's Groups wait for the update, which would wait for them.
    assert may_close_short(1, [tool], WeightWindow(max_staleness=0, gate=True), next_step=1,
                           straggler_s=5.0) == 0


def _book(rollout_id: int, config: RolloutConfig) -> StepBook:
    return StepBook.open(rollout_id, config, group_stages([], []), warnings_before=0, backfilled=0)


async def test_partitions_pay_the_previous_first_and_refuse_a_third() -> None:
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=2, show_progress=False)
    ledger = Partitions()
    first, second, third = _book(0, config), _book(1, config), _book(2, config)
    ledger.open(first)
    ledger.close_short(first, stragglers=2)
    ledger.open(second)
    assert ledger.previous is first and ledger.payee() is first
    assert ledger.debt == 4 and ledger.carried == 2  # the running step's debt is not carried
    with pytest.raises(RuntimeError, match="rollout 0's partition still owes 2 group"):
        ledger.open(third)
    with pytest.raises(RuntimeError, match="already open"):
        Partitions(current=second).open(_book(1, config))
    ledger.write_off(second)  # nothing is left that could pay either of them
    assert ledger.payee() is None and ledger.debt == 0
    ledger.open(third)
    assert ledger.previous is None and ledger.current is third
    ledger.open(_book(3, config))  # step 2 ended without closing short: it carries nothing
    assert ledger.previous is None and ledger.carried == 0
    assert ledger.unsettled(0) is first and ledger.unsettled(0) is None


@pytest.mark.slow  # starts agent processes
async def test_a_real_straggler_agent_no_longer_stalls_its_step(tokenizer, tmp_path) -> None:
    # Real agents over the real agent API: task 1 answers, then runs a 120 s "tool" before its
    # second turn. Step 0 closes short (at a Group finish or an idle heartbeat, once the
    # straggler has been off the engine for 0.5 s), the backfilled Groups pay it, and the step's
    # batch is complete long before the straggler ends; before, the step waited for it.
    engine = ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
                            replies=lambda ids: Reply(text="fine"))
    config = _config(2, straggler_s=0.5, idle_heartbeat_s=1.0)
    rows = [{}, {"turns": 2, "tool_s": 120}] + [{}] * 6
    with trio.fail_after(90):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts(rows), config=config,
                                      timeout_s=300.0) as (pipeline, _):
            short = await pipeline.run_step(0, steps_left=2)
            [straggler] = pipeline.resident_groups
            backfill_ahead(pipeline, 0, steps_left=2)  # as the driver does
            paid = await pipeline.settle(short)
            assert not straggler.finished and straggler.prompt_index == 1
    assert _tasks(short) == [0] and short.carried_debt_groups == 1
    assert _tasks(paid)[0] == 0 and _tasks(paid)[1] in (2, 3) and not paid.dropped
