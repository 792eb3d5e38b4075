"""What a step tells the operator: accounting lines, idle heartbeats, Dropped/Filtered lines, the
progress postfix, the per-step metric families and the kept log of a failed agent."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import pytest
import trio
from tests.support.pipeline import open_test_pipeline, prompts
from tests.support.sessions import make_group
from tests.support.waits import wait_until

from relaxtrio.config import RolloutConfig
from relaxtrio.forest import TrainingSample
from relaxtrio.rollout.accounting import (
    ChangeSignal,
    PipelineSnapshot,
    group_stages,
    progress_postfix,
    wait_with_heartbeat,
)
from relaxtrio.rollout.operator_view import SNAPSHOT_KEYS, snapshot_fields
from relaxtrio.rollout.step import family_metrics, stop_reason
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine


async def test_heartbeat_every_interval_without_progress(autojump_clock) -> None:
    progress = trio.Event()
    beats: list[tuple[float, float]] = []

    async def progress_at_75_s() -> None:
        await trio.sleep(75)
        progress.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(progress_at_75_s)
        await wait_with_heartbeat(progress.wait, interval_s=30.0,
                                  on_idle=lambda idle_s: beats.append((trio.current_time(), idle_s)))
        assert trio.current_time() == 75.0
    assert beats == [(30.0, 30.0), (60.0, 60.0)]


async def test_no_heartbeat_when_progress_comes_in_time(autojump_clock) -> None:
    beats: list[float] = []

    async def progress_in_time() -> None:
        await trio.sleep(29.5)

    await wait_with_heartbeat(progress_in_time, interval_s=30.0, on_idle=beats.append)
    assert beats == [] and trio.current_time() == 29.5


async def test_a_change_during_a_heartbeat_is_not_lost(autojump_clock) -> None:
    """A Group that finishes while the step's wait is between two waits (here: inside the
    heartbeat) ends the wait. Waiting on whichever event is current at the restart blocked for
    good: the step logged heartbeats while its Groups were finished."""
    changes = ChangeSignal()
    seen = changes.version
    beats: list[float] = []

    def heartbeat(idle_s: float) -> None:
        beats.append(idle_s)
        changes.notify()

    with trio.fail_after(300):
        await wait_with_heartbeat(functools.partial(changes.wait_past, seen), interval_s=30.0,
                                  on_idle=heartbeat)
    assert beats == [30.0] and changes.version == seen + 1


async def test_change_signal_waits_only_for_changes_after_the_seen_version(autojump_clock) -> None:
    changes = ChangeSignal()
    changes.notify()
    await changes.wait_past(0)  # already past: returns at once
    assert trio.current_time() == 0

    async def later() -> None:
        await trio.sleep(5)
        changes.notify()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        await changes.wait_past(changes.version)
    assert trio.current_time() == 5 and changes.version == 2


def test_progress_postfix_shows_prepared_only_with_prelaunch() -> None:
    assert progress_postfix(scored_sessions=4, prepared_sessions=2, prelaunch=False) == {"scored": 4}
    assert progress_postfix(scored_sessions=4, prepared_sessions=2, prelaunch=True) == {
        "scored": 4, "prepared": 2}


def _sample(turns: int, metadata: dict, finish_reason: str = "stop") -> TrainingSample:
    trace = {"turns": [{"finish_reason": finish_reason}] * turns}
    return TrainingSample(name=None, session_id="s", token_ids=[1, 2], prompt_length=1, loss_mask=[0, 1],
                          rollout_logprobs=[0.0, -0.5], reward=1.0, status="completed",
                          weight_versions=(), metadata={"rollout_turns": turns, "agentic_trace": trace,
                                                        **metadata})


def test_stop_reason_precedence() -> None:
    assert stop_reason(_sample(1, {"rollout_stop_reason": "done", "stop_reason": "x"})) == "done"
    assert stop_reason(_sample(1, {"stop_reason": "env_error:disk full"})) == "env_error"
    assert stop_reason(_sample(2, {}, finish_reason="length")) == "length"
    assert stop_reason(_sample(0, {"stop_reason": "  "})) == "unknown"


def test_stop_reason_and_num_turn_families() -> None:
    samples = [_sample(t, {}) for t in (1, 2, 3, 10)] + [_sample(1, {}, finish_reason="length")]
    metrics = family_metrics(samples)
    assert metrics["stop_reason/stop/count"] == 4.0 and metrics["stop_reason/stop/ratio"] == 0.8
    assert metrics["stop_reason/length/count"] == 1.0 and metrics["stop_reason/length/ratio"] == 0.2
    assert metrics["num_turn/min"] == 1.0 and metrics["num_turn/max"] == 10.0
    assert metrics["num_turn/mean"] == 17 / 5
    assert metrics["num_turn/p50"] == 2.0 and metrics["num_turn/p90"] == 10.0
    assert metrics["num_turn/p99"] == 10.0
    assert family_metrics([]) == {}


def _engine(tokenizer) -> ScriptedEngine:
    return ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
                          replies=lambda ids: Reply(text="fine"))


async def test_both_pipeline_snapshots_count_from_one_group_stages() -> None:
    """The heartbeat's snapshot and /debug_state's pipeline keys come from the same counts."""
    warming, ready, running, paused, done = (make_group(2, group_id=f"train:group_{i}") for i in range(5))
    ready.note_request(ready.sessions[0])
    ready.note_request(ready.sessions[1])  # prelaunched, every first request in: ready
    for group in (running, paused):
        group.lease(3)
    paused.pause()  # partial rollout between steps
    stages = group_stages([warming, ready, running, paused], [done])
    assert (stages.resident, stages.prepare, stages.prepare_ready, stages.leased, stages.runtime,
            stages.interrupted, stages.finished) == (4, 2, 1, 2, 1, 1, 1)
    beat = PipelineSnapshot.from_stages(stages, active_rollout_id=3, target=4, scored=1, idle_s=2.0)
    assert beat == PipelineSnapshot(active_rollout_id=3, debt=3, scored_group_count=1, prepare_group_count=2,
                                    runtime_group_count=1, interrupted_group_count=1, finalized_group_count=1,
                                    resident_group_count=4, idle_s=2.0)
    state = snapshot_fields(stages, active_rollout_id=3, finalized=7)
    assert list(state) == list(SNAPSHOT_KEYS)
    assert state == {"active_rollout_id": 3, "warming_prepare_group_count": 1, "ready_prepare_group_count": 1,
                     "prepare_group_count": 2, "runtime_reward_group_count": 3, "finalized_group_count": 7,
                     "resident_group_count": 4, "interrupted_runtime_group_count": 1}
    # What both report, they report alike.
    assert state["prepare_group_count"] == beat.prepare_group_count
    assert state["resident_group_count"] == beat.resident_group_count
    assert state["interrupted_runtime_group_count"] == beat.interrupted_group_count
    assert state["runtime_reward_group_count"] == (beat.runtime_group_count + beat.interrupted_group_count
                                                   + beat.finalized_group_count)


@pytest.mark.slow
async def test_accounting_lines_and_idle_heartbeat_of_a_waiting_step(
    tokenizer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="relaxtrio")
    flag = tmp_path / "go"
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=1, idle_heartbeat_s=0.2,
                           show_progress=False)

    async def release_after_a_heartbeat() -> None:  # the agents (real processes) wait on the file
        await wait_until(lambda: "event=idle_heartbeat" in caplog.text, timeout_s=60, what="a heartbeat line")
        flag.write_text("go")

    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, _engine(tokenizer),
                                      prompts([{"mode": "wait_file"}]), config=config,
                                      env={"AGENT_WAIT_FILE": str(flag)}) as (pipeline, _), \
                trio.open_nursery() as nursery:
            nursery.start_soon(release_after_a_heartbeat)
            result = await pipeline.run_step(0)
    assert len(result.groups) == 1
    [start] = [r.message for r in caplog.records if "event=accounting_start" in r.message]
    assert start == ("AGENTIC ROLLOUT event=accounting_start rollout=0 sessions=2 groups=1 debt=1 "
                     "resident_groups=0 interrupted_groups=0")
    [end] = [r.message for r in caplog.records if "event=accounting_end" in r.message]
    assert end == ("AGENTIC ROLLOUT event=accounting_end rollout=0 groups=1 rows=2 debt=0 "
                   "resident_groups=0 interrupted_groups=0 dropped_groups=0 filtered_groups=0 "
                   "aborted_requests=0")
    beat = next(r.message for r in caplog.records if "event=idle_heartbeat" in r.message)
    assert "active_rollout_id=0 debt=1 scored_group_count=0 prepare_group_count=0" in beat
    assert "runtime_group_count=1 interrupted_group_count=0" in beat and "idle_s=" in beat


@pytest.mark.slow
async def test_failed_agent_keeps_its_log_and_completed_ones_do_not(
    tokenizer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    logs = tmp_path / "agent_logs"
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=1, show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, _engine(tokenizer),
                                      prompts([{"mode": "crash_after"}, {}]), config=config,
                                      failed_log_dir=logs) as (pipeline, _):
            result = await pipeline.run_step(0)
    [dropped] = result.dropped
    assert len(result.groups) == 1
    kept = sorted(p.name for p in logs.iterdir())
    failed = [s for s in dropped.sessions if s.status == "failed"]
    assert kept == [Path(s.agent_log).name for s in failed] and kept
    text = (logs / kept[0]).read_text()
    assert "boom after the request" in text
    assert f"its agent log is kept: {logs / kept[0]}" in caplog.text
