"""Training wired to the engine: weight pushes change what the engine samples; the driver runs."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
import torch
import trio
from tests.support.agents import write_httpx_agent

from relaxtrio.config import (
    AgentConfig,
    FleetConfig,
    GenerationConfig,
    RolloutConfig,
    TrainRunConfig,
)
from relaxtrio.run.driver import run_training
from relaxtrio.engine.server import EngineConfig, serve_engine
from relaxtrio.models import load_model
from relaxtrio.sglang.client import SamplingParams, open_engine_client
from relaxtrio.testing.scored import scored_samples
from relaxtrio.train import TrainConfig, Trainer

pytestmark = pytest.mark.slow  # starts real processes


class _Sample:
    def __init__(self, token_ids, prompt_length, rollout_logprobs):
        self.token_ids = tuple(token_ids)
        self.loss_mask = tuple(0 if t < prompt_length else 1 for t in range(len(token_ids)))
        self.rollout_logprobs = tuple(rollout_logprobs)


async def test_weight_update_reaches_the_engine(tiny_model_dir: Path, tmp_path: Path) -> None:
    prompt = [1, 20, 30, 40, 50, 60]
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_engine, EngineConfig(model_path=tiny_model_dir))
            async with open_engine_client(url) as client:
                before = await client.generate(prompt, greedy, rid="before#")
                trainer = Trainer.from_pretrained(tiny_model_dir, TrainConfig(lr=5e-2))
                sample = _Sample(prompt + list(before.output_ids), len(prompt),
                                 [0.0] * len(prompt) + list(before.output_logprobs))
                stats = trainer.train_step(scored_samples([sample], [1.0]))
                assert stats.rollout_logprob_abs_diff < 1e-4  # engine and trainer agree before
                assert torch.isfinite(torch.tensor(stats.loss))
                weights = trainer.save_weights(tmp_path / "weights")
                await client.update_weights_from_disk(str(weights), weight_version="step-1")
                after = await client.generate(prompt + list(before.output_ids)[:0], greedy, rid="after#")
            nursery.cancel_scope.cancel()
    assert after.weight_version == "step-1"
    assert [s.version for s in after.weight_versions] == ["step-1"]
    assert before.output_logprobs != after.output_logprobs
    # The engine now computes exactly what the trainer's updated model computes.
    trained = trainer.compute_logprobs([_Sample(prompt + list(after.output_ids), len(prompt),
                                                [0.0] * (len(prompt) + len(after.output_ids)))])[0]
    assert max(abs(a - b) for a, b in zip(after.output_logprobs, trained[len(prompt):], strict=True)) < 1e-4
    assert load_model(weights) is not None


def _run_config(tmp_path: Path, tiny_model_dir: Path) -> TrainRunConfig:
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    cmd = write_httpx_agent(agent_dir)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"question {i}", "metadata": {"id": i}}) + "\n"
                            for i in range(5)))
    return TrainRunConfig(
        prompt_data=data,
        num_rollout=2,
        rollout=RolloutConfig(n_samples_per_prompt=3, rollout_batch_size=2, show_progress=False),
        generation=GenerationConfig(max_response_tokens=10, seed=7),
        agent=AgentConfig(command=f"{cmd} ok", cwd=agent_dir, timeout_s=120,
                          env={"AGENT_TURNS": "2", "AGENT_REWARD": "random"}),
        train=TrainConfig(lr=2e-2),
        hf_checkpoint=tiny_model_dir,
        output_dir=tmp_path / "run",
    )


async def test_driver_trains_through_agents_with_the_tiny_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = _run_config(tmp_path, tiny_model_dir)
    with trio.fail_after(300):
        summary = await run_training(config)
    rows = [json.loads(line) for line in summary.metrics_path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for row in rows:
        assert row["num_groups"] == 2 and row["num_samples"] == 6 and row["dropped_groups"] == 0
        assert row["turns_mean"] == 2
        assert row["loss"] is not None and row["clip_fraction"] is not None
        # lr 2e-2 moves the weights a lot: step 1 agrees with the trainer only if the update
        # reached the engine before step 1's rollout.
        assert row["rollout_logprob_abs_diff"] < 1e-3, row
    assert summary.plot_path.stat().st_size > 1000
    assert (summary.checkpoint_dir / "model.safetensors").exists()
    assert (summary.checkpoint_dir / "tokenizer.json").exists()
    load_model(summary.checkpoint_dir)


@pytest.mark.parametrize("weight_sync", ["shm", "disk"])
async def test_driver_pushes_a_lora_policy_merged(tiny_model_dir: Path, tmp_path: Path, weight_sync: str) -> None:
    """With ``--lora-rank`` the engines load base + adapter merged, through either store (the
    push used to hand them the peft model's own state dict: HTTP 400, unknown tensors)."""
    base = _run_config(tmp_path, tiny_model_dir)
    config = attrs.evolve(base, train=TrainConfig(lr=5e-2, lora_rank=4),
                          fleet=FleetConfig(weight_sync=weight_sync))
    with trio.fail_after(300):
        summary = await run_training(config)
    rows = [json.loads(line) for line in summary.metrics_path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and all(r["dropped_groups"] == 0 for r in rows)
    # step 1 was sampled from what the trainer held after step 0: base + the moved adapter
    assert rows[1]["rollout_logprob_abs_diff"] < 1e-3, rows[1]
    trained, initial = load_model(summary.checkpoint_dir), load_model(tiny_model_dir)
    moved = [n for n, p in trained.state_dict().items() if not torch.equal(p, initial.state_dict()[n])]
    assert moved and all("lora" not in n for n in moved)
