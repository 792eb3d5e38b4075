"""The sharded trainer: 2 FSDP2 ranks (local processes, gloo) against one process on the whole batch."""

from __future__ import annotations

import math
import os
import random
import signal
import time
from pathlib import Path

import attrs
import pytest
import torch
from safetensors.torch import load_file
from train_helpers import make_samples, with_rollout_logprobs

from relaxtrio import TrainerRankError
from relaxtrio.config import DistributedConfig, TrainConfig
from relaxtrio.train import Trainer
from relaxtrio.train.checkpoint import read_run_state
from relaxtrio.train.distributed import OPTIMIZER_DCP_DIR, split_by_tokens
from relaxtrio.train.ranks import LocalRankGroup, RankStart

# Loss aggregations the trainer offers; the sharded step must match one process for each.
AGGREGATIONS = ["token_mean"] + (
    ["sequence_mean"] if "loss_aggregation" in attrs.fields_dict(TrainConfig) else []
)


def _config(aggregation: str, **fields: object) -> TrainConfig:
    extra = {} if aggregation == "token_mean" else {"loss_aggregation": aggregation}
    # A larger lr than the default so the update is far above the 1e-5 tolerance.
    return TrainConfig(lr=1e-4, micro_batch_size=2, seed=3, **extra, **fields)  # type: ignore[arg-type]


def _batch(model_dir: Path) -> tuple[list, list[float]]:
    samples = make_samples(10, seed=7, min_len=5, max_len=24)
    logprobs = Trainer.from_pretrained(model_dir, TrainConfig()).compute_logprobs(samples)
    samples = with_rollout_logprobs(samples, logprobs, offset=-0.05)
    rng = random.Random(1)
    return samples, [rng.uniform(-1.0, 1.0) for _ in samples]


def test_split_by_tokens_balances_and_covers() -> None:
    lengths = [9, 3, 7, 1, 5, 5]
    shares = split_by_tokens(range(6), lengths, 2)
    assert sorted(shares[0] + shares[1]) == list(range(6))
    assert [sum(lengths[i] for i in s) for s in shares] == [15, 15]
    assert all(s == sorted(s) for s in shares)  # each share keeps the batch order
    assert split_by_tokens([4], lengths, 3) == [[4], [], []]


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("num_minibatches", [1, 2])
def test_two_ranks_equal_one_process(
    tiny_llama_dir: Path, tmp_path: Path, aggregation: str, num_minibatches: int
) -> None:
    samples, advantages = _batch(tiny_llama_dir)
    cfg = _config(aggregation, num_minibatches=num_minibatches)
    single = Trainer.from_pretrained(tiny_llama_dir, cfg)
    want = single.train_step(samples, advantages)
    want_weights = {k: v.detach().clone() for k, v in single.model.state_dict().items()}

    dist = DistributedConfig(actor_num_gpus_per_node=2, collective_timeout_s=60.0, start_timeout_s=300.0)
    with LocalRankGroup.start(RankStart(model_dir=tiny_llama_dir, config=cfg), dist) as group:
        got = group.train_step(samples, advantages)
        group.save_weights(tmp_path / "w")

    assert got.num_optimizer_steps == want.num_optimizer_steps == num_minibatches
    assert got.num_tokens == want.num_tokens and got.num_samples == want.num_samples
    assert math.isclose(got.loss, want.loss, rel_tol=1e-5, abs_tol=1e-7)
    assert math.isclose(got.grad_norm, want.grad_norm, rel_tol=1e-5)
    assert math.isclose(got.rollout_logprob_abs_diff, want.rollout_logprob_abs_diff, rel_tol=1e-5)
    saved = load_file(tmp_path / "w" / "model.safetensors")
    initial = load_file(tiny_llama_dir / "model.safetensors")
    assert set(saved) == set(initial)  # the tied LM head is written once, as one process writes it
    for name, tensor in saved.items():
        torch.testing.assert_close(tensor, want_weights[name], rtol=0, atol=1e-5, msg=name)
    moved = max(float((want_weights[n] - initial[n]).abs().max()) for n in initial)
    assert moved > 1e-4  # the step really moved the weights (so 1e-5 is a real tolerance)


@pytest.mark.slow
def test_killed_rank_fails_the_step_naming_it(tiny_llama_dir: Path) -> None:
    samples, advantages = _batch(tiny_llama_dir)
    timeout_s = 30.0
    dist = DistributedConfig(actor_num_gpus_per_node=2, collective_timeout_s=timeout_s, start_timeout_s=300.0)
    group = LocalRankGroup.start(RankStart(model_dir=tiny_llama_dir, config=_config("token_mean")), dist)
    try:
        victim = group.processes[1]
        os.kill(victim.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(TrainerRankError, match=r"trainer rank 1 on node \S+ died") as info:
            group.train_step(samples, advantages)
        assert time.monotonic() - start < timeout_s
        assert info.value.rank == 1
        assert all(not p.is_alive() for p in group.processes)  # the group closed itself
    finally:
        group.close()


@pytest.mark.slow
def test_sharded_run_checkpoint_resumes_like_one_process(tiny_llama_dir: Path, tmp_path: Path) -> None:
    samples, advantages = _batch(tiny_llama_dir)
    cfg = _config("token_mean")
    single = Trainer.from_pretrained(tiny_llama_dir, cfg)
    for _ in range(2):
        single.train_step(samples, advantages)
    dist = DistributedConfig(actor_num_gpus_per_node=2, collective_timeout_s=60.0, start_timeout_s=300.0)
    with LocalRankGroup.start(RankStart(model_dir=tiny_llama_dir, config=cfg), dist) as group:
        group.train_step(samples, advantages)
        ckpt = group.save_run_checkpoint(tmp_path / "save", 1, state={"note": "x"}, tokenizer_dir=None, keep=2)
    assert (ckpt / OPTIMIZER_DCP_DIR).is_dir() and not (ckpt / "optimizer.pt").exists()
    assert not list((tmp_path / "save").glob(".optimizer-*"))  # the staged shards moved in
    state = read_run_state(ckpt)
    assert state["note"] == "x" and state["trainer"]["num_optimizer_steps"] == 1
    resumed = RankStart(model_dir=ckpt, config=cfg, resume_state=state["trainer"])
    with LocalRankGroup.start(resumed, dist) as group:
        stats = group.train_step(samples, advantages)
        group.save_weights(tmp_path / "w")
    assert stats.num_optimizer_steps == 1
    want = single.model.state_dict()
    for name, tensor in load_file(tmp_path / "w" / "model.safetensors").items():
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=1e-5, msg=name)
