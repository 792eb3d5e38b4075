"""Evaluation's results: reward-object fields and pass@k per dataset, failed eval Sessions counted
(their siblings still count), the eval dump, and ``--eval-max-context-len``.

The agents run in-process (the ``launcher`` of :class:`~relaxtrio.config.AgentConfig`) over the
real agent API; the first one started fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import trio
from tests.support.pipeline import open_test_pipeline, prompts

from relaxtrio._errors import AgentExecutionError
from relaxtrio.config import RolloutConfig
from relaxtrio.nursery.agent import AgentRun
from relaxtrio.rollout.dumps import load_dump
from relaxtrio.rollout.eval import EvalDataset, run_eval
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine


def first_one_fails(modes: list[str]):
    """A launcher: the first agent started fails; the others take one turn and write a reward
    object. Records each agent's rollout mode (what it gets as ``RELAX_ROLLOUT_MODE``)."""

    async def launch(agent, env, payload, budget, **_: object) -> AgentRun:
        modes.append(env.mode)
        if len(modes) == 1:
            raise AgentExecutionError("Agent exited with code 3.\nno luck", return_code=3)
        async with httpx.AsyncClient(timeout=30) as client:
            reply = await client.post(env.base_url.rstrip("/") + "/v1/chat/completions",
                                      headers={"Authorization": f"Bearer {env.session_id}"},
                                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
            reply.raise_for_status()
        reward = {"acc": 1.0, "len": 2.0}
        return AgentRun(return_code=0, output_text=json.dumps({"reward": reward}), log_tail="", active_s=0.0)

    return launch


async def test_a_failed_eval_session_is_counted_and_its_siblings_scored(tokenizer, tmp_path: Path) -> None:
    modes: list[str] = []
    engine = ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
                            replies=lambda ids: Reply(text="fine"))
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, eval_reward_key="acc",
                           log_passrate=True, show_progress=False)
    dataset = EvalDataset(name="e", prompts=prompts([{}]).prompts[:1], n_samples_per_prompt=3,
                          max_context_tokens=77)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}]), config=config,
                                      launcher=first_one_fails(modes)) as (pipeline, _):
            metrics = await run_eval(pipeline, [dataset], dump_path=tmp_path / "eval_0.json")
    assert modes == ["eval"] * 3
    assert metrics["eval/e/failed_sessions"] == 1 and metrics["eval/e/dropped_groups"] == 0
    assert metrics["eval/e/num_samples"] == 2 and metrics["eval/e/reward_mean"] == 1.0
    assert metrics["eval/e/raw_reward"] == 1.0 and metrics["eval/e/len/mean"] == 2.0
    assert metrics["eval/e/pass@1"] == pytest.approx(2 / 3) and metrics["eval/e/pass@2"] == 1.0
    dump = load_dump(tmp_path / "eval_0.json")
    assert dump.rollout_id == "eval_0" and len(dump.samples) == 2
    [group] = dump.groups
    assert group["mode"] == "eval" and [s["status"] for s in group["sessions"]].count("failed") == 1
    assert dump.data["eval"]["e"]["metrics"]["eval/e/failed_sessions"] == 1


async def test_eval_max_context_len_replaces_the_train_limit(tokenizer, tmp_path: Path) -> None:
    engine = ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
                            replies=lambda ids: Reply(text="fine"))
    async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}]),
                                  config=RolloutConfig(show_progress=False)) as (pipeline, _):
        pipeline.max_context_tokens = 4096
        [row] = prompts([{}]).prompts[:1]
        assert pipeline.make_group(row, "eval", 1, max_context_tokens=77).sessions[0].forest.max_context_tokens == 77
        assert pipeline.make_group(row, "eval", 1).sessions[0].forest.max_context_tokens == 4096
