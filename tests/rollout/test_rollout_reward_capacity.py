"""Reward work runs outside the resident capacity (docs/scheduling.md): a slow reward model never
holds a Group permit (train) or an eval slot (C_d), so it cannot throttle agent concurrency.

The agents run in-process (the ``launcher`` of :class:`~relaxtrio.config.AgentConfig`): each makes
one chat request over the real agent API and writes no reward, so the reward model scores it.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import trio
from tests.support.clock import RealTimeLimit
from tests.support.pipeline import open_test_pipeline, prompts

from relaxtrio.config import RolloutConfig
from relaxtrio.nursery.agent import AgentRun
from relaxtrio.rollout.eval import EvalDataset, run_eval
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine

# Bounds the first reward's wait on the old behaviour (permit held: the second Group never
# starts while it waits); the fixed pipeline starts the second Group within milliseconds.
REWARD_WAIT_BOUND_S = 10.0


def in_process_agent(starts: list[str], second_started: trio.Event):
    """A launcher: one chat turn, no reward written; records the Group of each start."""

    async def launch(agent, env, payload, budget, **_: object) -> AgentRun:
        starts.append(env.group_id)
        if len(starts) == 2:
            second_started.set()
        async with httpx.AsyncClient(timeout=30) as client:
            reply = await client.post(env.base_url.rstrip("/") + "/v1/chat/completions",
                                      headers={"Authorization": f"Bearer {env.session_id}"},
                                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
            reply.raise_for_status()
        return AgentRun(return_code=0, output_text="{}", log_tail="", active_s=0.0)

    return launch


async def test_second_group_starts_while_the_first_groups_reward_runs(tokenizer, tmp_path: Path) -> None:
    """Issue 34, contradiction 1: ``--agentic-concurrency 1 --rollout-batch-size 2`` with an async
    reward model that is slow on the first Group: the second Group starts before the first
    Group's reward returns (reward work does not hold the permit)."""
    second_started = trio.Event()
    starts: list[str] = []
    events: list[str] = []

    async def slow_reward(sample) -> float:
        first = not events
        events.append("reward_called")
        if first:
            with trio.move_on_after(REWARD_WAIT_BOUND_S):
                await second_started.wait()
            events.append("first_reward_returns" + ("" if second_started.is_set() else "_timed_out"))
        return 1.0

    engine = ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
                            replies=lambda ids: Reply(text="fine"))
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=2, agentic_concurrency=1,
                           custom_rm=slow_reward, show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}] * 2), config=config,
                                      launcher=in_process_agent(starts, second_started)) as (pipeline, _):
            result = await pipeline.run_step(0, last=True)
    assert "first_reward_returns" in events, events  # the second Group started during the reward
    assert len(starts) == 2 and len(result.groups) == 2
    assert [s.reward for g in result.groups for s in g.scored] == [1.0, 1.0]


async def test_second_eval_group_starts_while_the_first_groups_reward_runs(
        tokenizer, tmp_path: Path, mock_clock) -> None:
    """The eval case: with one eval slot (``--agentic-eval-concurrency 1``) the first eval
    Group's reward waits until the second eval Group has started, which it can only do if the
    first Group gave its slot back when its Sessions ended. The trio clock never moves (the
    agents do real I/O), so nothing times out in trio time; holding the slot through the reward
    would deadlock, and the wall-clock limit ends the test."""
    second_started = trio.Event()
    starts: list[str] = []
    events: list[str] = []

    async def slow_reward(sample) -> float:
        if not events:
            events.append("first_reward_called")
            await second_started.wait()
            events.append("first_reward_returns")
        return 1.0

    engine = ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
                            replies=lambda ids: Reply(text="fine"))
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, custom_rm=slow_reward,
                           show_progress=False)
    dataset = EvalDataset(name="e", prompts=prompts([{}] * 2).prompts, n_samples_per_prompt=1)
    async with RealTimeLimit(30):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}]), config=config,
                                      eval_concurrency=1,
                                      launcher=in_process_agent(starts, second_started)) as (pipeline, _):
            metrics = await run_eval(pipeline, [dataset])
    assert events == ["first_reward_called", "first_reward_returns"]
    assert len(starts) == 2 and all(group_id.startswith("eval:") for group_id in starts), starts
    assert metrics["eval/e/num_samples"] == 2 and metrics["eval/e/reward_mean"] == 1.0
