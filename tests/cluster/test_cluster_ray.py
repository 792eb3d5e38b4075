"""Placement on a local Ray instance: trainer ranks as actors, agents through the Ray executor.

One Ray start serves the whole module (``conftest.py``'s module-scoped ``ray_cluster``); after
it stops, no Ray actor or process of ours may be left.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import trio
from safetensors.torch import load_file
from tests.support.agents import write_httpx_agent
from tests.support.pipeline import open_test_pipeline, prompts
from tests.support.procs import PidPipe, alive
from tests.support.ray_state import live_actors

from relaxtrio import TrainerRankError
from relaxtrio.config import (
    AgentConfig,
    DistributedConfig,
    FleetConfig,
    GenerationConfig,
    RolloutConfig,
    TrainConfig,
    TrainRunConfig,
)
from relaxtrio.run.driver import run_training
from relaxtrio.testing.scored import scored_samples
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine
from relaxtrio.train import Trainer
from relaxtrio.train.ranks import RankStart

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


def _samples(n: int) -> tuple[list[SimpleNamespace], list[float]]:
    import random

    rng = random.Random(5)
    out = []
    for _ in range(n):
        length = rng.randint(6, 20)
        prompt = rng.randint(2, length - 2)
        out.append(SimpleNamespace(token_ids=tuple(rng.randrange(2, 100) for _ in range(length)),
                                   loss_mask=tuple([0] * prompt + [1] * (length - prompt)),
                                   rollout_logprobs=tuple([0.0] * length)))
    return out, [rng.uniform(-1, 1) for _ in out]


def test_ray_trainer_ranks_equal_one_process_and_name_a_lost_rank(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from relaxtrio.cluster.trainer import RayRankGroup

    samples, advantages = _samples(8)
    cfg = TrainConfig(lr=1e-4, micro_batch_size=2)
    single = Trainer.from_pretrained(tiny_model_dir, cfg)
    want = single.train_step(scored_samples(samples, advantages))
    dist = DistributedConfig(actor_num_gpus_per_node=2, ray_address="auto", collective_timeout_s=30.0,
                             start_timeout_s=300.0)
    group = RayRankGroup.start(RankStart(model_dir=tiny_model_dir, config=cfg), dist)
    try:
        got = group.train_step(scored_samples(samples, advantages))
        group.save_weights(tmp_path / "w")
        assert math.isclose(got.loss, want.loss, rel_tol=1e-5, abs_tol=1e-7)
        saved = load_file(tmp_path / "w" / "model.safetensors")
        for name, tensor in saved.items():
            torch.testing.assert_close(tensor, single.model.state_dict()[name], rtol=0, atol=1e-5)
        ray.kill(group._actors[1])
        start = time.monotonic()
        with pytest.raises(TrainerRankError, match="trainer rank 1 on node .* died") as info:
            group.train_step(scored_samples(samples, advantages))
        assert info.value.rank == 1 and time.monotonic() - start < dist.collective_timeout_s
    finally:
        group.close()


def _engine(tokenizer) -> ScriptedEngine:
    return ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
                          replies=lambda ids: Reply(text="fine"))


def _exported(result) -> list[tuple]:
    """Each sample's token ids, loss mask, rollout logprobs, reward and advantage, Group by Group
    in prompt order (Groups are accepted in the order they finish, which start-up timing moves)."""
    groups = sorted(result.groups, key=lambda g: g.group.prompt_index)
    return [(s.sample.token_ids, s.sample.loss_mask, s.sample.rollout_logprobs, s.sample.reward, s.advantage)
            for g in groups for s in g.scored]


async def _wait_dead(pid: int) -> None:
    """Waits until process ``pid`` has exited (its pidfd turns readable)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


