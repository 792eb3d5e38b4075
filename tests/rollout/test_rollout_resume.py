"""The rollout side of resume: prompt stream cursors, Groups a checkpoint cannot hold, metrics."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import trio
from tests.support.pipeline import open_test_pipeline, prompts

from relaxtrio._errors import ConfigError
from relaxtrio.config import RolloutConfig
from relaxtrio.models import load_tokenizer
from relaxtrio.rollout.dataset import Prompt, PromptStream
from relaxtrio.rollout.metrics import MetricsLog
from relaxtrio.rollout.resume import (
    RolloutCheckpoint,
    capture_pipeline,
    capture_rollout,
    restore_rollout,
)
from relaxtrio.rollout.step import group_metrics
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine


def _stream(n: int, *, shuffle: bool = True, seed: int = 3) -> PromptStream:
    rows = [Prompt(index=i, messages=({"role": "user", "content": f"task {i}"},), metadata={})
            for i in range(n)]
    return PromptStream(prompts=rows, shuffle=shuffle, seed=seed)


@pytest.mark.parametrize("cut", [0, 1, 4, 5, 9])
def test_a_restored_stream_serves_what_the_original_would_have(cut: int) -> None:
    original = _stream(5)
    want = [next(original).index for _ in range(13)]  # almost three epochs, each reshuffled
    first = _stream(5)
    head = [next(first).index for _ in range(cut)]
    cursor = json.loads(json.dumps(first.cursor()))  # what state.json stores
    second = _stream(5)
    second.restore(cursor)
    assert head + [next(second).index for _ in range(13 - cut)] == want
    assert len(set(want[:5])) == 5 and len(set(want[5:10])) == 5


def test_requeued_prompts_come_first_and_bad_cursors_are_refused() -> None:
    stream = _stream(4, shuffle=False)
    assert next(stream).index == 0
    cursor = {**stream.cursor(), "pending": [3, 2]}  # a checkpoint taken with two prompts held
    stream.restore(cursor)
    assert [next(stream).index for _ in range(5)] == [3, 2, 1, 2, 3]
    with pytest.raises(ConfigError, match="checkpoint prompt index 4 is not in 0..3"):
        stream.restore({**cursor, "pending": [4]})
    with pytest.raises(ConfigError, match="for 4 prompts, but --prompt-data has 6"):
        _stream(6).restore(stream.cursor())


def test_metrics_log_resumed_keeps_exactly_the_saved_rows(tmp_path: Path) -> None:
    log = MetricsLog.fresh(tmp_path / "metrics.jsonl")
    for step in range(3):
        log.append(step, {"reward_mean": float(step), "prompt_indices": [step]})
    resumed = MetricsLog.resumed(log.path, log.rows[:2])  # step 2 runs again
    resumed.append(2, {"reward_mean": 7.0})
    lines = [json.loads(line) for line in log.path.read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 1, 2] and lines[2]["reward_mean"] == 7.0
    assert lines[1]["prompt_indices"] == [1] and resumed.rows == lines


@pytest.mark.slow
async def test_fully_async_group_at_the_checkpoint_is_dropped_counted_and_its_prompt_rerun(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Group still generating at the save (fully async) is dropped on resume with a logged
    count, and its prompt is the next one served, as the uninterrupted run trains it next."""
    caplog.set_level(logging.WARNING)
    tokenizer = load_tokenizer(tiny_model_dir)
    release = trio.Event()

    def reply(ids) -> Reply:
        late = "task 1" in tokenizer.decode(list(ids))
        return Reply(text="late", gate=release) if late else Reply(text="fine")

    engine = ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id, replies=reply)
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=1, over_sampling_batch_size=2,
                           fully_async=True, show_progress=False)
    stream = prompts([{}, {}, {}])
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, stream,
                                      config=config) as (pipeline, _registry):
            await pipeline.run_step(0)
            [carried] = pipeline.resident_groups
            saved = capture_rollout(pipeline.prompts, pipeline.held_groups, next_rollout_id=1)
            release.set()
            await carried.wait_finished()  # finished after its step closed: still held
            assert pipeline.held_groups == (carried,)
            second = await pipeline.run_step(1)
            rest = [next(stream).index for _ in range(4)]
    assert carried.prompt_index == 1 and second.groups[0].group is carried
    assert (saved.held_groups, saved.held_sessions, saved.held_prompts) == (1, 2, (1,))

    restored = prompts([{}, {}, {}])
    checkpoint = RolloutCheckpoint.from_json(json.loads(json.dumps(saved.to_json())))
    assert restore_rollout(restored, checkpoint) == {"resume_dropped_groups": 1.0,
                                                     "resume_dropped_sessions": 2.0}
    assert "event=resume_dropped rollout=1 groups=1 sessions=2" in caplog.text
    # Step 1 reruns prompt 1; afterwards the stream goes on exactly as the original did.
    assert next(restored).index == 1
    assert [next(restored).index for _ in range(4)] == rest


def _task_index(tokenizer, ids) -> int:
    text = tokenizer.decode(list(ids))
    return int(text.rsplit("task ", 1)[1].split("<", 1)[0].split()[0])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fully_async", "partial_rollout", "default"])
