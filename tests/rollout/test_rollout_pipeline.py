"""The resident pipeline with a scripted engine: steps, drops and refills, over-sampling tails,
partial rollout park/resume, prelaunch, fully async, eval and the barrier watchdog."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
import trio.lowlevel
import trio.testing
from tests.support.pipeline import open_test_pipeline, prompts
from tests.support.procs import alive, group_alive

from relaxtrio.config import GenerationConfig, RolloutConfig
from relaxtrio.rollout.dumps import load_dump
from relaxtrio.rollout.eval import EvalDataset, run_eval
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine

pytestmark = pytest.mark.slow  # starts real processes


def _engine(tokenizer, replies=None) -> ScriptedEngine:
    return ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
                          replies=replies or (lambda ids: Reply(text="fine")))




def _task_index(tokenizer, ids) -> int:
    text = tokenizer.decode(list(ids))
    return int(text.rsplit("task ", 1)[1].split("<", 1)[0].split()[0])


async def test_steps_accept_target_groups(tokenizer, tmp_path: Path) -> None:
    engine = _engine(tokenizer)
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=2, show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}] * 5),
                                      config=config) as (pipeline, registry):
            first = await pipeline.run_step(0)
            second = await pipeline.run_step(1)
            assert len(registry) == 0 and pipeline.resident_groups == ()
    for result in (first, second):
        assert len(result.groups) == 2 and not result.dropped
        assert len(result.samples) == 4 and [s.advantage for s in result.scored] == [0.0] * 4
        for scored in result.groups:
            assert [s.index for s in scored.group.sessions] == [0, 1]
            assert {s.metadata["rollout_mode"] for s in scored.samples} == {"train"}
    assert {s.metadata["start_rollout_id"] for s in second.samples} == {1}


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("crash_after", "exited with code 7"),
        ("crash_before", "exited with code 1"),
        ("sigkill", "exited with code -9"),
        ("silent", "implicit export requires one committed leaf, found 0"),
        ("array_output", "JSONL"),
        ("garbage_output", "invalid output"),
        ("hang", "timed out after 12 s"),
        ("grandchildren", "timed out after 12 s"),
    ],
)
async def test_failed_group_is_dropped_logged_and_refilled(
    mode: str, reason: str, tokenizer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    pid_file = tmp_path / "pids"
    engine = _engine(tokenizer)
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=2, show_progress=False)
    stream = prompts([{}, {"mode": mode}, {}, {}])
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, stream, config=config,
                                      env={"AGENT_PID_FILE": str(pid_file)},
                                      timeout_s=12.0) as (pipeline, registry):
            result = await pipeline.run_step(0)
            # The server still serves other Sessions: the refill Group completed after the drop.
            assert len(result.groups) == 2 and len(result.dropped) == 1
            assert len(registry) == 0
    [dropped] = result.dropped
    assert reason in dropped.dropped_reason
    assert f"Dropped group {dropped.group_id}" in caplog.text and reason in caplog.text
    if pid_file.exists():
        pids = [int(p) for p in pid_file.read_text().split()]
        assert pids and not any(alive(pid) for pid in pids)


async def test_over_sampling_tail_is_dropped_at_close(tokenizer, tmp_path: Path) -> None:
    never, tail_started = trio.Event(), trio.Event()

    def replies(ids):
        if _task_index(tokenizer, ids) == 1:
            tail_started.set()
            return Reply(text="slow", gate=never)
        return Reply(text="fine", gate=tail_started)  # finish only once the tail is generating

    engine = _engine(tokenizer, replies)
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, over_sampling_batch_size=2,
                           show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}, {}, {}]),
                                      config=config) as (pipeline, registry):
            result = await pipeline.run_step(0)
            assert len(result.groups) == 1 and result.resident_groups == 0
            assert pipeline.resident_groups == () and len(registry) == 0
    gated = [rid for ids, _, rid in engine.calls if _task_index(tokenizer, ids) == 1]
    assert gated and set(gated) <= set(engine.aborted), "the tail's engine request was aborted"


async def test_partial_rollout_parks_and_resumes_the_same_request(tokenizer, tmp_path: Path) -> None:
    never, long_started = trio.Event(), trio.Event()
    partial_ids = tokenizer.encode("the first part", add_special_tokens=False)

    def replies(ids):
        task = _task_index(tokenizer, ids)
        if task != 1:
            return Reply(text="fine", gate=long_started)  # step 0 closes while task 1 generates
        if tuple(ids[-len(partial_ids):]) == tuple(partial_ids):
            return Reply(text=" and the rest")  # the resumed attempt
        long_started.set()
        return Reply(ids=partial_ids + [5, 6, 7], finish="length", gate=never, partial=len(partial_ids))

    engine = _engine(tokenizer, replies)
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, over_sampling_batch_size=2,
                           partial_rollout=True, show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(
            tmp_path, tokenizer, engine, prompts([{}, {}, {}]), config=config,
            generation=GenerationConfig(max_response_tokens=40),
        ) as (pipeline, registry):
            first = await pipeline.run_step(0)
            assert first.aborted_requests == 1 and first.resident_groups == 1
            [parked] = pipeline.resident_groups
            assert parked.paused and parked.sessions[0].num_requests == 1
            second = await pipeline.run_step(1)
    [resumed] = [g for g in second.groups if g.group is parked]
    [sample] = resumed.samples
    [leaf] = parked.sessions[0].forest.leaves()
    # One committed response: the agent saw one normal answer.
    assert leaf.message["content"] == tokenizer.decode(
        partial_ids + tokenizer.encode(" and the rest", add_special_tokens=False))
    assert leaf.abort_count == 1
    assert sample.metadata["rollout_turns"] == 1
    resume_calls = [(ids, sampling, rid) for ids, sampling, rid in engine.calls if rid.endswith(":a1#")]
    [(ids, sampling, rid)] = resume_calls
    assert tuple(ids[-len(partial_ids):]) == tuple(partial_ids)
    assert sampling.max_new_tokens == 40 - len(partial_ids)


async def test_protected_session_finishes_before_the_next_close(tokenizer, tmp_path: Path) -> None:
    never, long_started, resumed_gate, task2_answered = (trio.Event() for _ in range(4))
    partial_ids = tokenizer.encode("the first part", add_special_tokens=False)

    def replies(ids):
        task = _task_index(tokenizer, ids)
        if task == 1 and tuple(ids[-len(partial_ids):]) == tuple(partial_ids):
            return Reply(text=" and the rest", gate=resumed_gate)  # protected: never aborted again
        if task == 1:
            long_started.set()
            return Reply(ids=partial_ids + [5, 6, 7], finish="length", gate=never, partial=len(partial_ids))
        if task == 2:
            task2_answered.set()
        return Reply(text="fine", gate=long_started)

    engine = _engine(tokenizer, replies)
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, over_sampling_batch_size=2,
                           partial_rollout=True, show_progress=False)
    generation = GenerationConfig(max_response_tokens=40, partial_rollout_max_aborted_count=1)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}] * 4), config=config,
                                      generation=generation) as (pipeline, _):
            first = await pipeline.run_step(0)
            [parked] = pipeline.resident_groups
            assert first.aborted_requests == 1
            assert parked.sessions[0].partial.statistics().protection_pending

            async def release_once_step_1_has_its_group() -> None:
                await task2_answered.wait()
                [other] = [g for g in pipeline.resident_groups if g.prompt_index == 2]
                await other.wait_finished()  # step 1 accepts it and closes on the protected Group
                resumed_gate.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(release_once_step_1_has_its_group)
                second = await pipeline.run_step(1)
    assert [g.group.prompt_index for g in second.groups] == [2]
    assert second.aborted_requests == 0
    assert parked.finished and not parked.dropped, "step 1 closed only after the protected Session ended"
    assert parked.sessions[0].partial.protected
    resumed = [rid for _, _, rid in engine.calls if rid.endswith(":a1#")]
    assert resumed and not set(resumed) & set(engine.aborted)
    [leaf] = parked.sessions[0].forest.leaves()
    assert leaf.abort_count == 1 and leaf.rollout_id == 1  # committed in the step that resumed it


async def test_prelaunch_holds_requests_and_budget_until_the_lease(tokenizer, tmp_path: Path) -> None:
    engine = _engine(tokenizer)
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=1, agentic_concurrency=2,
                           prelaunch=True, show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}] * 4),
                                      config=config, timeout_s=30) as (pipeline, registry):
            await pipeline.run_step(0)
            warm = [g for g in pipeline.resident_groups if not g.leased]
            assert warm, "the next step's Group was prelaunched"
            calls_before = len(engine.calls)
            for group in warm:
                await group.wait_barrier_passed()  # every first request arrived...
            await trio.testing.wait_all_tasks_blocked()  # ...and its turn waits at the gate
            assert len(engine.calls) == calls_before, "first requests are held until the lease"
            assert not pipeline.groups_use_cpu, "held agents leave the cores to the update"
            for group in warm:
                for session in group.sessions:
                    assert not session.budget.running and session.budget.remaining_s() == 30
            leased = trio.Event()

            async def lease_seen() -> None:  # the lease makes the warm Group busy again
                while not warm[0].leased:
                    await trio.lowlevel.checkpoint()
                assert pipeline.groups_use_cpu
                leased.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(lease_seen)
                result = await pipeline.run_step(1)
            assert leased.is_set()
            assert warm[0] in [g.group for g in result.groups]


async def test_prelaunch_starts_no_group_beyond_the_last_step(tokenizer, tmp_path: Path) -> None:
    # Permits for three steps' demand, two steps to run: after step 0 only step 1's demand is
    # prelaunched (more would start agents during the last step only to drop them at the end).
    engine = _engine(tokenizer)
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, agentic_concurrency=3,
                           prelaunch=True, show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}] * 6),
                                      config=config) as (pipeline, registry):
            await pipeline.run_step(0, steps_left=1)
            warm = [g for g in pipeline.resident_groups if not g.leased]
            assert len(warm) == 1, "one step left: one step's demand prelaunched"
            result = await pipeline.run_step(1, last=True, steps_left=0)
            assert [g.group for g in result.groups] == warm
            assert pipeline.resident_groups == () and len(registry) == 0
    assert not result.dropped


async def test_fully_async_keeps_generating_across_steps(tokenizer, tmp_path: Path) -> None:
    release = trio.Event()
    engine = _engine(tokenizer, lambda ids: Reply(text="late", gate=release)
                     if _task_index(tokenizer, ids) == 1 else Reply(text="fine"))
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, over_sampling_batch_size=2,
                           fully_async=True, show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}, {}, {}]),
                                      config=config) as (pipeline, registry):
            first = await pipeline.run_step(0)
            [carried] = pipeline.resident_groups
            assert not carried.paused and carried.leased
            release.set()  # "training" happens; the carried Group keeps generating meanwhile
            await carried.wait_finished()
            second = await pipeline.run_step(1)
    assert engine.aborted == []
    assert second.groups[0].group is carried
    assert second.groups[0].samples[0].metadata["start_rollout_id"] == 0
    assert first.groups[0].group is not carried


async def test_fully_async_backfill_generates_the_next_step_during_the_update(
        tokenizer, tmp_path: Path) -> None:
    # The default shape (demand == target == concurrency): a step closes with nothing resident,
    # so without the backfill nothing would generate while the trainer trains.
    engine = _engine(tokenizer)
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=2, fully_async=True,
                           max_refills=0, show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}] * 6),
                                      config=config) as (pipeline, _):
            first = await pipeline.run_step(0)
            assert pipeline.resident_groups == ()
            assert pipeline.backfill(1) == 2
            backfilled = list(pipeline.resident_groups)
            assert [g.leased for g in backfilled] == [True, True]
            calls_before = len(engine.calls)
            for group in backfilled:  # "the update": the next step's Groups generate meanwhile
                await group.wait_finished()
            assert len(engine.calls) > calls_before
            assert pipeline.backfill(1) == 0  # the finished Groups already cover step 1's demand
            second = await pipeline.run_step(1)  # accepts them and starts none
            assert pipeline.resident_groups == ()
    assert {g.group for g in second.groups} == set(backfilled)
    assert {s.metadata["start_rollout_id"] for s in second.samples} == {1}
    assert not {g.group for g in first.groups} & set(backfilled)
    assert engine.aborted == []


async def test_eval_runs_datasets_serially_in_eval_mode(tokenizer, tmp_path: Path) -> None:
    engine = _engine(tokenizer)
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=1, show_progress=False)
    eval_rows = prompts([{}] * 3).prompts
    datasets = [EvalDataset(name="a", prompts=tuple(eval_rows), n_samples_per_prompt=3),
                EvalDataset(name="b", prompts=tuple(eval_rows[:1]), n_samples_per_prompt=1)]
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}] * 3), config=config,
                                      env={"AGENT_REWARD": "0.5"},
                                      eval_concurrency=2) as (pipeline, registry):
            metrics = await run_eval(pipeline, datasets, dump_path=tmp_path / "eval_0.json")
    assert metrics["eval/a/num_samples"] == 9 and metrics["eval/a/reward_mean"] == 0.5
    assert metrics["eval/b/num_samples"] == 1 and metrics["eval/b/dropped_groups"] == 0
    # Each agent process wrote the RELAX_ROLLOUT_MODE it saw into its export metadata.
    dumped = load_dump(tmp_path / "eval_0.json").samples
    assert len(dumped) == 10
    assert {d.sample.export_metadata["rollout_mode"] for d in dumped} == {"eval"}


async def test_barrier_watchdog_names_sessions_without_first_request(
    tokenizer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    flag = tmp_path / "go"
    engine = _engine(tokenizer)
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=1, barrier_warn_s=0.3,
                           show_progress=False)
    stream = prompts([{"mode": "wait_file"}])

    async def release_later(pipeline) -> None:
        await pipeline.watchdog.wait_warnings(1)
        flag.write_text("go")

    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, stream, config=config,
                                      env={"AGENT_WAIT_FILE": str(flag)}) as (pipeline, _):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(release_later, pipeline)
                result = await pipeline.run_step(0)
    assert result.barrier_warnings >= 1 and len(result.groups) == 1
    assert "event=barrier_wait" in caplog.text
    assert "session 0" in caplog.text and "session 1" in caplog.text and "no request yet" in caplog.text


async def test_cancelling_the_run_terminates_every_agent(tokenizer, tmp_path: Path) -> None:
    never, generating = trio.Event(), trio.Event()

    def replies(ids) -> Reply:
        if len(engine.calls) >= 4:
            generating.set()
        return Reply(text="x", gate=never)

    engine = _engine(tokenizer, replies)
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=2, show_progress=False)
    pgids: list[int] = []
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}] * 2),
                                      config=config) as (pipeline, registry):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pipeline.run_step, 0)
                await generating.wait()
                for group in pipeline.resident_groups:
                    for session in group.sessions:
                        pgids.append(session.agent_pgid)
                nursery.cancel_scope.cancel()
        # leaving the pipeline cancels the resident Groups
    assert len(registry) == 0
    assert sorted(engine.aborted) == sorted(rid for _, _, rid in engine.calls)
    assert pgids and not any(group_alive(pgid) for pgid in pgids)


async def test_unusable_prompt_is_dropped_without_starting_agents(tokenizer, tmp_path: Path) -> None:
    from relaxtrio.rollout.dataset import Prompt, PromptStream

    engine = _engine(tokenizer)
    gone = tmp_path / "gone.png"
    bad = Prompt(index=0, messages=({"role": "user", "content": [
        {"type": "image", "image": str(gone)}, {"type": "text", "text": "look"}]},), metadata={})
    good = Prompt(index=1, messages=({"role": "user", "content": "task 1"},), metadata={})
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, max_refills=1,
                           show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine,
                                      PromptStream(prompts=[bad, good], shuffle=False),
                                      config=config) as (pipeline, _):
            result = await pipeline.run_step(0)
    assert len(result.groups) == 1 and len(result.dropped) == 1
    assert "prompt 0 cannot be used" in result.dropped[0].dropped_reason


async def test_engine_failure_stops_the_step_loudly(tokenizer, tmp_path: Path) -> None:
    from relaxtrio import BackendError, EngineUnavailableError

    def replies(ids):
        raise EngineUnavailableError("engine http://127.0.0.1:1/generate unreachable after 6 attempts")

    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=2, show_progress=False)
    with trio.fail_after(60), pytest.RaisesGroup(pytest.RaisesExc(
            BackendError, match="the generation engine failed; stopping the run: engine .* unreachable"),
            flatten_subgroups=True):
        async with open_test_pipeline(tmp_path, tokenizer, _engine(tokenizer, replies), prompts([{}] * 4),
                                      config=config) as (pipeline, registry):
            await pipeline.run_step(0)
    assert len(registry) == 0


async def test_parked_train_groups_stay_resident_during_eval(tokenizer, tmp_path: Path) -> None:
    never, long_started = trio.Event(), trio.Event()

    def replies(ids):
        text = tokenizer.decode(list(ids))
        if "task 1" in text and "task 10" not in text:
            long_started.set()
            return Reply(text="long", gate=never, partial=1)
        return Reply(text="fine", gate=long_started)

    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, over_sampling_batch_size=2,
                           partial_rollout=True, show_progress=False)
    from relaxtrio.rollout.dataset import Prompt

    eval_rows = [Prompt(index=i, messages=({"role": "user", "content": f"eval question {i}"},),
                        metadata={}) for i in range(2)]
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, _engine(tokenizer, replies),
                                      prompts([{}] * 3), config=config) as (pipeline, _):
            await pipeline.run_step(0)
            [parked] = pipeline.resident_groups
            metrics = await run_eval(
                pipeline, [EvalDataset(name="e", prompts=tuple(eval_rows), n_samples_per_prompt=2)])
            assert pipeline.resident_groups == (parked,) and parked.paused
            assert not parked.sessions[0].budget.running
    assert metrics["eval/e/num_samples"] == 4