async def test_ray_executor_exports_what_the_local_one_exports(
    ray_cluster: None, tokenizer, tmp_path: Path
) -> None:
    from relaxtrio.cluster.agents import open_ray_agent_pool

    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=2, show_progress=False)
    results = {}
    async with open_ray_agent_pool(0.5) as pool:
        for name, launcher in (("local", None), ("ray", pool.run_agent)):
            (tmp_path / name).mkdir()
            with trio.fail_after(300):  # the pool's 4 actors start in ~10-15 s on 2 loaded cores
                async with open_test_pipeline(tmp_path / name, tokenizer, _engine(tokenizer),
                                              prompts([{"turns": 2}, {}]), config=config,
                                              launcher=launcher) as (pipeline, registry):
                    results[name] = await pipeline.run_step(0)
                    assert len(registry) == 0
        stats = pool.statistics()
    # At most one actor per Session in flight (4), each back in the pool after its run.
    assert (stats.num_runs, stats.num_lost, stats.num_busy) == (4, 0, 0)
    assert stats.num_created == stats.num_idle <= 4
    assert not results["ray"].dropped and len(results["ray"].samples) == 4
    assert _exported(results["ray"]) == _exported(results["local"])  # advantages included
    assert not await trio.to_thread.run_sync(live_actors)  # the pool's close killed them all


async def test_ray_executor_timeout_kills_the_agents_processes(
    ray_cluster: None, tokenizer, tmp_path: Path
) -> None:
    from relaxtrio.cluster.agents import open_ray_agent_pool

    pid_file = tmp_path / "pids"
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, show_progress=False)
    with trio.fail_after(300):
        async with open_ray_agent_pool(0.5) as pool:
            async with open_test_pipeline(tmp_path, tokenizer, _engine(tokenizer),
                                          prompts([{"mode": "grandchildren"}, {}]), config=config,
                                          env={"AGENT_PID_FILE": str(pid_file)}, timeout_s=15.0,
                                          launcher=pool.run_agent) as (pipeline, _):
                result = await pipeline.run_step(0)
            stats = pool.statistics()
    [dropped] = result.dropped
    # The driver's budget, enforced on the node; it starts with the Session's first request, so
    # the actor's start (~10-15 s on 2 busy cores) is not part of it.
    assert "timed out after 15 s" in dropped.dropped_reason
    assert len(result.groups) == 1  # refilled
    # The expired run was confirmed on its node, so the refill Group's agent reused that actor.
    assert (stats.num_created, stats.num_runs, stats.num_lost) == (1, 2, 0)
    pids = [int(p) for p in pid_file.read_text().split()]
    assert pids and not any(alive(pid) for pid in pids)


async def test_a_lost_agent_actor_fails_its_session_and_the_pool_replaces_it(
    ray_cluster: None, tokenizer, tmp_path: Path
) -> None:
    from relaxtrio.cluster.agents import open_ray_agent_pool

    pipe = PidPipe(tmp_path / "pids")
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, show_progress=False)

    async def kill_the_busy_actor(pool) -> None:
        [agent_pid] = await pipe.read_pids(1)  # the agent sent its request and now sleeps
        [member] = pool._busy
        await trio.to_thread.run_sync(ray.kill, member.handle)
        await _wait_dead(agent_pid)  # its reaper shim lost its parent, the actor: group ended

    with trio.fail_after(300):
        async with open_ray_agent_pool(0.5) as pool:
            async with open_test_pipeline(tmp_path, tokenizer, _engine(tokenizer),
                                          prompts([{"mode": "hang"}, {}]), config=config,
                                          env={"AGENT_PID_FILE": str(pipe.path)}, timeout_s=120.0,
                                          launcher=pool.run_agent) as (pipeline, _), \
                    trio.open_nursery() as nursery:
                nursery.start_soon(kill_the_busy_actor, pool)
                result = await pipeline.run_step(0)
            stats = pool.statistics()
    await pipe.aclose()
    [dropped] = result.dropped
    node = ray.util.get_node_ip_address()
    assert f"Agent's Ray node {node} was lost" in dropped.dropped_reason
    assert len(result.groups) == 1 and not result.groups[0].group.dropped  # refilled, on a new actor
    assert (stats.num_created, stats.num_lost, stats.num_runs, stats.num_actors) == (2, 1, 2, 1)


