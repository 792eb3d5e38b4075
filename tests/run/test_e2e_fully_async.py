"""A real ``--fully-async`` run with a staleness bound: the driver runs the rollout ahead, tells
the pipeline each loaded weight version, pauses budgets through the push, and ends with a final
backfill (docs/scheduling.md#fully-async)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.run.test_e2e_resume import _command, _finish, _rows, _start

pytestmark = pytest.mark.slow  # starts real processes


def test_fully_async_run_with_a_staleness_bound_trains_every_step(tiny_model_dir: Path,
                                                                  tmp_path: Path) -> None:
    (tmp_path / "prompts.jsonl").write_text("".join(
        json.dumps({"input": f"Question {i}: name a colour.", "metadata": {"id": i}}) + "\n"
        for i in range(8)))
    run_dir = tmp_path / "run"
    cmd = _command(tmp_path, tiny_model_dir, "bounded", "--fully-async", "--max-staleness", "1",
                   "--over-sampling-batch-size", "2", "--agentic-concurrency", "4",
                   "--output-dir", str(run_dir))
    log = _finish(_start(cmd, tmp_path / "run.log"), tmp_path / "run.log")
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["num_groups"] == 1.0 and "stale_groups" in r for r in rows)
    # A Group staler than the bound (possible when a finished one waits two steps in the queue)
    # is dropped, counted in both figures, and replaced.
    assert all(r["dropped_groups"] >= r["stale_groups"] for r in rows)
    trained = [i for r in rows for i in r["prompt_indices"]]
    assert len(set(trained)) == 3
    assert "event=accounting_start rollout=2" in log and "final_backfill=True" in log
