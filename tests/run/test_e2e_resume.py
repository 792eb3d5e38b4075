"""Checkpoint and resume of a real run: SIGKILL during step 1 of 3, ``--load``, same result.

Every run here is a real ``python -m relaxtrio train`` subprocess with the tiny model, the
embedded engine and the httpx agent (one turn, reward a function of the reply text only), with
sampling seeded per Session (``--sglang-enable-deterministic-inference``). Rollouts are then
bit-identical across processes: the resumed run is compared with an uninterrupted run on the
prompts of every step, the rewards and the final weights, not on recorded samples.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file
from tests.support.agents import write_httpx_agent
from tests.support.procs import alive
from tests.support.waits import wait_until_sync

import relaxtrio
from relaxtrio._errors import RelaxError
from relaxtrio.cli.train_config import train_config
from relaxtrio.cli.train_flags import add_train_parser
from relaxtrio.run.checkpoint import RunCheckpointer

pytestmark = pytest.mark.slow  # starts real processes

REPO = Path(relaxtrio.__file__).resolve().parent.parent
RUN_TIMEOUT_S = 240.0


def _command(tmp_path: Path, model_dir: Path, name: str, *extra: str) -> list[str]:
    """The run's command; each run has its own agent directory (to find its agent processes)."""
    agent_dir = tmp_path / f"agent-{name}"
    agent_dir.mkdir(exist_ok=True)
    return [
        sys.executable, "-m", "relaxtrio", "train",
        "--hf-checkpoint", str(model_dir), "--prompt-data", str(tmp_path / "prompts.jsonl"),
        "--agent-cwd", str(agent_dir), "--agent-command", f"{write_httpx_agent(agent_dir)} ok",
        "--agent-env", "AGENT_REWARD=content",
        # 2 prompts, 1 Group per step: step 2 starts the second epoch (reshuffled).
        "--num-rollout", "3", "--n-samples-per-prompt", "2", "--rollout-batch-size", "1",
        "--rollout-max-response-len", "8", "--lr", "1e-2", "--agent-timeout", "120",
        "--sglang-enable-deterministic-inference", "--engine-max-running-requests", "4",
        *extra,
    ]


def _start(cmd: list[str], log_path: Path) -> subprocess.Popen:
    """Starts a run in its own process group, output to ``log_path``, in the empty directory
    ``_cwd`` (every path of the command is absolute: the run must create nothing there)."""
    with log_path.open("wb") as log_file:
        return subprocess.Popen(cmd, cwd=_cwd(log_path.parent), env=_env(log_path.parent), stdin=subprocess.DEVNULL,
                                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)


def _finish(proc: subprocess.Popen, log_path: Path) -> str:
    try:
        proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log_path.read_text(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    return text


def _cwd(tmp_path: Path) -> Path:
    """The runs' working directory (``tmp_path/cwd``)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    return cwd


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["MPLCONFIGDIR"] = str(tmp_path / "matplotlib")  # the font cache is built once, not per run
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _agents_left(agent_dir: Path) -> list[int]:
    """Live processes whose working directory is the test's agent directory."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if Path(os.readlink(proc / "cwd")) == agent_dir and alive(int(proc.name)):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def _run_and_kill_during_step_1(cmd: list[str], log_path: Path, agent_dir: Path) -> str:
    """Starts the run and SIGKILLs its process group once a step-1 agent is running."""
    proc = _start(cmd, log_path)
    try:
        def step_1_agent_runs() -> bool:
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            # Step 0's agents have exited when step 1 starts, so a live agent now is one of step 1's.
            return ("event=accounting_start rollout=1" in log_path.read_text(errors="replace")
                    and bool(_agents_left(agent_dir)))

        assert wait_until_sync(step_1_agent_runs, timeout_s=RUN_TIMEOUT_S, what="a step-1 agent",
                               interval_s=0.02), "step 1 never started its agents"
    finally:
        # The whole process group: the driver and its embedded engine, as a node failure would.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return log_path.read_text(errors="replace")


def _config(*argv: str):
    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers(dest="command"))
    return train_config(parser.parse_args(["train", *argv]))


