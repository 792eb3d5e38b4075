"""Training on two launched embedded engines behind the real gateway, faults included."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
from tests.support.agents import write_httpx_agent
from tests.support.procs import alive
from tests.support.waits import wait_until

from relaxtrio import _reaper
from relaxtrio.config import (
    AgentConfig,
    FleetConfig,
    GenerationConfig,
    RolloutConfig,
    TrainRunConfig,
)
from relaxtrio.run.driver import _warn_lost_engines, run_training
from relaxtrio.fleet.fleet import FleetStatistics
from relaxtrio.train import TrainConfig

pytest.importorskip("smg")

GATEWAY_TITLE = "smg::router"  # the gateway's process names itself so (its shim keeps the argv)

# A peer that dies while httpx sends leaves httpx's request-body generator unfinished (GC warns).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings(
        "ignore:Async generator 'httpx._content.ByteStream.__aiter__':ResourceWarning"),
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object ByteStream.__aiter__"
        ":pytest.PytestUnraisableExceptionWarning"),
]


def _processes(*needles: str) -> dict[int, list[str]]:
    """Live processes whose command line contains every needle: pid → argv."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = [a.decode() for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if all(any(n in a for a in argv) for n in needles) and alive(int(entry.name)):
            found[int(entry.name)] = argv
    return found


def _engine(run_dir: Path, index: int) -> tuple[int, str] | None:
    """(pid, url) of launched engine ``index``, found by the log file its stderr writes to."""
    log_path = run_dir / "engines" / f"engine-{index}.log"
    for pid, argv in _processes("relaxtrio.engine").items():
        if _reaper.SCRIPT in argv:
            continue
        try:
            if os.readlink(f"/proc/{pid}/fd/2") == str(log_path):  # stderr goes to the log
                lines = [ln for ln in log_path.read_text().splitlines()
                         if ln.startswith("RELAXTRIO_ENGINE_URL=")]
                return pid, lines[-1].split("=", 1)[1]
        except (OSError, IndexError):
            continue
    return None


async def _engines_generating(run_dir: Path, *, every: bool) -> list[tuple[int, str]]:
    """(pid, url) of launched engines 0 and 1, once both run and every one (``every``) or any
    one of them has a request running."""
    await wait_until(lambda: None not in [_engine(run_dir, i) for i in (0, 1)], timeout_s=600,
                     what="engines 0 and 1 to run", interval_s=0.1)
    engines = [e for e in [_engine(run_dir, i) for i in (0, 1)] if e is not None]
    async with httpx.AsyncClient() as http:
        async def running(url: str) -> bool:
            info = (await http.get(f"{url}/server_info")).json()
            return info["internal_states"][0]["num_running_reqs"] > 0

        async def generating() -> bool:
            return (all if every else any)([await running(url) for _, url in engines])

        await wait_until(generating, timeout_s=600, what="the engines to generate", interval_s=0.02)
    return engines


def _config(tmp_path: Path, tiny_model_dir: Path, *, turns: int, **rollout) -> TrainRunConfig:
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    cmd = write_httpx_agent(agent_dir)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"question {i}", "metadata": {"id": i}}) + "\n"
                            for i in range(6)))
    return TrainRunConfig(
        prompt_data=data,
        num_rollout=1,
        rollout=RolloutConfig(show_progress=False, **rollout),
        generation=GenerationConfig(max_response_tokens=24, seed=7),
        agent=AgentConfig(command=f"{cmd} ok", cwd=agent_dir, timeout_s=300,
                          env={"AGENT_TURNS": str(turns), "AGENT_REWARD": "random"}),
        train=TrainConfig(lr=2e-2),
        hf_checkpoint=tiny_model_dir,
        fleet=FleetConfig(num_engines=2, health_interval_s=1.0),
        output_dir=tmp_path / "run",
    )


