"""The trainer computes its logprobs at the rollout temperature (SGLang's convention).

The engine reports ``log_softmax(logits / T)`` for a rollout sampled at temperature ``T``; the
trainer's old, current and reference logprobs must describe the same distribution, else the PPO
ratio, every KL and every importance weight compare two different policies.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from relaxtrio.config import AgentConfig, GenerationConfig, TrainRunConfig
from relaxtrio.engine.server import EngineConfig, serve_engine
from relaxtrio.sglang.client import SamplingParams, open_engine_client
from relaxtrio.testing.scored import scored_samples
from relaxtrio.train import TrainConfig, Trainer

TEMPERATURES = (0.0, 0.5, 0.7, 1.0, 1.6)


class _Sample:
    def __init__(self, prompt: list[int], output_ids, output_logprobs) -> None:
        self.token_ids = tuple(prompt) + tuple(output_ids)
        self.loss_mask = (0,) * len(prompt) + (1,) * len(output_ids)
        self.rollout_logprobs = (0.0,) * len(prompt) + tuple(output_logprobs)


async def _rollouts(model_dir: Path) -> dict[float, list[_Sample]]:
    prompts = [[1, 20, 30, 40, 50, 60], [1, 7, 9, 11], [1, 99, 3, 3, 42, 17, 8]]
    out: dict[float, list[_Sample]] = {}
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_engine, EngineConfig(model_path=model_dir))
            async with open_engine_client(url) as client:
                for temperature in TEMPERATURES:
                    params = SamplingParams(max_new_tokens=12, temperature=temperature,
                                            ignore_eos=True, sampling_seed=3)
                    out[temperature] = []
                    for i, prompt in enumerate(prompts):
                        reply = await client.generate(prompt, params, rid=f"t{temperature}-{i}#")
                        out[temperature].append(
                            _Sample(prompt, reply.output_ids, reply.output_logprobs))
            nursery.cancel_scope.cancel()
    return out


async def test_trainer_logprobs_match_the_engine_at_every_temperature(tiny_model_dir: Path) -> None:
    rollouts = await _rollouts(tiny_model_dir)
    for temperature, samples in rollouts.items():
        trainer = Trainer.from_pretrained(tiny_model_dir, TrainConfig(temperature=temperature))
        stats = trainer.train_step(scored_samples(samples, [1.0, -1.0, 0.5]))
        assert stats.rollout_logprob_abs_diff < 1e-4, (temperature, stats.rollout_logprob_abs_diff)
        assert stats.rollout_logprob_abs_diff_max < 1e-3, temperature
        # Before the fix every trainer logprob was taken at temperature 1: a real gap at T != 1.
        untempered = Trainer.from_pretrained(tiny_model_dir, TrainConfig(temperature=1.0))
        gap = untempered.train_step(scored_samples(samples, [1.0, -1.0, 0.5])).rollout_logprob_abs_diff
        if temperature in (0.0, 1.0):  # greedy logprobs are reported at temperature 1
            assert gap < 1e-4
        else:
            assert gap > 0.05, (temperature, gap)


def test_run_config_hands_the_rollout_temperature_to_the_trainer(tmp_path: Path) -> None:
    data = tmp_path / "p.jsonl"
    data.write_text('{"input": "x"}\n')
    cfg = TrainRunConfig(prompt_data=data, agent=AgentConfig(command="true", cwd=tmp_path),
                         generation=GenerationConfig(temperature=0.7),
                         train=TrainConfig(lr=1e-3))
    assert cfg.trainer_config.temperature == 0.7
    assert cfg.trainer_config.lr == 1e-3


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_negative_or_non_finite_temperature_is_rejected(bad: float) -> None:
    with pytest.raises(ValueError, match="temperature"):
        TrainConfig(temperature=bad)