def test_checkpoint_flags(tmp_path: Path) -> None:
    with pytest.raises(RelaxError, match="--save-interval needs --save DIR"):
        _config("--save-interval", "2")
    with pytest.raises(RelaxError, match="--save-interval must be >= 1"):
        _config("--save", str(tmp_path), "--save-interval", "0")
    config = _config("--save", str(tmp_path / "ckpt"), "--output-dir", str(tmp_path / "out"))
    assert (config.save_dir, config.save_interval, config.load_dir) == (tmp_path / "ckpt", None, None)
    assert config.generation.sampling_seed(1) is None  # unseeded unless asked for
    seeded = _config("--sglang-enable-deterministic-inference", "--rollout-seed", "9").generation
    assert [seeded.sampling_seed(i) for i in range(3)] == [9, 10, 11]
    def saved_after(*argv: str) -> list[int]:
        checkpointer = RunCheckpointer(config=_config("--num-rollout", "5", *argv))
        return [step for step in range(5) if checkpointer.save_due(step)]

    assert saved_after() == []
    assert saved_after("--save", str(tmp_path)) == [4]  # the end only
    assert saved_after("--save", str(tmp_path), "--save-interval", "2") == [1, 3, 4]
    # --load without --output-dir continues in the checkpointed run's directory ...
    checkpoint = tmp_path / "ckpt" / "iter_0000001"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_text(json.dumps(
        {"format": 1, "steps_done": 1, "run": {"output_dir": str(tmp_path / "first-run")}}))
    (tmp_path / "ckpt" / "latest").write_text("iter_0000001\n")
    config = _config("--load", str(tmp_path / "ckpt"))
    assert (config.load_dir, config.output_dir) == (tmp_path / "ckpt", tmp_path / "first-run")
    assert _config("--load", str(tmp_path / "ckpt"), "--output-dir", "x").output_dir == Path("x")
    # ... and an empty --load directory is a fresh start when it is the --save directory too
    # (so --save D --load D always works) ...
    empty = _config("--load", str(tmp_path / "empty"), "--save", str(tmp_path / "empty"))
    assert empty.load_dir == tmp_path / "empty" and empty.output_dir.parent == Path("runs")
    # ... and a mistake otherwise: a mistyped --load, a --save holding another run's checkpoint.
    with pytest.raises(RelaxError, match="the directory does not exist, so there is nothing to resume") as info:
        _config("--load", str(tmp_path / "ckpt-typo"), "--save", str(tmp_path / "ckpt"))
    assert info.value.param == "load"
    with pytest.raises(RelaxError, match="nothing to resume"):
        _config("--load", str(tmp_path / "empty"))
    with pytest.raises(RelaxError, match=r"--save .*ckpt' already holds a run checkpoint \(iter_0000001\) "
                       "and this run starts from the beginning") as info:
        _config("--save", str(tmp_path / "ckpt"))
    assert info.value.param == "save"
    other = tmp_path / "other"
    (other / "iter_0000003").mkdir(parents=True)
    (other / "iter_0000003" / "state.json").write_text(json.dumps(
        {"format": 1, "steps_done": 3, "run": {"output_dir": str(tmp_path / "other-run")}}))
    with pytest.raises(RelaxError, match="and this run resumes another one"):
        _config("--load", str(other), "--save", str(tmp_path / "ckpt"))
    # A --save that is no directory, or a checkpoint, or inside one.
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(RelaxError, match="a-file' is not a directory"):
        _config("--save", str(tmp_path / "a-file"))
    for save, what in ((checkpoint, "is a run checkpoint"), (checkpoint / "sub", "is inside the run checkpoint")):
        with pytest.raises(RelaxError, match=f"{what}.*pass the directory that holds the checkpoints"):
            _config("--load", str(checkpoint), "--save", str(save))
    # Resuming the --save directory itself or one of its iter_* checkpoints continues the
    # checkpoint's run directory; resuming into a new --save (a fork) starts one of its own.
    for load in (tmp_path / "ckpt", checkpoint):
        resumed = _config("--load", str(load), "--save", str(tmp_path / "ckpt"))
        assert (resumed.load_dir, resumed.output_dir) == (load, tmp_path / "first-run")
    fork = _config("--load", str(other), "--save", str(tmp_path / "fork"))
    assert fork.save_dir == tmp_path / "fork" and fork.output_dir.parent == Path("runs")
    assert _config("--load", str(other)).output_dir == tmp_path / "other-run"  # no --save: no fork


