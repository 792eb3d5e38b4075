"""Multi-context export through the pipeline: custom advantage credits, filtering, validation."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
from tests.support.pipeline import open_test_pipeline, prompts

from relaxtrio import ConfigError
from relaxtrio.config import RolloutConfig
from relaxtrio.models import load_tokenizer
from relaxtrio.rollout.hooks import HookError, load_function
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine

pytestmark = pytest.mark.slow  # starts real processes


async def _run(tiny_model_dir: Path, tmp_path: Path, fn_name: str | None):
    tokenizer = load_tokenizer(tiny_model_dir)
    engine = ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
                            replies=lambda ids: Reply(text="found it"))
    fn = load_function(f"tests.support.credit.{fn_name}", flag="--agentic-custom-advantage-path") if fn_name else None
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=1, max_refills=0,
                           custom_advantage=fn, show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{"mode": "multi"}] * 2),
                                      config=config) as (pipeline, _):
            return await pipeline.run_step(0)


async def test_three_contexts_per_session_get_custom_credit(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = await _run(tiny_model_dir, tmp_path, "outcome_times_usefulness")
    [scored] = result.groups
    names = [s.name for s in scored.samples]
    assert names == ["main", "searcher_0", "searcher_1"] * 2
    assert [s.advantage for s in scored.scored] == [1.0, 0.25, 0.5] * 2
    assert [s.reward for s in scored.scored] == [1.0, None, None] * 2
    for sample in scored.samples:
        assert sum(sample.loss_mask) > 0


@pytest.mark.parametrize(
    ("fn_name", "reason"),
    [
        (None, "more than one context per session requires --agentic-custom-advantage-path"),
        ("filter_all", "Filtered 1 group"),
    ],
)
async def test_invalid_credit_drops_the_group_with_a_clear_reason(
    fn_name, reason, tiny_model_dir: Path, tmp_path: Path
) -> None:
    result = await _run(tiny_model_dir, tmp_path, fn_name)
    assert result.groups == () and len(result.dropped) == 1
    assert reason in result.dropped[0].dropped_reason


@pytest.mark.parametrize(
    ("fn_name", "reason"),
    [
        ("missing_name", "session 0 has no value for context 'searcher_0'"),
        ("not_finite", "session 0 context 'main' must be a finite number"),
    ],
)
async def test_invalid_credit_in_every_group_stops_the_run_with_the_reason(
    fn_name, reason, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # The step's one Group fails in the custom advantage hook: no Group of the step succeeded.
    with pytest.RaisesGroup(pytest.RaisesExc(HookError, match=f"failed in a hook \\(1\\); the first: "
                                                              f"custom_advantage hook failed: .*{reason}"),
                            allow_unwrapped=True, flatten_subgroups=True):
        await _run(tiny_model_dir, tmp_path, fn_name)


def test_load_function_errors() -> None:
    with pytest.raises(ConfigError, match="package.module.function"):
        load_function("nodots", flag="--x")
    with pytest.raises(ConfigError, match="cannot import"):
        load_function("no_such_module_xyz.fn", flag="--x")
    with pytest.raises(ConfigError, match="not a callable"):
        load_function("tests.support.credit.__doc__", flag="--x")


async def test_filtered_group_is_logged_as_filtered_and_counted(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="relaxtrio")
    result = await _run(tiny_model_dir, tmp_path, "filter_all")
    [filtered] = result.dropped
    assert result.filtered_groups == 1
    assert (f"Filtered group {filtered.group_id}: Filtered 1 group: the custom advantage function "
            "returned None") in caplog.text
    assert f"Dropped group {filtered.group_id}" not in caplog.text
    assert "dropped_groups=1 filtered_groups=1" in caplog.text
