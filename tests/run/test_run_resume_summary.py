"""A resumed run's end: the summary's whole-run and this-process figures (the resume counts and
the run-end Groups saved for an extension among them), and a checkpoint written before run-end
Groups existed, resumed through :class:`RunCheckpointer`."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from tests.support.pipeline import open_test_pipeline, prompts

from relaxtrio.config import AgentConfig, RolloutConfig, TrainRunConfig
from relaxtrio.run.driver import _finish, _load_datasets
from relaxtrio.run.step import StepOutputs
from relaxtrio.rollout.metrics import MetricsLog
from relaxtrio.rollout.step import group_metrics
from relaxtrio.run.checkpoint import RunCheckpointer
from relaxtrio.run.summary import StepTotals, summarize_run
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine
from relaxtrio.train import TrainConfig, Trainer

# state.json of a checkpoint after 2 of 2 steps, as the format before run-end Groups wrote it.
_OLD_STATE = {
    "format": 1, "steps_done": 2, "weight_version": "step-2",
    "rollout": {"next_rollout_id": 2, "held_groups": 0, "held_sessions": 0, "held_prompts": [],
                "stream": {"epoch": 1, "pending": [], "remaining": [3], "num_prompts": 4,
                           "seed": 1, "shuffle": False}},
    "metrics": [{"step": 0, "num_samples": 4, "dropped_groups": 1, "loss": 0.5},
                {"step": 1, "num_samples": 4, "dropped_groups": 0, "loss": 0.25}],
}


def _resumed_config(tmp_path: Path, state: dict, shape: dict | None = None) -> TrainRunConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"task {i}"}) + "\n" for i in range(4)))
    run = {"output_dir": str(tmp_path / "run"), "prompt_data": str(data), "num_rollout": 2}
    state = {**state, "run": run if shape is None else {**run, "shape": shape}}
    checkpoint = tmp_path / "ckpt" / "iter_0000002"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_text(json.dumps(state))
    (tmp_path / "ckpt" / "latest").write_text("iter_0000002\n")
    return TrainRunConfig(prompt_data=data, num_rollout=4, rollout_shuffle=False,
                          agent=AgentConfig(command="true", cwd=tmp_path),
                          output_dir=tmp_path / "run", load_dir=tmp_path / "ckpt",
                          rollout_only=True)


def _resume(tmp_path: Path, state: dict) -> tuple[TrainRunConfig, RunCheckpointer, MetricsLog, Any]:
    """A run resumed from ``state``: its checkpointer, metrics log and restored prompt stream."""
    config = _resumed_config(tmp_path, state)
    checkpointer = RunCheckpointer.open(config)
    metrics = checkpointer.open_metrics(config.output_dir / "metrics.jsonl")
    prompts, _ = _load_datasets(config)
    checkpointer.restore_prompts(prompts)
    return config, checkpointer, metrics, prompts


async def test_a_resumed_summary_names_whole_run_and_this_process_figures(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    # an old checkpoint: nothing requeued, cursor kept
    config, checkpointer, metrics, prompts = _resume(tmp_path, _OLD_STATE)
    assert checkpointer.first_rollout_id == 2
    assert next(prompts).index == 3
    for step, row in ((2, {"num_samples": 2, "dropped_groups": 2, "loss": 0.1}),
                      (3, {"num_samples": 0, "dropped_groups": 3})):  # step 3 trained nothing
        checkpointer.note_step(step, row)
        metrics.append(step, row)
    summary = await _finish(config.output_dir, None, tmp_path, metrics,
                            StepOutputs.fresh(config, tmp_path), first_rollout_id=2)
    rows = [json.loads(line) for line in summary.metrics_path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert summary.run == StepTotals.of(rows) == StepTotals(steps=4, trained_steps=3, num_samples=10,
                                                            dropped_groups=6)
    assert summary.this_process == StepTotals(steps=2, trained_steps=1, num_samples=2, dropped_groups=5)
    assert (summary.trained_steps, summary.num_samples) == (3, 10)  # the whole run, as metrics.jsonl
    assert summary.judged == summary.this_process  # the exit status: what this process trained
    assert ("finished: this process (steps 2..3): 1 of 2 steps trained, 2 samples, 5 Groups "
            "dropped; the whole run (metrics.jsonl): 3 of 4 steps trained, 10 samples, "
            "6 Groups dropped") in caplog.text
    assert "resume_requeued_groups" not in rows[2] and rows[2]["resume_dropped_groups"] == 0


async def test_a_fresh_summary_is_the_whole_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    config = _resumed_config(tmp_path, _OLD_STATE)
    checkpointer = RunCheckpointer(config=config)  # no resume point
    metrics = checkpointer.open_metrics(tmp_path / "fresh" / "metrics.jsonl")
    metrics.append(0, {"num_samples": 3, "dropped_groups": 1, "loss": 0.2})
    summary = await _finish(tmp_path / "fresh", None, tmp_path, metrics,
                            StepOutputs.fresh(config, tmp_path))
    assert summary.run == summary.this_process == StepTotals(steps=1, trained_steps=1, num_samples=3,
                                                             dropped_groups=1)
    assert "finished: 1 of 1 step trained, 3 samples, 1 Group dropped" in caplog.text
    # Resumed with no step left to run: judged by the whole run.
    done = await _finish(tmp_path / "fresh", None, tmp_path, metrics,
                         StepOutputs.fresh(config, tmp_path), first_rollout_id=1)
    assert done.this_process == StepTotals() and done.judged == done.run
    assert "finished: no step left to run after step 0; the whole run" in caplog.text


# state.json after 2 of 2 steps of a run killed with Groups 2 and 3 resident (mid-run style) and
# extended: prompt 1 was a run-end Group of the last step (in its dropped_groups).
_HELD_STATE = {
    **_OLD_STATE,
    "rollout": {"next_rollout_id": 2, "held_groups": 2, "held_sessions": 2, "held_prompts": [2, 3],
                "run_end_groups": 1, "run_end_sessions": 1, "run_end_prompts": [1],
                "stream": {"epoch": 1, "pending": [2, 3, 1], "remaining": [], "num_prompts": 4,
                           "seed": 1, "shuffle": False}},
}


async def test_a_resumed_summary_names_the_groups_rerun_and_requeued_on_resume(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    config, checkpointer, metrics, _ = _resume(tmp_path, _HELD_STATE)
    for step in (2, 3):
        row = {"num_samples": 2, "dropped_groups": 0, "loss": 0.1}
        checkpointer.note_step(step, row)
        metrics.append(step, row)
    summary = await _finish(config.output_dir, None, tmp_path, metrics,
                            StepOutputs.fresh(config, tmp_path), first_rollout_id=2)
    assert summary.run == StepTotals(steps=4, trained_steps=4, num_samples=12, dropped_groups=1,
                                     resume_dropped_groups=2, resume_requeued_groups=1)
    assert summary.this_process == StepTotals(steps=2, trained_steps=2, num_samples=4,
                                              resume_dropped_groups=2, resume_requeued_groups=1)
    resumed = ("2 Groups in flight at a checkpoint rerun on resume, 1 Group from a finished "
               "run's end requeued on resume")
    assert summary.run.describe() == f"4 of 4 steps trained, 12 samples, 1 Group dropped, {resumed}"
    assert (f"finished: this process (steps 2..3): 2 of 2 steps trained, 4 samples, 0 Groups "
            f"dropped, {resumed}; the whole run (metrics.jsonl): 4 of 4 steps trained, 12 samples, "
            f"1 Group dropped, {resumed}") in caplog.text


def test_a_count_of_one_is_singular_in_the_summary(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    assert StepTotals(steps=1, trained_steps=1, num_samples=1, dropped_groups=1).describe() == (
        "1 of 1 step trained, 1 sample, 1 Group dropped")
    assert StepTotals(steps=2, trained_steps=0).describe() == "0 of 2 steps trained, 0 samples, 0 Groups dropped"
    rows = [{"step": 0, "num_samples": 2, "loss": 0.1}, {"step": 1, "num_samples": 1, "loss": 0.1}]
    summarize_run(Path("m.jsonl"), rows, plot_path=Path("p.png"), checkpoint_dir=None, first_rollout_id=1)
    assert ("finished: this process (step 1): 1 of 1 step trained, 1 sample, 0 Groups dropped; "
            "the whole run (metrics.jsonl): 2 of 2 steps trained, 3 samples, 0 Groups dropped") in caplog.text


def test_run_end_groups_saved_for_an_extension_are_told_apart_from_lost_ones() -> None:
    totals = StepTotals(steps=2, trained_steps=2, num_samples=4, dropped_groups=2, saved_groups=1)
    assert totals.describe() == ("2 of 2 steps trained, 4 samples, 2 Groups dropped (1 of them "
                                 "saved for an extension of this run)")


@pytest.mark.slow
async def test_the_end_of_run_checkpoint_saves_a_group_the_summary_then_names(
    tiny_model_dir: Path, tokenizer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Fully async, 2 steps: the last step drops the Group still generating (its prompt is saved
    by the ``--save`` checkpoint written after it) and the ``finished:`` line says so."""
    caplog.set_level(logging.INFO)
    never = trio.Event()
    engine = ScriptedEngine(
        tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
        replies=lambda ids: Reply(text="slow", gate=never) if "task 1" in tokenizer.decode(list(ids))
        else Reply(text="fine"))
    rollout = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, over_sampling_batch_size=2,
                            fully_async=True, show_progress=False)
    data = tmp_path / "prompts.jsonl"  # hashed into the checkpoint
    data.write_text("".join(json.dumps({"input": f"task {i}"}) + "\n" for i in range(4)))
    config = TrainRunConfig(prompt_data=data, num_rollout=2,
                            agent=AgentConfig(command="true", cwd=tmp_path),
                            output_dir=tmp_path / "run", save_dir=tmp_path / "ckpt")
    checkpointer = RunCheckpointer(config=config)
    trainer = Trainer.from_pretrained(tiny_model_dir, TrainConfig(lr=1e-3))
    metrics = MetricsLog.fresh(tmp_path / "run" / "metrics.jsonl")
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}] * 4),
                                      config=rollout) as (pipeline, _registry):
            for step in (0, 1):
                result = await pipeline.run_step(step, last=step == 1)
                if step == 0:
                    pipeline.backfill(1)  # as the driver does between a step and its update
                metrics.append(step, {**group_metrics(result, rollout), "loss": 0.1})
                assert checkpointer.save_due(step) == (step == 1)
            await checkpointer.save(1, trainer=trainer, pipeline=pipeline, metrics=metrics,
                                    tokenizer_dir=None)
    assert checkpointer.saved_groups == 1
    summary = await _finish(tmp_path / "run", None, tmp_path, metrics,
                            StepOutputs.fresh(config, tmp_path), saved_groups=checkpointer.saved_groups)
    assert summary.run.dropped_groups == 1  # the documented counter is unchanged
    assert ("finished: 2 of 2 steps trained, 2 samples, 1 Group dropped (1 of them saved for an "
            "extension of this run)") in caplog.text


