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
from tests.train.train_helpers import make_samples, with_rollout_logprobs

from relaxtrio import ConfigError, TrainerRankError
from relaxtrio.config import AgentConfig, DistributedConfig, TrainConfig, TrainRunConfig
from relaxtrio.run.checkpoint import RunCheckpointer
from relaxtrio.testing.scored import scored_samples
from relaxtrio.train import Trainer
from relaxtrio.train.checkpoint import read_run_state
from relaxtrio.train.distributed import OPTIMIZER_DCP_DIR, split_by_tokens
from relaxtrio.train.optim_state import named_optimizer_state
from relaxtrio.train.ranks import LocalRankGroup, RankGroup, RankStart

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
    want = single.train_step(scored_samples(samples, advantages))
    want_weights = {k: v.detach().clone() for k, v in single.model.state_dict().items()}

    dist = DistributedConfig(actor_num_gpus_per_node=2, collective_timeout_s=60.0, start_timeout_s=300.0)
    with LocalRankGroup.start(RankStart(model_dir=tiny_llama_dir, config=cfg), dist) as group:
        got = group.train_step(scored_samples(samples, advantages))
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
            group.train_step(scored_samples(samples, advantages))
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
        single.train_step(scored_samples(samples, advantages))
    dist = DistributedConfig(actor_num_gpus_per_node=2, collective_timeout_s=60.0, start_timeout_s=300.0)
    with LocalRankGroup.start(RankStart(model_dir=tiny_llama_dir, config=cfg), dist) as group:
        group.train_step(scored_samples(samples, advantages))
        ckpt = group.save_run_checkpoint(tmp_path / "save", 1, state={"note": "x"}, tokenizer_dir=None, keep=2)
    assert (ckpt / OPTIMIZER_DCP_DIR).is_dir() and not (ckpt / "optimizer.pt").exists()
    assert not list((tmp_path / "save").glob(".optimizer-*"))  # the staged shards moved in
    state = read_run_state(ckpt)
    assert state["note"] == "x" and state["trainer"]["num_optimizer_steps"] == 1
    resumed = RankStart(model_dir=ckpt, config=cfg, resume_state=state["trainer"])
    with LocalRankGroup.start(resumed, dist) as group:
        stats = group.train_step(scored_samples(samples, advantages))
        group.save_weights(tmp_path / "w")
    assert stats.num_optimizer_steps == 1
    want = single.model.state_dict()
    for name, tensor in load_file(tmp_path / "w" / "model.safetensors").items():
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=1e-5, msg=name)


DIST = DistributedConfig(actor_num_gpus_per_node=2, collective_timeout_s=60.0, start_timeout_s=300.0)
# With the KL loss the tests take larger steps (lr 3e-3), so the policy moves far from the KL
# reference: kl_loss is about 5e-4 on the first step (0 on its first minibatch), 2e-2 on the second.
KL = {"use_kl_loss": True, "kl_loss_coef": 0.5, "kl_loss_type": "k3"}


def _assert_close_stats(got, want) -> None:
    for name in ("loss", "kl_loss", "grad_norm", "rollout_logprob_abs_diff"):
        assert math.isclose(getattr(got, name), getattr(want, name), rel_tol=1e-5, abs_tol=1e-7), name