def _sample_key(record: dict) -> tuple:
    return (record["metadata"].get("id"), record["token_ids"])


async def _one_step_local_and_on_ray(tiny_model_dir: Path, tmp_path: Path, agent_executor: str,
                                     caplog: pytest.LogCaptureFixture) -> None:
    """One training step twice on the same seeds: one local trainer process, 2 launched local
    engines and local agents; then 2 trainer ranks and 2 launched engines as Ray actors with
    agents through ``agent_executor``. The exported samples (token ids, loss masks, rewards;
    rollout logprobs within 1e-5), the step's numbers and the loss must agree."""
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    cmd = write_httpx_agent(agent_dir)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"question {i}", "metadata": {"id": i}}) + "\n" for i in range(2)))
    caplog.set_level(logging.INFO, logger="relaxtrio")
    rows, samples = {}, {}
    for name, dist in (("local", DistributedConfig()),
                       ("ray", DistributedConfig(actor_num_gpus_per_node=2, ray_address="auto",
                                                 agent_executor=agent_executor, agent_num_cpus=0.25,
                                                 engine_num_cpus=0.5, collective_timeout_s=60.0))):
        config = TrainRunConfig(
            prompt_data=data, num_rollout=1, rollout_shuffle=False,
            rollout=RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=2, show_progress=False),
            generation=GenerationConfig(max_response_tokens=8, seed=7, seed_per_sample=True),
            agent=AgentConfig(command=f"{cmd} ok", cwd=agent_dir, timeout_s=120,
                              env={"AGENT_TURNS": "2", "AGENT_REWARD": "content"}),
            train=TrainConfig(lr=1e-3), hf_checkpoint=tiny_model_dir, output_dir=tmp_path / name,
            distributed=dist, fleet=FleetConfig(num_engines=2),
            debug_rollout_data=str(tmp_path / name / "dump_{rollout_id}.json"),
        )
        with trio.fail_after(900):
            summary = await run_training(config)
        [rows[name]] = summary.rows
        dump = json.loads((tmp_path / name / "dump_0.json").read_text())
        samples[name] = sorted(dump["samples"], key=_sample_key)
        engine_logs = sorted(p.name for p in (tmp_path / name / "engines").iterdir())
        assert engine_logs == ["engine-0.log", "engine-1.log", "gateway.log"], engine_logs
    on_ray = [r.getMessage() for r in caplog.records if "runs in a Ray actor" in r.getMessage()]
    assert sorted(m.split()[1] for m in on_ray) == ["0", "1"], on_ray  # engine 0, engine 1
    local, remote = rows["local"], rows["ray"]
    assert remote["num_samples"] == local["num_samples"] == 4 and remote["dropped_groups"] == 0
    for key in ("train_tokens", "reward_mean", "response_length_mean", "turns_mean"):
        assert remote.get(key) == local.get(key), key
    assert math.isclose(remote["loss"], local["loss"], rel_tol=1e-5, abs_tol=1e-7)
    assert len(samples["ray"]) == len(samples["local"]) == 4
    for got, want in zip(samples["ray"], samples["local"], strict=True):
        for field in ("token_ids", "loss_mask", "reward", "prompt_length", "weight_versions"):
            assert got[field] == want[field], field
        assert got["metadata"]["id"] == want["metadata"]["id"]  # (the rest names its Session)
        assert got["rollout_logprobs"] == pytest.approx(want["rollout_logprobs"], abs=1e-5)
    assert not live_actors()  # ranks, engines, agents: every actor is gone


async def test_one_training_step_on_ray_matches_one_local_process(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """2 trainer ranks and 2 launched engines as Ray actors + agents through the Ray executor vs
    one local process with 2 local engines and local agents, on the same seeds."""
    await _one_step_local_and_on_ray(tiny_model_dir, tmp_path, "ray", caplog)
