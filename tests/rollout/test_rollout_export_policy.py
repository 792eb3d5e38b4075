"""``--agentic-export-policy`` through the pipeline: a harness that branches by design.

The test agent's ``branching`` mode does what mini-swe-agent and opencode do: two retries that
drop the unparsable reply and resend the history plus a format-error message (two more branches
of the task's subtree), then a title request with its own system prompt (a side conversation in
a subtree of its own, answered last). See docs/export-and-credit.md#export-policies.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from tests.support.pipeline import open_test_pipeline, prompts

from relaxtrio import ConfigError
from relaxtrio.config import AgentConfig, RolloutConfig
from relaxtrio.models import load_tokenizer
from relaxtrio.rollout.hooks import load_function
from relaxtrio.rollout.step import group_metrics
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine

pytestmark = pytest.mark.slow  # starts real processes


async def _run(tiny_model_dir: Path, tmp_path: Path, policy: str, custom: str | None = None):
    tokenizer = load_tokenizer(tiny_model_dir)
    answers = iter(range(1000))
    engine = ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
                            replies=lambda ids: Reply(text=f"reply {next(answers)}"))
    fn = load_function(f"tests.support.credit.{custom}", flag="--agentic-custom-advantage-path") if custom else None
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=1, max_refills=0,
                           custom_advantage=fn, show_progress=False)
    with trio.fail_after(60):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{"mode": "branching"}] * 2),
                                      config=config, export_policy=policy) as (pipeline, _):
            return await pipeline.run_step(0), tokenizer


async def test_strict_drops_a_branching_group(tiny_model_dir: Path, tmp_path: Path) -> None:
    result, _ = await _run(tiny_model_dir, tmp_path, "strict")
    assert result.groups == () and "separate conversations" in result.dropped[0].dropped_reason


async def test_final_trains_the_last_answer_of_the_main_conversation(tiny_model_dir: Path, tmp_path: Path) -> None:
    result, tokenizer = await _run(tiny_model_dir, tmp_path, "final")
    [scored] = result.groups
    assert len(scored.samples) == 2 and [s.reward for s in scored.scored] == [1.0, 1.0]
    for sample in scored.samples:
        text = tokenizer.decode(sample.token_ids)
        # the second retry's lineage: the task, the last format error and its reply, no title
        assert "format error 1" in text and "format error 0" not in text and "title" not in text
        assert sample.metadata["rollout_turns"] == 1 and sum(sample.loss_mask) > 0
    metrics = group_metrics(result)
    assert (metrics["unexported_branches"], metrics["unexported_side_leaves"]) == (4.0, 2.0)
    sessions = scored.group.sessions
    assert [(s.num_dropped_branches, s.num_side_leaves) for s in sessions] == [(2, 1), (2, 1)]


async def test_all_leaves_exports_every_leaf_for_custom_credit(tiny_model_dir: Path, tmp_path: Path) -> None:
    result, _ = await _run(tiny_model_dir, tmp_path, "all-leaves", custom="per_leaf")
    [scored] = result.groups
    assert [s.name for s in scored.samples] == ["leaf-0", "leaf-1", "leaf-2", "leaf-3"] * 2
    assert [s.advantage for s in scored.scored] == [0.0, 0.0, 1.0, 0.0] * 2


def _parse(tmp_path: Path, *flags: str):
    import argparse

    from relaxtrio.cli.train_config import train_config

    from relaxtrio.cli.train_flags import add_train_parser

    data = tmp_path / "tasks.jsonl"
    data.write_text('{"input": [{"role": "user", "content": "x"}]}\n')
    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers(dest="command"))
    return train_config(parser.parse_args(["train", "--prompt-data", str(data), "--agent-cwd", str(tmp_path),
                                           "--agent-command", "true", *flags]))


def test_the_flag_reaches_the_agent_config(tmp_path: Path) -> None:
    assert _parse(tmp_path).agent.export_policy == "strict"
    assert _parse(tmp_path, "--agentic-export-policy", "final").agent.export_policy == "final"
    with pytest.raises(ConfigError, match="needs --agentic-custom-advantage-path"):
        _parse(tmp_path, "--agentic-export-policy", "all-leaves")
    config = _parse(tmp_path, "--agentic-export-policy", "all-leaves",
                    "--agentic-custom-advantage-path", "tests.support.credit.per_leaf",
                    "--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096")
    assert config.agent.export_policy == "all-leaves"
    with pytest.raises(ConfigError, match="--agentic-export-policy must be one of"):
        AgentConfig(command="true", cwd=tmp_path, export_policy="newest")  # type: ignore[arg-type]