def _assert_weights(path: Path, want: dict[str, torch.Tensor]) -> None:
    saved = load_file(path)
    assert saved and set(saved) <= set(want)
    for name, tensor in saved.items():
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.slow
def test_two_ranks_with_lora_equal_one_process(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """FSDP2 over the peft model: only the adapter trains, the pushed weights are base + adapter
    merged, and the run checkpoint holds the adapter files, each as one process writes them."""
    samples, advantages = _batch(tiny_llama_dir)
    cfg = _config("token_mean", num_minibatches=2, lora_rank=4, **KL)
    cfg = attrs.evolve(cfg, lr=2e-2)  # LoRA's B starts at 0: a larger step moves the merged weights
    single = Trainer.from_pretrained(tiny_llama_dir, cfg)
    want = single.train_step(scored_samples(samples, advantages))
    single.save_weights(tmp_path / "w1")
    single.save_run_checkpoint(tmp_path / "s1", 1, state={}, tokenizer_dir=None, keep=1)
    with LocalRankGroup.start(RankStart(model_dir=tiny_llama_dir, config=cfg), DIST) as group:
        got = group.train_step(scored_samples(samples, advantages))
        group.save_weights(tmp_path / "w2")
        ckpt = group.save_run_checkpoint(tmp_path / "s2", 1, state={}, tokenizer_dir=None, keep=1)
    _assert_close_stats(got, want)
    merged = load_file(tmp_path / "w1" / "model.safetensors")
    _assert_weights(tmp_path / "w2" / "model.safetensors", merged)
    initial = load_file(tiny_llama_dir / "model.safetensors")
    assert set(merged) == set(initial)
    assert max(float((merged[n] - initial[n]).abs().max()) for n in initial) > 1e-4
    adapter = load_file(tmp_path / "s1" / "iter_0000001" / "adapter_model.safetensors")
    assert adapter and all("lora_" in n for n in adapter)
    _assert_weights(ckpt / "adapter_model.safetensors", adapter)
    assert set(load_file(ckpt / "adapter_model.safetensors")) == set(adapter)


def _resume(tmp_path: Path, model_dir: Path, cfg: TrainConfig, save_dir: Path, world: int) -> Trainer | RankGroup:
    """The trainer ``--load save_dir`` gives the driver with ``world`` ranks."""
    run = TrainRunConfig(prompt_data=tmp_path / "p.jsonl", agent=AgentConfig(command="true", cwd=tmp_path),
                         train=cfg, load_dir=save_dir, output_dir=tmp_path / "out",
                         distributed=attrs.evolve(DIST, actor_num_gpus_per_node=world))
    assert run.trainer_config == cfg
    checkpointer = RunCheckpointer.open(run)
    assert checkpointer.resume is not None
    return checkpointer.load_trainer(model_dir)


@pytest.mark.slow
def test_resume_across_world_sizes(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """One process -> 2 ranks -> one process equals three uninterrupted steps in one process.

    Step 1 in one process writes ``optimizer.pt``; ``--load`` with 2 ranks resumes it for step 2
    and writes ``optimizer.dcp/``; ``--load`` in one process resumes that for step 3. Two
    minibatches (the shuffling RNG and AdamW's moments matter) and the KL loss: step 2 is also
    the equality test of the sharded KL reference (it must stay the initial policy, not the
    checkpoint's weights), with a KL term far above the tolerance.
    """
    samples, advantages = _batch(tiny_llama_dir)
    cfg = attrs.evolve(_config("token_mean", num_minibatches=2, **KL), lr=3e-3)
    straight = Trainer.from_pretrained(tiny_llama_dir, cfg)
    want = [straight.train_step(scored_samples(samples, advantages)) for _ in range(2)]
    after_two = {k: v.detach().clone() for k, v in straight.model.state_dict().items()}
    want.append(straight.train_step(scored_samples(samples, advantages)))
    save_dir = tmp_path / "save"

    first = Trainer.from_pretrained(tiny_llama_dir, cfg)
    first.train_step(scored_samples(samples, advantages))
    first.save_run_checkpoint(save_dir, 1, state={}, tokenizer_dir=None, keep=2)
    group = _resume(tmp_path, tiny_llama_dir, cfg, save_dir, 2)
    with group:
        assert isinstance(group, RankGroup)
        second = group.train_step(scored_samples(samples, advantages))
        ckpt2 = group.save_run_checkpoint(save_dir, 2, state={}, tokenizer_dir=None, keep=2)
    assert second.kl_loss > 1e-3
    _assert_close_stats(second, want[1])
    _assert_weights(ckpt2 / "model.safetensors", after_two)
    assert (ckpt2 / OPTIMIZER_DCP_DIR).is_dir() and not (ckpt2 / "optimizer.pt").exists()

    third = _resume(tmp_path, tiny_llama_dir, cfg, save_dir, 1)
    assert isinstance(third, Trainer) and third.num_optimizer_steps == 4
    _assert_close_stats(third.train_step(scored_samples(samples, advantages)), want[2])
    assert third.num_optimizer_steps == straight.num_optimizer_steps == 6
    want_weights = straight.model.state_dict()
    for name, tensor in third.model.state_dict().items():
        torch.testing.assert_close(tensor, want_weights[name], rtol=0, atol=1e-5, msg=name)


def test_one_process_optimizer_state_of_another_model_is_refused(tmp_path: Path) -> None:
    state = {"state": {0: {"exp_avg": torch.zeros(3)}}, "param_groups": [{"params": [0], "lr": 1.0}]}
    named = named_optimizer_state(state, ["w"], {"w": torch.Size([3])}, tmp_path)
    assert list(named["state"]) == ["w"] and torch.equal(named["state"]["w"]["exp_avg"], torch.zeros(3))
    assert named["param_groups"] == [{"params": ["w"], "lr": 1.0}]
    with pytest.raises(ConfigError, match="holds 1 parameters, the model trains 2") as info:
        named_optimizer_state(state, ["w", "v"], {}, tmp_path)
    assert info.value.param == "load"
    with pytest.raises(ConfigError, match=r"exp_avg of w has shape \(3,\), the parameter \(4,\)"):
        named_optimizer_state(state, ["w"], {"w": torch.Size([4])}, tmp_path)
