"""The rollout side of resume: prompt stream cursors, Groups a checkpoint cannot hold, metrics."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import trio
from support.pipeline import open_test_pipeline, prompts

from relaxtrio._errors import ConfigError
from relaxtrio.config import RolloutConfig
from relaxtrio.models import load_tokenizer
from relaxtrio.rollout.dataset import Prompt, PromptStream
from relaxtrio.rollout.metrics import MetricsLog
from relaxtrio.rollout.resume import RolloutCheckpoint, capture_rollout, restore_rollout
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
    stream.requeue([3, 2])
    assert [next(stream).index for _ in range(5)] == [3, 2, 1, 2, 3]
    with pytest.raises(ConfigError, match="is not in 0..3"):
        stream.requeue([4])
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