async def test_an_engine_sigkilled_mid_step(tiny_model_dir: Path, tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    config = _config(tmp_path, tiny_model_dir, turns=4, n_samples_per_prompt=2,
                     rollout_batch_size=3)
    run_dir = tmp_path / "run"
    killed: list[str] = []

    async def kill_engine_0_while_both_generate() -> None:
        (pid, url), _ = await _engines_generating(run_dir, every=True)
        os.kill(pid, signal.SIGKILL)
        killed.append(url)

    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(kill_engine_0_while_both_generate)
            summary = await run_training(config)
            nursery.cancel_scope.cancel()
    [row] = summary.rows
    assert killed, "the step finished before both engines generated"
    assert summary.trained_steps == 1
    assert row["dropped_groups"] == 0 and row["num_groups"] == 3  # no agent saw an error
    removed = [r.getMessage() for r in caplog.records if "fleet: worker" in r.getMessage()]
    assert any(f"worker {killed[0]} removed" in m for m in removed), removed
    assert not _processes("relaxtrio.engine", str(tiny_model_dir))


async def test_both_engines_sigkilled_mid_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Every worker behind the gateway dies at once: the turns wait for the restarts (the
    gateway answers 503 meanwhile) and no agent sees an error."""
    config = _config(tmp_path, tiny_model_dir, turns=4, n_samples_per_prompt=2,
                     rollout_batch_size=3)
    run_dir = tmp_path / "run"
    killed: list[int] = []

    async def kill_both_while_generating() -> None:
        for pid, _ in await _engines_generating(run_dir, every=False):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(kill_both_while_generating)
            summary = await run_training(config)
            nursery.cancel_scope.cancel()
    [row] = summary.rows
    assert len(killed) == 2, "the step finished before the engines generated"
    assert summary.trained_steps == 1
    assert row["dropped_groups"] == 0 and row["num_groups"] == 3  # no agent saw an error
    assert not _processes("relaxtrio.engine", str(tiny_model_dir))


def test_a_run_that_ends_with_fewer_engines_says_so(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="relaxtrio.run.driver")
    stats = FleetStatistics(workers=("http://a",), removed={"http://b": "it keeps dying"},
                            sessions={}, in_flight=0, weight_version="step-3")
    _warn_lost_engines(stats, 2)
    _warn_lost_engines(stats, 1)  # as many as at the start: nothing to say
    assert [r.getMessage() for r in caplog.records] == [
        "finished with 1 of 2 engines (not back: http://b: it keeps dying)"]


def test_cli_trains_a_step_on_two_engines_and_leaves_no_process(tiny_model_dir: Path,
                                                                tmp_path: Path) -> None:
    """``train --rollout-num-engines 2 --num-rollout 1``: two engines and the gateway, one step."""
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    cmd = write_httpx_agent(agent_dir)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"q{i}"}) + "\n" for i in range(2)))
    gateways_before = set(_processes(GATEWAY_TITLE))
    argv = [sys.executable, "-m", "relaxtrio", "train", "--rollout-num-engines", "2",
            "--num-rollout", "1", "--hf-checkpoint", str(tiny_model_dir),
            "--prompt-data", str(data), "--agent-cwd", str(agent_dir),
            "--agent-command", f"{cmd} ok", "--n-samples-per-prompt", "2",
            "--rollout-batch-size", "1", "--rollout-max-response-len", "8",
            "--output-dir", str(tmp_path / "run"), "--weight-sync", "disk"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fleet: 2 worker(s) behind gateway" in done.stderr
    assert "weights reach the engines via disk" in done.stderr
    assert "fleet: 2 worker(s) at weight version step-1" in done.stderr
    [row] = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["loss"] is not None and row["dropped_groups"] == 0 and row["weight_sync_s"] > 0
    # The gateway's per-worker counters: every generation of the step went to one of the two.
    per_worker = {k: v for k, v in row.items() if k.startswith("gateway/requests/")}
    assert len(per_worker) == 2 and row["gateway/requests"] == sum(per_worker.values()) > 0
    assert row["gateway/errors"] == 0
    logs = tmp_path / "run" / "engines"
    assert {p.name for p in logs.iterdir()} == {"engine-0.log", "engine-1.log", "gateway.log"}
    assert not (tmp_path / "run" / "weights").exists()  # old versions and the last one cleaned up
    assert not _processes("relaxtrio.engine", str(tiny_model_dir))
    assert not set(_processes(GATEWAY_TITLE)) - gateways_before


def _argv(pid: int) -> list[str]:
    try:
        return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def _descendants(pid: int) -> list[int]:
    """``pid``'s descendants, children first."""
    found, todo = [], [pid]
    while todo:
        try:
            kids = Path(f"/proc/{todo.pop()}/task").glob("*/children")
            new = [int(c) for path in kids for c in path.read_text().split()]
        except OSError:
            continue
        found.extend(new)
        todo.extend(new)
    return found


async def test_a_sigkilled_driver_leaves_no_engine_gateway_or_agent(tiny_model_dir: Path,
                                                                   tmp_path: Path) -> None:
    """``kill -9`` of ``train --rollout-num-engines 2`` while its agents run: the engines, the
    gateway, the agents and the agents' own children all go (each under its reaper shim)."""
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    cmd = write_httpx_agent(agent_dir)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"q{i}"}) + "\n" for i in range(2)))
    pid_file = tmp_path / "agents.pid"
    argv = [sys.executable, "-m", "relaxtrio", "train", "--rollout-num-engines", "2",
            "--num-rollout", "1", "--hf-checkpoint", str(tiny_model_dir),
            "--prompt-data", str(data), "--agent-cwd", str(agent_dir),
            "--agent-command", f"{cmd} hang", "--agent-env", f"AGENT_PID_FILE={pid_file}",
            "--n-samples-per-prompt", "2", "--rollout-batch-size", "1",
            "--output-dir", str(tmp_path / "run"), "--weight-sync", "disk"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    with (tmp_path / "driver.log").open("wb") as log_file:
        driver = await trio.lowlevel.open_process(argv, stdout=log_file, stderr=log_file, env=env)
    try:
        with trio.fail_after(300):
            def agents_wrote_pids() -> bool:
                assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
                return pid_file.exists() and len(pid_file.read_text().split()) >= 2

            await wait_until(agents_wrote_pids, timeout_s=300, what="both agents' pids")
            # Under the driver: 5 shims (2 engines, the gateway, 2 agents), what they run, and
            # the sleep each agent started.
            agents = [int(p) for p in pid_file.read_text().split()]
            tree: list[int] = []
            shims: dict[int, list[str]] = {}

            def all_started() -> bool:
                tree[:] = _descendants(driver.pid)
                argvs = {p: _argv(p) for p in tree}
                shims.clear()
                shims.update({p: a for p, a in argvs.items() if _reaper.SCRIPT in a})
                return (len(shims) == 5 and all(_descendants(p) for p in shims)
                        and sum(a[:1] == ["sleep"] for a in argvs.values()) == 2)

            await wait_until(all_started, timeout_s=300, what="5 shims, their commands and 2 sleeps")
            assert set(agents) <= set(tree)
            kinds = sorted("engine" if "relaxtrio.engine" in a else
                           "gateway" if "smg" in a and "launch" in a else
                           "agent" if "bash" in a else "?" for a in shims.values())
            assert kinds == ["agent", "agent", "engine", "engine", "gateway"]
            driver.kill()
            await driver.wait()
            await wait_until(lambda: not [p for p in tree if alive(p)], timeout_s=120,
                             what="every process of the killed driver to exit")
    finally:
        if driver.returncode is None:
            driver.kill()
            await driver.wait()
    assert not _processes("relaxtrio.engine", str(tiny_model_dir))
