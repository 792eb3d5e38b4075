"""Trackers beside metrics.jsonl: family names, TensorBoard event files and W&B offline runs read
back, the tracker flags, the run log and the capacity line."""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

import pytest
from tests.support.trackers import tensorboard_scalars, wandb_history

from relaxtrio.cli.train_config import train_config

from relaxtrio.cli.train_flags import add_train_parser
from relaxtrio.config import AgentConfig, RolloutConfig, TrackerConfig, TrainRunConfig
from relaxtrio.run.driver import check_capacity, record_run_log
from relaxtrio.run.trackers import Trackers, family_of, family_scalars

ROWS = [
    {"step": 0, "reward_mean": 0.25, "loss": 1.5, "step_s": 3.0, "rollout_tokens_per_s": 40.0,
     "stop_reason/stop/count": 4.0, "num_turn/p50": 2.0, "eval/quiz/reward_mean": 0.5,
     "prompt_indices": [3, 1], "reward_std": None},
    {"step": 1, "reward_mean": 0.75, "loss": 1.25, "step_s": 2.5, "rollout_tokens_per_s": 50.0,
     "stop_reason/stop/count": 3.0, "num_turn/p50": 1.0, "reward_std": 0.1},
]


def test_flat_keys_map_to_families() -> None:
    assert [family_of(k) for k in ("reward_mean", "dropped_groups", "loss", "ppo_kl", "train_tokens",
                                   "rollout_s", "train_s", "rollout_tokens_per_s", "num_turn/max",
                                   "eval/x/reward_mean")] == [
        "rollout/reward_mean", "rollout/dropped_groups", "train/loss", "train/ppo_kl",
        "train/train_tokens", "perf/rollout_s", "perf/train_s", "perf/rollout_tokens_per_s",
        "num_turn/max", "eval/x/reward_mean"]
    scalars = family_scalars({**ROWS[0], "nan": math.nan, "flag": True})
    assert "step" not in scalars and "rollout/prompt_indices" not in scalars
    assert "rollout/reward_std" not in scalars and "rollout/nan" not in scalars
    assert "rollout/flag" not in scalars and scalars["train/loss"] == 1.5


@pytest.mark.slow  # wandb starts its service process
def test_tensorboard_and_wandb_offline_write_every_step(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = TrackerConfig(tensorboard_dir=tmp_path / "tensorboard", wandb_dir=tmp_path,
                        wandb_mode="offline", wandb_run_name="test-run")
    trackers = Trackers.open(cfg, {"num_rollout": 2})
    try:
        for row in ROWS:
            trackers.log(row["step"], row)
    finally:
        trackers.close()

    scalars = tensorboard_scalars(tmp_path / "tensorboard")
    assert scalars["rollout/reward_mean"] == [(0, 0.25), (1, 0.75)]
    assert scalars["train/loss"] == [(0, 1.5), (1, 1.25)]
    assert [s for s, _ in scalars["perf/rollout_tokens_per_s"]] == [0, 1]
    assert scalars["stop_reason/stop/count"] == [(0, 4.0), (1, 3.0)]
    assert scalars["eval/quiz/reward_mean"] == [(0, 0.5)]
    assert [s for s, _ in scalars["rollout/reward_std"]] == [1]  # null in step 0: not sent

    history = wandb_history(tmp_path)
    assert [row["_step"] for row in history] == [0, 1]
    assert [row["rollout/reward_mean"] for row in history] == [0.25, 0.75]
    assert [row["num_turn/p50"] for row in history] == [2.0, 1.0]
    assert history[0]["perf/step_s"] == 3.0 and "rollout/reward_std" not in history[0]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["train", *argv])


def test_tracker_flags_default_into_the_run_directory(tmp_path: Path) -> None:
    plain = train_config(_parse(["--output-dir", str(tmp_path)]))
    assert not plain.trackers.enabled
    both = train_config(_parse(["--output-dir", str(tmp_path), "--use-tensorboard", "--use-wandb",
                                "--wandb-mode", "offline", "--wandb-project", "p"]))
    assert both.trackers == TrackerConfig(tensorboard_dir=tmp_path / "tensorboard", wandb_dir=tmp_path,
                                          wandb_project="p", wandb_mode="offline")


def test_run_log_records_relaxtrio_lines_while_inside(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="relaxtrio")
    log = logging.getLogger("relaxtrio.rollout.pipeline")
    with record_run_log(tmp_path / "run" / "run.log") as path:
        log.info("AGENTIC ROLLOUT event=accounting_start rollout=0")
    log.info("after the run")
    text = path.read_text()
    assert "INFO relaxtrio.rollout.pipeline: AGENTIC ROLLOUT event=accounting_start rollout=0" in text
    assert "after the run" not in text


def test_checking_capacity_logs_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The command line checks capacity before the run and the run checks it again; only the run
    # logs the capacity line, so it appears once.
    caplog.set_level(logging.INFO, logger="relaxtrio")
    cfg = TrainRunConfig(prompt_data=tmp_path / "p.jsonl", agent=AgentConfig(command="true", cwd=tmp_path),
                         rollout=RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=2))
    plan = check_capacity(cfg)
    assert plan.required > 0 and "agent capacity" not in caplog.text
