"""The multi-context example: a main and two searcher contexts per Session train one step through
custom advantage, and each context's credit is in the step's metrics."""

from __future__ import annotations

import pytest

import json
import math
import shlex
import sys
from pathlib import Path

import trio

from examples.multi_context.advantage import credit
from relaxtrio._errors import ConfigError
from relaxtrio.config import (
    AgentConfig,
    GenerationConfig,
    RolloutConfig,
    TrainConfig,
    TrainRunConfig,
)
from relaxtrio.run.driver import run_training
from relaxtrio.rollout.hooks import load_function

pytestmark = pytest.mark.slow  # starts real processes

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multi_context"


def test_credit_by_hand() -> None:
    slots = [
        {"main": {"outcome": 1.0}, "searcher_0": {"usefulness": 0.5}, "searcher_1": {"usefulness": 0.0}},
        {"main": {"outcome": 0.0}, "searcher_0": {"usefulness": 1.0}, "searcher_1": {"usefulness": 0.25}},
    ]
    # mean outcome 0.5: main +-0.5, each searcher that times its usefulness
    assert credit(slots) == [
        {"main": 0.5, "searcher_0": 0.25, "searcher_1": 0.0},
        {"main": -0.5, "searcher_0": -0.5, "searcher_1": -0.125},
    ]
    assert credit([{"main": {"outcome": 1.0}, "searcher_0": {"usefulness": 1.0}}] * 2) == [
        {"main": 0.0, "searcher_0": 0.0}] * 2


async def test_one_step_trains_every_context_with_its_own_credit(tiny_model_dir: Path, tmp_path: Path) -> None:
    fn = load_function("examples.multi_context.advantage.credit", flag="--agentic-custom-advantage-path")
    config = TrainRunConfig(
        prompt_data=EXAMPLE / "data" / "train.jsonl",
        num_rollout=1,
        rollout=RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=1, custom_advantage=fn,
                              show_progress=False),
        generation=GenerationConfig(max_response_tokens=16, seed=3),
        agent=AgentConfig(command=f"{shlex.quote(sys.executable)} agent.py", cwd=EXAMPLE, timeout_s=120),
        train=TrainConfig(lr=1e-2, use_dynamic_batch_size=True, max_tokens_per_gpu=2048),
        hf_checkpoint=tiny_model_dir,
        output_dir=tmp_path / "run",
    )
    with trio.fail_after(300):
        summary = await run_training(config)
    [row] = [json.loads(line) for line in summary.metrics_path.read_text().splitlines()]
    assert row["num_groups"] == 1 and row["num_samples"] == 6 and row["dropped_groups"] == 0
    assert row["loss"] is not None and row["train_tokens"] > 0
    for name in ("main", "searcher_0", "searcher_1"):
        for stat in ("mean", "median", "max", "min"):
            assert math.isfinite(row[f"credit/{name}/{stat}"])
    # main's reward is the Session's outcome; searchers carry none
    assert row["rollout/raw_reward"] in (0.0, 0.5, 1.0)
    assert "usefulness/mean" in row and "outcome/mean" in row


async def test_first_multi_context_export_without_dynamic_batching_stops_the_run(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """Issue 34, contradiction 4: start-up accepts custom advantage without dynamic batching; the
    first step whose Sessions export several contexts stops the run before its update."""
    fn = load_function("examples.multi_context.advantage.credit", flag="--agentic-custom-advantage-path")
    config = TrainRunConfig(
        prompt_data=EXAMPLE / "data" / "train.jsonl",
        num_rollout=2,
        rollout=RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=1, custom_advantage=fn,
                              show_progress=False),
        generation=GenerationConfig(max_response_tokens=16, seed=3),
        agent=AgentConfig(command=f"{shlex.quote(sys.executable)} agent.py", cwd=EXAMPLE, timeout_s=120),
        train=TrainConfig(lr=1e-2),
        hf_checkpoint=tiny_model_dir,
        output_dir=tmp_path / "run",
    )
    with trio.fail_after(300), pytest.RaisesGroup(pytest.RaisesExc(
            ConfigError, match=r"rollout 0: a Session exported 3 contexts; .*--use-dynamic-batch-size"),
            allow_unwrapped=True, flatten_subgroups=True):
        await run_training(config)