def test_a_resume_with_another_step_shape_warns_for_each_changed_flag(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shape = {"--rollout-batch-size": 1, "--n-samples-per-prompt": 2, "--over-sampling-batch-size": None}
    config = _resumed_config(tmp_path, _OLD_STATE, shape=shape)
    config = attrs.evolve(config, rollout=RolloutConfig(rollout_batch_size=2, n_samples_per_prompt=2))
    prompts, _ = _load_datasets(config)
    caplog.set_level(logging.WARNING)
    RunCheckpointer.open(config).restore_prompts(prompts)
    changed = [r.getMessage() for r in caplog.records if "the checkpoint's run used" in r.getMessage()]
    assert changed == [("resume: --rollout-batch-size is 2, the checkpoint's run used 1: the run "
                       "continues in this run's shape, so its steps after the resume are not the "
                       "ones the interrupted run would have run (the prompt order is kept)")]
    assert next(prompts).index == 3  # the cursor is restored all the same


def test_the_same_step_shape_or_an_older_checkpoint_resumes_without_a_shape_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for name, shape in (("same", {"--rollout-batch-size": 4, "--n-samples-per-prompt": 4,
                                  "--over-sampling-batch-size": None}), ("old", None)):
        config = _resumed_config(tmp_path / name, _OLD_STATE, shape=shape)
        prompts, _ = _load_datasets(config)
        caplog.set_level(logging.WARNING)
        RunCheckpointer.open(config).restore_prompts(prompts)
    assert "the checkpoint's run used" not in caplog.text


def test_the_step_shape_names_each_flag_with_this_runs_value(tmp_path: Path) -> None:
    from relaxtrio.run.checkpoint import _run_shape

    config = TrainRunConfig(prompt_data=tmp_path / "p.jsonl", agent=AgentConfig(command="true", cwd=tmp_path),
                            rollout=RolloutConfig(rollout_batch_size=3, n_samples_per_prompt=5,
                                                  over_sampling_batch_size=4))
    assert _run_shape(config) == {"--rollout-batch-size": 3, "--n-samples-per-prompt": 5,
                                  "--over-sampling-batch-size": 4}
