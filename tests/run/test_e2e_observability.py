"""A real training run's run directory: run.log with the accounting lines and one capacity line,
the kept log of a failed agent, and TensorBoard and W&B (offline) beside metrics.jsonl."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import trio
from tests.support.agents import write_httpx_agent
from tests.support.trackers import tensorboard_scalars, wandb_history

from relaxtrio.config import (
    AgentConfig,
    GenerationConfig,
    RolloutConfig,
    TrackerConfig,
    TrainRunConfig,
)
from relaxtrio.run.driver import run_training
from relaxtrio.train import TrainConfig

pytestmark = pytest.mark.slow  # starts real processes


async def test_run_directory_holds_logs_failed_agent_logs_and_tracker_files(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="relaxtrio")
    monkeypatch.setenv("WANDB_SILENT", "true")
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    cmd = write_httpx_agent(agent_dir)
    data = tmp_path / "prompts.jsonl"
    rows = [{"input": "q0", "metadata": {"mode": "crash_after"}}, {"input": "q1", "metadata": {}},
            {"input": "q2", "metadata": {}}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    config = TrainRunConfig(
        prompt_data=data, num_rollout=1, rollout_shuffle=False,
        rollout=RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=1, show_progress=False),
        generation=GenerationConfig(max_response_tokens=6, seed=7),
        agent=AgentConfig(command=f"{cmd} ok", cwd=agent_dir, timeout_s=120),
        train=TrainConfig(lr=1e-3), hf_checkpoint=tiny_model_dir, output_dir=run,
        trackers=TrackerConfig(tensorboard_dir=run / "tensorboard", wandb_dir=run, wandb_mode="offline"),
    )
    with trio.fail_after(300):
        summary = await run_training(config)
    [row] = [json.loads(line) for line in summary.metrics_path.read_text().splitlines()]
    assert row["dropped_groups"] == 1 and row["num_groups"] == 1
    assert row["num_turn/mean"] == 1 and row["stop_reason/length/count"] + row.get(
        "stop_reason/stop/count", 0) == 2

    text = (run / "run.log").read_text()
    assert text.count("agent capacity:") == 1
    assert text.count("event=accounting_start rollout=0") == 1
    assert "event=accounting_end rollout=0 groups=1 rows=2 debt=0" in text
    assert "Dropped group train:group_000001" in text

    # Both agents crash; whichever fails second may instead be cancelled by its Group's drop
    # (a cancelled Session did not fail, so its log is not kept).
    kept = sorted((run / "agent_logs").iterdir())
    assert kept and {p.name for p in kept} <= {"train_group_000001_session0.log",
                                                "train_group_000001_session1.log"}
    assert all("boom after the request" in p.read_text() for p in kept)

    scalars = tensorboard_scalars(run / "tensorboard")
    for name in ("rollout/reward_mean", "rollout/dropped_groups", "train/loss", "perf/step_s",
                 "num_turn/mean"):
        assert [step for step, _ in scalars[name]] == [0], name
    assert scalars["rollout/dropped_groups"] == [(0, 1.0)]
    # the embedded engine's own figures over the step, in the row and in the trackers
    [rate_key] = [k for k in row if k.startswith("engine/tokens_per_s/")]
    engine = rate_key.removeprefix("engine/tokens_per_s/")
    assert row[rate_key] > 0 and row[f"engine/generated_tokens/{engine}"] > 0
    assert 0 <= row[f"engine/prefix_cache_hit_rate/{engine}"] <= 1 and row[f"engine/queue_s/{engine}"] >= 0
    assert scalars[rate_key] == [(0, pytest.approx(row[rate_key]))]
    [history] = wandb_history(run)
    assert history["_step"] == 0 and history["train/loss"] == pytest.approx(row["loss"])
