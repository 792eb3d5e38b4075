"""Training through the real SGLang Model Gateway on 2 embedded engines, seen from the dumps.

The engines start with different weight versions (``w0``, ``w1``), so every token's version in
a Session's dump says which worker sampled it. Two steps with partial rollout: the step-0 close
aborts Sessions in flight on both workers, the update brings both to ``step-1``, and the aborted
Sessions resume on their own worker in step 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import trio
from tests.fleet.fleet_helpers import IGNORE_DROPPED_BODY
from tests.support.agents import write_httpx_agent
from tests.support.waits import wait_until

from relaxtrio.config import (
    AgentConfig,
    FleetConfig,
    GenerationConfig,
    RolloutConfig,
    TrainRunConfig,
)
from relaxtrio.run.driver import run_training
from relaxtrio.rollout.dumps import load_dump
from relaxtrio.fleet.launch_fleet import open_gateway
from relaxtrio.train import TrainConfig

pytest.importorskip("smg")

pytestmark = [pytest.mark.slow, *IGNORE_DROPPED_BODY]

WORKER_LABELS = {"w0", "w1"}


async def _running(http: httpx.AsyncClient, url: str) -> int:
    info = (await http.get(f"{url}/server_info")).json()
    return int(info["internal_states"][0]["num_running_reqs"])


async def _release_when_both_generate(urls: list[str], release: Path) -> None:
    """Let the short Group's agents start once both workers generate for the long Groups."""
    async def both_generate() -> bool:
        return all([await _running(http, u) for u in urls])

    async with httpx.AsyncClient() as http:
        await wait_until(both_generate, timeout_s=300, what="both workers to generate")
    release.write_text("go")


async def test_two_steps_behind_the_gateway(start_engines, tiny_model_dir: Path,
                                            tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engines = await start_engines(2, max_running_requests=8)
    release = tmp_path / "release"
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    cmd = write_httpx_agent(agent_dir)
    data = tmp_path / "prompts.jsonl"
    rows = [{"input": "short", "metadata": {"mode": "wait_file", "wait_file": str(release),
                                            "turns": 2, "max_tokens": 4}},
            {"input": "long a", "metadata": {"turns": 8}},
            {"input": "long b", "metadata": {"turns": 8}}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dumps = tmp_path / "dump-{rollout_id}.json"
    with trio.fail_after(600):
        async with open_gateway(FleetConfig(), engines.urls, log_dir=tmp_path) as launched:
            config = TrainRunConfig(
                prompt_data=data,
                num_rollout=2,
                rollout=RolloutConfig(show_progress=False, n_samples_per_prompt=2,
                                      rollout_batch_size=1, over_sampling_batch_size=3,
                                      partial_rollout=True),
                generation=GenerationConfig(max_response_tokens=96, seed=7),
                agent=AgentConfig(command=f"{cmd} ok", cwd=agent_dir, timeout_s=300),
                train=TrainConfig(lr=2e-2),
                hf_checkpoint=tiny_model_dir,
                fleet=FleetConfig(router_url=launched.gateway_url, health_interval_s=1.0),
                output_dir=tmp_path / "run",
                debug_rollout_data=str(dumps),
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_release_when_both_generate, engines.urls, release)
                summary = await run_training(config)
                nursery.cancel_scope.cancel()
            async with httpx.AsyncClient() as http:
                versions = [(await http.get(f"{u}/model_info")).json()["weight_version"]
                            for u in engines.urls]
    assert summary.trained_steps == 2
    assert versions == ["step-2", "step-2"]  # both workers took every update
    # The workers came with labels of their own: a fresh run says they were updated before.
    warned = [r.getMessage() for r in caplog.records if "holds weight version" in r.getMessage()]
    assert sorted(warned) == sorted(
        f"the engine at {url} holds weight version {label!r}, not the initial 'default': it was "
        "updated before (by an earlier run?), so step 0 samples with those weights rather than "
        "--hf-checkpoint's; restart it for a clean start"
        for url, label in zip(engines.urls, ("w0", "w1"), strict=True))
    sessions = [s for step in (0, 1)
                for g in load_dump(Path(str(dumps).format(rollout_id=step))).groups
                for s in g["sessions"]]
    # Every turn of a Session was served by one worker: never both labels in one Session.
    workers = {s["session_id"]: set(s["weight_versions"]) & WORKER_LABELS for s in sessions}
    assert all(len(w) <= 1 for w in workers.values()), workers
    assert set().union(*workers.values()) == WORKER_LABELS  # and both workers served
    assert any(s["turn_count"] >= 2 and workers[s["session_id"]] for s in sessions)
    # The step-0 close aborted Sessions on both workers; each resumed there on step-1 weights.
    resumed = [s for s in sessions if s["abort"]["num_aborted"] >= 1
               and "step-1" in s["weight_versions"]]
    assert {label for s in resumed for label in workers[s["session_id"]]} == WORKER_LABELS
