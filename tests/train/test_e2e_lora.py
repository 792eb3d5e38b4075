"""A LoRA step reaches the engine: after the push, rollouts are sampled from base + adapter.

A bug to guard against: pushing only the base weights (or nothing) leaves the engine serving the
base model while the trainer's ratio assumes the adapted one.
"""

from __future__ import annotations

from pathlib import Path

import trio

from relaxtrio.engine.server import EngineConfig, serve_engine
from relaxtrio.sglang.client import SamplingParams, open_engine_client
from relaxtrio.testing.scored import scored_samples
from relaxtrio.train import TrainConfig, Trainer


class _Sample:
    def __init__(self, prompt, output_ids, output_logprobs) -> None:
        self.token_ids = tuple(prompt) + tuple(output_ids)
        self.loss_mask = (0,) * len(prompt) + (1,) * len(output_ids)
        self.rollout_logprobs = (0.0,) * len(prompt) + tuple(output_logprobs)


async def test_engine_serves_base_plus_adapter_after_each_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    prompt = [1, 20, 30, 40, 50, 60]
    params = SamplingParams(max_new_tokens=10, temperature=0.8, ignore_eos=True, sampling_seed=5)
    trainer = Trainer.from_pretrained(tiny_model_dir, TrainConfig(lr=5e-2, lora_rank=4, temperature=0.8))
    base = Trainer.from_pretrained(tiny_model_dir, TrainConfig(temperature=0.8))
    with trio.fail_after(180):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_engine, EngineConfig(model_path=tiny_model_dir))
            async with open_engine_client(url) as client:
                for step in range(2):
                    reply = await client.generate(prompt, params, rid=f"lora-{step}#")
                    sample = _Sample(prompt, reply.output_ids, reply.output_logprobs)
                    stats = trainer.train_step(scored_samples([sample], [1.0]))
                    # the rollout came from what the trainer held before this update
                    assert stats.rollout_logprob_abs_diff < 1e-4, (step, stats.rollout_logprob_abs_diff)
                    weights = trainer.save_weights(tmp_path / "weights")
                    await client.update_weights_from_disk(str(weights), weight_version=f"step-{step + 1}")
                after = await client.generate(prompt, params, rid="lora-after#")
            nursery.cancel_scope.cancel()
    check = _Sample(prompt, after.output_ids, after.output_logprobs)
    adapted = trainer.compute_logprobs([check])[0][len(prompt):]
    bare = base.compute_logprobs([check])[0][len(prompt):]
    assert max(abs(a - b) for a, b in zip(after.output_logprobs, adapted, strict=True)) < 1e-4
    assert max(abs(a - b) for a, b in zip(after.output_logprobs, bare, strict=True)) > 1e-2  # not the base
