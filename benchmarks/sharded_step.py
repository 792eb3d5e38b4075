"""Wall time of one train step: one process vs W local FSDP2 ranks (gloo), and start-up costs.

Builds a random Llama (``--hidden`` x ``--layers``, vocab 2048), a batch of ``--samples`` samples
of 64-192 tokens, and times ``train_step`` (after one warm-up step) in one process and through a
:class:`~relaxtrio.train.ranks.LocalRankGroup` of ``--ranks`` processes; with ``--ray`` also the
start-up of a local Ray instance (``ray.init(num_cpus=...)``) and of the same ranks as Ray
actors. Prints one JSON line:

    {"bench": "sharded_step", "step_s_1": ..., "step_s_w": ..., "ranks": 2, "ranks_start_s": ...,
     "ray_start_s": ..., "ray_ranks_start_s": ..., "step_s_ray": ...}

Usage: ``python benchmarks/sharded_step.py [--ranks 2] [--samples 16] [--ray]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from relaxtrio.config import DistributedConfig, TrainConfig
from relaxtrio.testing.scored import scored_samples
from relaxtrio.train import Trainer
from relaxtrio.train.ranks import LocalRankGroup, RankStart


def _model(out: Path, hidden: int, layers: int) -> Path:
    config = LlamaConfig(vocab_size=2048, hidden_size=hidden, intermediate_size=hidden * 3,
                         num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=512, tie_word_embeddings=True, pad_token_id=0)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    return out


def _batch(n: int) -> tuple[list[SimpleNamespace], list[float]]:
    rng = random.Random(0)
    samples = []
    for _ in range(n):
        length = rng.randint(64, 192)
        prompt = length // 3
        samples.append(SimpleNamespace(token_ids=tuple(rng.randrange(1, 2048) for _ in range(length)),
                                       loss_mask=tuple([0] * prompt + [1] * (length - prompt)),
                                       rollout_logprobs=tuple([0.0] * length)))
    return samples, [rng.uniform(-1, 1) for _ in samples]


def _timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--ray", action="store_true")
    args = p.parse_args()
    cfg = TrainConfig(micro_batch_size=4)
    samples, advantages = _batch(args.samples)
    scored = scored_samples(samples, advantages)
    out: dict[str, object] = {"bench": "sharded_step", "ranks": args.ranks, "samples": args.samples,
                              "cpus": os.cpu_count(), "threads_1": torch.get_num_threads()}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = _model(Path(tmp) / "m", args.hidden, args.layers)
        single = Trainer.from_pretrained(model_dir, cfg)
        single.train_step(scored)  # warm-up
        out["step_s_1"] = round(_timed(single.train_step, scored), 3)
        dist = DistributedConfig(actor_num_gpus_per_node=args.ranks)
        start = time.perf_counter()
        with LocalRankGroup.start(RankStart(model_dir=model_dir, config=cfg), dist) as group:
            out["ranks_start_s"] = round(time.perf_counter() - start, 2)
            group.train_step(scored)
            out["step_s_w"] = round(_timed(group.train_step, scored), 3)
        if args.ray:
            import ray

            from relaxtrio.cluster.trainer import RayRankGroup

            start = time.perf_counter()
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
            out["ray_start_s"] = round(time.perf_counter() - start, 2)
            try:
                start = time.perf_counter()
                ray_dist = DistributedConfig(actor_num_gpus_per_node=args.ranks, ray_address="auto")
                group = RayRankGroup.start(RankStart(model_dir=model_dir, config=cfg), ray_dist, cpus_per_rank=0.5)
                out["ray_ranks_start_s"] = round(time.perf_counter() - start, 2)
                try:
                    group.train_step(scored)
                    out["step_s_ray"] = round(_timed(group.train_step, scored), 3)
                finally:
                    group.close()
            finally:
                ray.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
