"""What one step of a run writes, through the driver from the command line: the eval's debug dump
that ``--save-debug-rollout-data`` names, and the step's metrics row.

The whole ``rollout`` job runs in this process (:func:`relaxtrio.run.driver.run_training`): a
scripted engine served over SGLang's native API, the real agent API, and in-process agents (the
``launcher`` of :class:`~relaxtrio.config.AgentConfig`), so no process is started.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from relaxtrio.cli.train_config import train_config
from relaxtrio.cli.train_flags import add_train_parser
from relaxtrio.models import load_tokenizer
from relaxtrio.nursery.agent import AgentRun
from relaxtrio.rollout.dumps import load_dump
from relaxtrio.run.driver import run_training
from relaxtrio.testing.scripted_server import Rule, rules_engine, serve_scripted_engine


def one_turn_agent(modes: list[str], extra: dict[str, Any] | None = None):
    """A launcher: one chat turn (with ``extra`` fields in the request), then reward 1.
    Records each agent's rollout mode."""

    async def launch(agent, env, payload, budget, **_: object) -> AgentRun:
        modes.append(env.mode)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **(extra or {})}
        async with httpx.AsyncClient(timeout=30) as client:
            reply = await client.post(env.base_url.rstrip("/") + "/v1/chat/completions",
                                      headers={"Authorization": f"Bearer {env.session_id}"}, json=body)
            reply.raise_for_status()
        return AgentRun(return_code=0, output_text=json.dumps({"reward": 1.0}), log_tail="", active_s=0.0)

    return launch


async def run_rollout(model_dir: Path, tmp_path: Path, launcher: Any, *flags: str) -> list[dict[str, Any]]:
    """Runs ``python -m relaxtrio rollout`` for one step (one Group of one Session) on a scripted
    engine with ``launcher`` as the agent; returns the rows of metrics.jsonl."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"task {i}"}) + "\n" for i in range(2)))
    out = tmp_path / "run"
    tokenizer = load_tokenizer(model_dir)
    engine = rules_engine(tokenizer, tokenizer.eos_token_id, [Rule(match=".", reply="fine")])
    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers(dest="command"), name="rollout")
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_scripted_engine, engine)
            args = parser.parse_args([
                "rollout", "--agent-cwd", str(tmp_path), "--agent-command", "true",
                "--prompt-data", str(data), "--hf-checkpoint", str(model_dir), "--engine-url", url,
                "--output-dir", str(out), "--num-rollout", "1", "--n-samples-per-prompt", "1",
                "--rollout-batch-size", "1", "--no-rollout-shuffle", "--rollout-max-response-len", "8",
                *flags])
            cfg = train_config(args)
            await run_training(attrs.evolve(cfg, agent=attrs.evolve(cfg.agent, launcher=launcher)))
            nursery.cancel_scope.cancel()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


async def test_save_debug_rollout_data_dumps_the_eval_as_eval_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    modes: list[str] = []
    eval_data = tmp_path / "eval.jsonl"
    eval_data.write_text(json.dumps({"input": "eval task"}) + "\n")
    template = str(tmp_path / "dumps" / "r_{rollout_id}.json")
    [row] = await run_rollout(tiny_model_dir, tmp_path, one_turn_agent(modes),
                              "--save-debug-rollout-data", template, "--eval-prompt-data", "e", str(eval_data),
                              "--eval-interval", "1", "--n-samples-per-eval-prompt", "2")
    assert modes == ["train", "eval", "eval"]
    assert row["eval/e/num_samples"] == 2
    assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == ["r_0.json", "r_eval_0.json"]
    dump = load_dump(tmp_path / "dumps" / "r_eval_0.json")
    assert dump.rollout_id == "eval_0" and len(dump.samples) == 2
    assert [g["mode"] for g in dump.groups] == ["eval"]
    assert dump.data["eval"]["e"]["metrics"]["eval/e/num_samples"] == 2


async def test_an_ignored_request_field_is_counted_in_the_steps_metrics_row(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    modes: list[str] = []
    [row] = await run_rollout(tiny_model_dir, tmp_path / "ignored", one_turn_agent(modes, {"n": 2}))
    [plain] = await run_rollout(tiny_model_dir, tmp_path / "plain", one_turn_agent(modes))
    assert modes == ["train", "train"] and row["num_samples"] == plain["num_samples"] == 1
    assert row["ignored_request_fields"] == 1 and plain["ignored_request_fields"] == 0