@pytest.mark.slow
def test_sigkill_during_step_1_then_load_matches_an_uninterrupted_run(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "prompts.jsonl").write_text("".join(
        json.dumps({"input": f"Question {i}: name a colour.", "metadata": {"id": i}}) + "\n"
        for i in range(2)))
    started = time.monotonic()
    # The reference: three steps, never interrupted (it runs while the next one is killed).
    ref_dir = tmp_path / "ref"
    ref = _start(_command(tmp_path, tiny_model_dir, "ref", "--output-dir", str(ref_dir)),
                 tmp_path / "ref.log")
    try:
        # The same run with a checkpoint after every step, killed while step 1 runs.
        run_dir, save_dir = tmp_path / "run", tmp_path / "run" / "ckpt"
        saving = ("--save", str(save_dir), "--save-interval", "1")
        killed_log = _run_and_kill_during_step_1(
            _command(tmp_path, tiny_model_dir, "killed", "--output-dir", str(run_dir), *saving),
            tmp_path / "killed.log", tmp_path / "agent-killed")
    finally:
        _finish(ref, tmp_path / "ref.log")
    assert "event=accounting_end rollout=1" not in killed_log  # it died inside step 1
    assert (save_dir / "latest").read_text().strip() == "iter_0000001"
    assert [r["step"] for r in _rows(run_dir)] == [0]
    # Its agents lose the API server and exit on their own.
    wait_until_sync(lambda: not _agents_left(tmp_path / "agent-killed"), timeout_s=30, what="agents to exit")
    assert not _agents_left(tmp_path / "agent-killed")

    # Resume: no --output-dir, so it continues in the killed run's directory.
    resumed = _finish(_start(_command(tmp_path, tiny_model_dir, "resumed", "--load", str(save_dir),
                                      *saving), tmp_path / "resumed.log"), tmp_path / "resumed.log")
    assert f"resuming from {save_dir / 'iter_0000001'} at rollout 1" in resumed

    want, got = _rows(ref_dir), _rows(run_dir)
    assert [r["step"] for r in got] == [0, 1, 2]  # appended, each step once
    # Exactly the prompts of the uninterrupted run, step by step (both epochs: none skipped or
    # repeated), and the same rollouts (rewards are a function of the sampled text).
    assert [r["prompt_indices"] for r in got] == [r["prompt_indices"] for r in want]
    assert sorted(i for r in got[:2] for i in r["prompt_indices"]) == [0, 1]
    for key in ("reward_mean", "reward_std", "response_length_mean", "grad_norm", "loss"):
        assert [r[key] for r in got] == pytest.approx([r[key] for r in want], abs=1e-6), key
    assert got[1]["resume_dropped_groups"] == 0 and "resume_dropped_groups" not in got[2]
    assert any(r["grad_norm"] > 0 for r in want)  # the weights really moved
    ref_weights = load_file(ref_dir / "checkpoint" / "model.safetensors")
    run_weights = load_file(run_dir / "checkpoint" / "model.safetensors")
    assert ref_weights.keys() == run_weights.keys()
    for name, tensor in ref_weights.items():
        assert (run_weights[name] - tensor).abs().max().item() <= 1e-5, name
    # The last two checkpoints are kept; latest is the final one.
    assert (save_dir / "latest").read_text().strip() == "iter_0000003"
    assert sorted(p.name for p in save_dir.iterdir()) == [".relaxtrio.lock", "iter_0000002", "iter_0000003",
                                                          "latest"]
    # Only the directories the runs name: no runs/<time>/ in the working directory (the resume,
    # without --output-dir, continued in the killed run's directory).
    assert list(_cwd(tmp_path).iterdir()) == []
    print(f"resume e2e: {time.monotonic() - started:.1f} s")


@pytest.mark.slow
def test_a_fully_async_run_ends_with_a_final_backfill_and_extends_from_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Run 2 steps under ``--fully-async`` with one Group of over-sampling, then extend the same
    run to 3 steps from its end-of-run checkpoint. The last step is a final backfill: the Group
    over-sampling kept past step 0 fills it (no surplus is started), so nothing is dropped or
    requeued at the run's end, and every prompt drawn is trained exactly once."""
    (tmp_path / "prompts.jsonl").write_text("".join(
        json.dumps({"input": f"Question {i}: name a colour.", "metadata": {"id": i}}) + "\n"
        for i in range(8)))
    run_dir, save_dir = tmp_path / "run", tmp_path / "run" / "ckpt"
    shape = ("--fully-async", "--over-sampling-batch-size", "2", "--save", str(save_dir))

    def command(name: str, num_rollout: str, *extra: str) -> list[str]:
        cmd = _command(tmp_path, tiny_model_dir, name, *shape, *extra)
        cmd[cmd.index("--num-rollout") + 1] = num_rollout
        return cmd

    _finish(_start(command("first", "2", "--output-dir", str(run_dir)), tmp_path / "first.log"),
            tmp_path / "first.log")
    first_rows = _rows(run_dir)
    state = json.loads((save_dir / "iter_0000002" / "state.json").read_text())["rollout"]
    assert state.get("run_end_groups", 0) == 0 and not state.get("run_end_prompts")
    assert [r["dropped_groups"] for r in first_rows] == [0, 0]  # the kept Group trained at step 1
    trained_first = [i for r in first_rows for i in r["prompt_indices"]]
    assert len(trained_first) == 2 and len(set(trained_first)) == 2

    extended = _finish(_start(command("extended", "3", "--load", str(save_dir)),
                              tmp_path / "extended.log"), tmp_path / "extended.log")
    assert "event=resume_requeued" not in extended
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[:2] == first_rows and not rows[2].get("resume_requeued_groups")
    # Groups started: 2 in the first run (the last step started none), 1 in the extension's
    # last step (its target, no surplus); each trained once.
    trained = [i for r in rows for i in r["prompt_indices"]]
    assert (len(trained), len(set(trained)), sum(r["dropped_groups"] for r in rows)) == (3, 3, 0)
    assert "this process: 1 of 1 step trained" in extended
    assert "whole run: 3 of 3 steps trained" in extended
