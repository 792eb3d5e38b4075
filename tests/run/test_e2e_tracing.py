"""A real one-step training run with ``--otel-file``: the spans of the run as JSON lines, and a
step whose Groups all had identical rewards warned about once and marked in its row."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import trio
from tests.support.agents import write_httpx_agent

from relaxtrio.config import AgentConfig, GenerationConfig, RolloutConfig, TracingConfig, TrainRunConfig
from relaxtrio.run.driver import run_training
from relaxtrio.train import TrainConfig

pytestmark = pytest.mark.slow  # starts real processes


async def test_a_run_writes_its_span_tree_and_marks_a_step_that_cannot_teach(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="relaxtrio")
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    cmd = write_httpx_agent(agent_dir)  # every Session's reward is 1.0: nothing to learn
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"q{i}", "metadata": {}}) + "\n" for i in range(2)))
    spans_path = tmp_path / "spans.jsonl"
    config = TrainRunConfig(
        prompt_data=data, num_rollout=1, rollout_shuffle=False,
        rollout=RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=1, show_progress=False),
        generation=GenerationConfig(max_response_tokens=4, seed=7),
        agent=AgentConfig(command=f"{cmd} ok", cwd=agent_dir, timeout_s=120),
        train=TrainConfig(lr=1e-3), hf_checkpoint=tiny_model_dir, output_dir=tmp_path / "run",
        tracing=TracingConfig(file=spans_path),
    )
    with trio.fail_after(300):
        summary = await run_training(config)
    [row] = [json.loads(line) for line in summary.metrics_path.read_text().splitlines()]
    assert row["step_cannot_teach"] == 1.0 and row["step_cannot_teach_cause"] == "zero_advantage"
    warnings = [r.getMessage() for r in caplog.records if "cannot teach" in r.getMessage()]
    assert len(warnings) == 1 and "--dynamic-sampling-filter-path" in warnings[0]

    spans = [json.loads(line) for line in spans_path.read_text().splitlines()]
    by_id = {s["span_id"]: s for s in spans}

    def lineage(span: dict) -> list[str]:
        names = [span["name"]]
        while span["parent_span_id"] is not None:
            span = by_id[span["parent_span_id"]]
            names.append(span["name"])
        return names[::-1]

    generate = [s for s in spans if s["name"] == "relaxtrio.engine_call" and s["attributes"]["url.path"] == "/generate"]
    assert generate and {tuple(lineage(s)) for s in generate} == {
        ("relaxtrio.run", "relaxtrio.step", "relaxtrio.group", "relaxtrio.session", "relaxtrio.request",
         "relaxtrio.engine_call")}
    pushes = [s for s in spans if s["name"] == "relaxtrio.engine_call" and lineage(s)[-2] == "relaxtrio.step"]
    assert pushes  # the weight push's control calls belong to the step
    [run] = [s for s in spans if s["name"] == "relaxtrio.run"]
    assert run["attributes"] == {"relaxtrio.run.kind": "train"} and len({s["trace_id"] for s in spans}) == 1
