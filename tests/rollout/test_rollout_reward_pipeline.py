"""Reward models and dynamic filters through the real pipeline (agents, API, scripted engine)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from tests.support.pipeline import open_test_pipeline, prompts

from relaxtrio.config import RolloutConfig
from relaxtrio.models import load_tokenizer
from relaxtrio.rollout.filters import check_reward_nonzero_std
from relaxtrio.rollout.hooks import load_function
from relaxtrio.rollout.step import group_metrics
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine

pytestmark = pytest.mark.slow  # starts real processes


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return load_tokenizer(tiny_model_dir)


def _engine(tokenizer) -> ScriptedEngine:
    return ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
                          replies=lambda ids: Reply(text="fine"))


async def test_async_reward_model_scores_agents_without_reward(tokenizer, tmp_path: Path) -> None:
    rm = load_function("tests.support.rewards.async_length_reward", flag="--custom-rm-path")
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=1, custom_rm=rm, reward_key="score",
                           show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, _engine(tokenizer), prompts([{}] * 2),
                                      config=config, env={"AGENT_REWARD": "none"}) as (pipeline, _):
            result = await pipeline.run_step(0)
    [scored] = result.groups
    assert [s.reward for s in scored.scored] == [0.5, 0.5]
    assert all(s.reward["length"] == sum(s.loss_mask) for s in scored.samples)
    row = group_metrics(result, config)
    assert row["rollout/raw_reward"] == 0.5 and row["rollout/length/mean"] > 0


async def test_group_rm_through_the_pipeline(tokenizer, tmp_path: Path) -> None:
    rm = load_function("tests.support.rewards.group_rank_reward", flag="--custom-rm-path")
    config = RolloutConfig(n_samples_per_prompt=3, rollout_batch_size=1, custom_rm=rm, group_rm=True,
                           show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, _engine(tokenizer), prompts([{}] * 2),
                                      config=config) as (pipeline, _):
            result = await pipeline.run_step(0)
    [scored] = result.groups
    assert [s.reward for s in scored.scored] == [0.0, 1.0, 2.0]  # Session order; the agents' 1.0 overwritten


async def test_filtered_groups_are_new_demand_counted_not_dropped(tokenizer, tmp_path: Path) -> None:
    # Every agent writes reward 1.0: each Group has zero reward spread and is filtered; the step
    # replaces it (max_refills=0 does not apply to filtered Groups) until the filter budget of 2
    # replacements is used, then closes short.
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=1, max_refills=0,
                           dynamic_filter=check_reward_nonzero_std, max_filtered_groups=2,
                           show_progress=False)
    with trio.fail_after(90):
        async with open_test_pipeline(tmp_path, tokenizer, _engine(tokenizer), prompts([{}] * 4),
                                      config=config) as (pipeline, _):
            result = await pipeline.run_step(0)
    assert result.groups == () and result.dropped == ()
    assert [(v.source, v.reason) for v in result.filtered] == [("dynamic_filter", "zero_std")] * 3
    assert len({v.group.group_id for v in result.filtered}) == 3
    row = group_metrics(result, config)
    assert row["filtered_groups"] == 3.0 and row["rollout/dynamic_filter/drop_zero_std"] == 3.0