async def test_the_end_of_run_checkpoint_requeues_what_the_last_step_dropped(
    mode: str, tokenizer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two steps, the last one closing on a Group still generating (odd prompts never finish).

    The last step drops it and counts it in ``dropped_groups``. With fully async or partial
    rollout a longer run would have trained it in its next step, so the checkpoint written
    after the last step requeues its prompt for a run extended from it; without either, every
    step close drops such a Group, so a longer run would not train it either: counted only.
    """
    caplog.set_level(logging.INFO)
    never = trio.Event()
    engine = ScriptedEngine(
        tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
        replies=lambda ids: Reply(text="slow", gate=never) if _task_index(tokenizer, ids) % 2
        else Reply(text="fine"))
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, over_sampling_batch_size=2,
                           fully_async=mode == "fully_async", partial_rollout=mode == "partial_rollout",
                           show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}] * 6),
                                      config=config) as (pipeline, _registry):
            first = await pipeline.run_step(0)
            if config.fully_async:  # as the driver does between a step and its update
                pipeline.backfill(1)
            second = await pipeline.run_step(1, last=True)
            assert pipeline.held_groups == () and pipeline.resident_groups == ()
            saved = capture_pipeline(pipeline, next_rollout_id=2)
    trained = [g.group.prompt_index for r in (first, second) for g in r.groups]
    dropped = [g.prompt_index for r in (first, second) for g in r.dropped]
    assert trained == [0, 2]
    assert dropped == ([1, 3] if mode == "default" else [1])  # every drawn prompt accounted for
    assert group_metrics(second, config)["dropped_groups"] == 1.0
    assert all("step closed" in g.dropped_reason for r in (first, second) for g in r.dropped)
    requeued = () if mode == "default" else (1,)
    assert saved.held_groups == 0
    assert (saved.run_end_groups, saved.run_end_sessions, saved.run_end_prompts) == (
        len(requeued), len(requeued), requeued)

    extended = prompts([{}] * 6)
    checkpoint = RolloutCheckpoint.from_json(json.loads(json.dumps(saved.to_json())))
    resumed_metrics = restore_rollout(extended, checkpoint)
    # The extension trains the requeued prompt first, then goes on where the stream stood.
    drawn = 4 if mode == "default" else 3  # prompts 0 .. drawn - 1 were drawn
    assert [next(extended).index for _ in range(len(requeued) + 2)] == [*requeued, drawn, drawn + 1]
    if requeued:
        assert resumed_metrics == {"resume_dropped_groups": 0.0, "resume_dropped_sessions": 0.0,
                                   "resume_requeued_groups": 1.0}
        assert "event=resume_requeued rollout=2 groups=1 sessions=1" in caplog.text
    else:
        assert resumed_metrics == {"resume_dropped_groups": 0.0, "resume_dropped_sessions": 0.0}


@pytest.mark.slow
async def test_a_finished_group_the_last_step_did_not_need_is_dropped_counted_and_requeued(
    tokenizer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Fully async: two Groups finish after step 0 closed; the last step trains one, and the
    other (finished, not needed) is counted as dropped with its reason, and requeued."""
    caplog.set_level(logging.WARNING)
    release = trio.Event()
    engine = ScriptedEngine(
        tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
        replies=lambda ids: Reply(text="late", gate=release) if _task_index(tokenizer, ids)
        else Reply(text="fine"))
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, over_sampling_batch_size=3,
                           fully_async=True, show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}] * 4),
                                      config=config) as (pipeline, _registry):
            await pipeline.run_step(0)
            carried = pipeline.resident_groups
            release.set()
            for group in carried:
                await group.wait_finished()
            finished = pipeline.held_groups  # both, in finishing order, neither accounted for yet
            assert set(finished) == set(carried) and len(finished) == 2
            last = await pipeline.run_step(1, last=True)
            saved = capture_pipeline(pipeline, next_rollout_id=2)
    [trained] = [g.group for g in last.groups]
    [extra] = last.dropped
    assert (trained, extra) == finished
    assert "not needed: step 1 already had its 1 groups" in extra.dropped_reason
    assert f"Dropped group {extra.group_id}: not needed" in caplog.text
    assert saved.run_end_prompts == (extra.prompt_index,)
    assert saved.stream["pending"][0] == extra.prompt_index


def test_a_checkpoint_without_run_end_keys_still_resumes() -> None:
    """``state.json["rollout"]`` as checkpoints before run-end Groups wrote it."""
    old = {"next_rollout_id": 3, "held_groups": 1, "held_sessions": 2, "held_prompts": [2],
           "stream": {"epoch": 1, "pending": [2], "remaining": [0, 1], "num_prompts": 4,
                      "seed": 3, "shuffle": False}}
    checkpoint = RolloutCheckpoint.from_json(old)
    assert (checkpoint.run_end_groups, checkpoint.run_end_prompts) == (0, ())
    stream = _stream(4, shuffle=False)
    assert restore_rollout(stream, checkpoint) == {"resume_dropped_groups": 1.0,
                                                   "resume_dropped_sessions": 2.0}
    assert [next(stream).index for _ in range(3)] == [2, 0, 1]
