"""Step time: where the main job's step goes, phase by phase.

Runs the real job (``python -m relaxtrio train`` on the default example, embedded CPU engine,
``--num-rollout`` steps, a debug dump per step) and prints, per step, the driver's own timings
from ``metrics.jsonl``: ``rollout_s`` (Groups through the agents and the engine), ``update_s``
(``Trainer.train_step``), ``weight_sync_s`` (writing the weights, then pause, engine reload and
continue on every worker) and ``step_s``. The update is then split on the last
step's dumped samples with the trainer settings that step used, in this process: a separate
no-grad old-logprob forward (``Trainer.compute_logprobs``: what the step pays when it has more
than one minibatch; the default single minibatch takes the old logprobs from the training
forward itself), forward+backward and the optimizer (the AdamW step, timed around
``optimizer.step``).

``--variants`` picks the jobs, run one after another in the same run: ``sync`` (the default
job), ``fully_async`` (``--fully-async``; target step time at most 0.7x the synchronous one),
``prelaunch`` (agents that sleep 2 s before starting, with ``--agentic-prelaunch``, against the
same slow agents without it; target at most 0.6x), ``prelaunch_short`` (the same pair on a step
short enough for the start-up to be a real share of it: the tiny random model of
:mod:`relaxtrio.testing.tiny_models`, built here, as policy of both trainer and embedded engine,
and the example agent's replies bounded to ``SHORT_MAX_TOKENS`` through ``QUIZ_MAX_TOKENS``;
``--short-num-rollout`` steps, still a real update and weight push every step),
``prelaunch_short_wide`` (that pair with ``--agentic-concurrency`` of twice the default demand,
``WIDE_CONCURRENCY``: prelaunch then warms a whole step's Groups during the current rollout,
not only during the update and push; without prelaunch the extra permits stay unused), each
of these five also as ``..._stdlib``: the same job or pair with the example's standard-library
agent (``agent_stdlib.py``: the same requests and reward without the ``openai`` SDK's import,
about 0.5 s of CPU per agent here, so the 2 s start-up is mostly waiting, as behind a sandbox
or container start, not CPU the next step's agents take from the engine and trainer;
docs/scheduling.md#prelaunch), and ``sync_torch_threads`` /
``fully_async_torch_threads``: the same jobs with torch's default threads on both sides
(``--trainer-num-threads 0 --engine-num-threads 0``, the setting before the cores were split
between trainer and engine, :mod:`relaxtrio.cpu_threads`). Each job is one subprocess, so its
figures are end-to-end; each line carries the load average before and after its job. Ratios
and the push share use the steady steps: not the first, and with ``--num-rollout 3`` or more not
the last either (after the last step nothing overlaps its update, which favours the overlapped
schedules); use 3 or more steps for the fully async ratio.

Fully async steps: the driver starts the next step's Groups when a step closes, so they
generate during the update; a step's ``rollout_s`` is then what was left of its rollout when it
began, and ``step_s`` the time between the ends of consecutive steps (the first step also
pays the first rollout alone, which is why ratios skip it).

Every slow-agent job also writes an agent timeline (the wrapper appends its start, the end of
its sleep and its exit, wall clock) and runs at ``--log-level INFO``, so the step boundaries
(``accounting_start``, ``accounting_end``, ``step N metrics``) come from its ``run.log``; a
``timeline`` line per job says, for each step's trained Groups, when their agents started: during
the previous step's rollout, during its update and weight push (between ``accounting_end`` and
the step's end), or in the step itself, and how far into the step their sleep ended.

One JSON line per step and variant, one for the update split (when ``sync`` ran) and a summary
line with the weight-push share of the step (target at most 0.10) and the variant ratios. Each
step line also gives the machine's busy CPU seconds during the step (``cpu_busy_s``, from
``/proc/stat``: the job is the only work on the machine) and their share of cores x wall time;
the summary gives each job's ``cpu_floor_s`` (its steady steps' busy CPU over the cores: no
schedule of the same work is shorter) and, for each ratio, ``..._cpu_floor``: that floor over
the baseline's step, the lowest ratio the overlapped job could reach with the work it does. Usage:
``python benchmarks/step_profile.py [--num-rollout 2] [--variants sync fully_async prelaunch]
[-- extra train flags]`` (one synchronous job: about 4-8 minutes on 2 shared cores).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

PUSH_SHARE_TARGET: Final = 0.10
FULLY_ASYNC_TARGET: Final = 0.7
PRELAUNCH_TARGET: Final = 0.6
AGENT_START_DELAY_S: Final = 2.0
SHORT_MAX_TOKENS: Final = 4  # tokens per reply in prelaunch_short (the example asks for 48)
WIDE_CONCURRENCY: Final = 8  # resident Groups in prelaunch_short_wide: twice the default demand
_PHASES: Final = ("rollout_s", "update_s", "weight_sync_s", "train_s", "step_s")
_PRELAUNCH_VARIANTS: Final = ("prelaunch", "prelaunch_short", "prelaunch_short_wide")
_BASE_VARIANTS: Final = ("sync", "fully_async", *_PRELAUNCH_VARIANTS, "sync_torch_threads",
                         "fully_async_torch_threads")
_STDLIB_VARIANTS: Final = ("sync", "fully_async", *_PRELAUNCH_VARIANTS)  # also run as ..._stdlib
_STDLIB_AGENT: Final = "agent_stdlib.py"


def _slow_agent_command(timeline: Path, script: str = "agent.py") -> str:
    """The example agent ``script`` behind a 2 s start-up delay; appends ``start|ready|exit
    <group> <pid> <epoch s>`` lines to ``timeline`` (``ready``: the sleep is over and Python
    starts)."""
    stamp = f'>> {shlex.quote(str(timeline))}'
    inner = (f'echo "start $RELAX_GROUP_ID $$ $EPOCHREALTIME" {stamp}; sleep {AGENT_START_DELAY_S:g}; '
             f'echo "ready $RELAX_GROUP_ID $$ $EPOCHREALTIME" {stamp}; '
             f'{shlex.quote(sys.executable)} {shlex.quote(script)}; rc=$?; '
             f'echo "exit $RELAX_GROUP_ID $$ $EPOCHREALTIME" {stamp}; exit $rc')
    return f"bash -c {shlex.quote(inner)}"


def _log_time(line: str) -> float:
    """Epoch seconds of a ``run.log`` line (``%(asctime)s``: local time, milliseconds)."""
    stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def _step_bounds(run_log: Path) -> dict[int, dict[str, float]]:
    """Per step: ``start`` (accounting_start), ``rollout_end`` (accounting_end) and ``end`` (its
    metrics row logged: update, weight push and dump done), epoch seconds."""
    bounds: dict[int, dict[str, float]] = {}
    for line in run_log.read_text().splitlines():
        for key, pattern in (("start", r"event=accounting_start rollout=(\d+)"),
                             ("rollout_end", r"event=accounting_end rollout=(\d+)"),
                             ("end", r"relaxtrio\.driver: step (\d+) metrics")):
            if match := re.search(pattern, line):
                bounds.setdefault(int(match.group(1)), {})[key] = _log_time(line)
    return bounds


def _timeline(name: str, out: Path, num_rollout: int) -> dict[str, Any]:
    """When each step's trained Groups started their agents, against the step boundaries."""
    agents: dict[tuple[str, str], dict[str, float]] = {}
    for line in (out / "agent_timeline.txt").read_text().splitlines():
        kind, group_id, pid, epoch = line.split()
        agents.setdefault((group_id, pid), {})[kind] = float(epoch.replace(",", "."))
    bounds = _step_bounds(out / "run.log")
    steps = []
    for step in range(num_rollout):
        dump = json.loads((out / "dump" / f"rollout_{step}.json").read_text())
        trained = {g["group_id"] for g in dump["groups"] if g["status"] == "accepted"}
        own = [a for (g, _), a in agents.items() if g in trained]
        b, prev = bounds[step], bounds.get(step - 1)
        phases = {"previous_rollout": 0, "previous_update_push": 0, "this_step": 0}
        for group_id in sorted(trained):
            started = min(a["start"] for (g, _), a in agents.items() if g == group_id)
            if started >= b["start"] or prev is None:
                phases["this_step"] += 1
            elif started >= prev["rollout_end"]:
                phases["previous_update_push"] += 1
            else:
                phases["previous_rollout"] += 1
        ready = sorted(a["ready"] - b["start"] for a in own if "ready" in a)
        steps.append({
            "step": step, "groups_started_during": phases,
            "rollout_s": round(b["rollout_end"] - b["start"], 2),
            "update_push_s": round(b["end"] - b["rollout_end"], 2),
            "agent_ready_after_step_start_s": [round(ready[0], 2), round(ready[len(ready) // 2], 2),
                                               round(ready[-1], 2)] if ready else None,
        })
    return {"bench": "step_profile", "part": "timeline", "variant": name, "steps": steps}


def _busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``: user, nice,
    system, irq and softirq over every core; idle, I/O wait and time stolen by the hypervisor
    are not work)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _run_and_watch(cmd: list[str], out: Path) -> tuple[int, str, list[tuple[float, float]]]:
    """Runs ``cmd`` (stderr to ``out/job.stderr``) and samples the machine's busy CPU every
    0.1 s; returns (exit code, stderr tail, [(monotonic s, busy CPU s)] at the start and at each
    ``metrics.jsonl`` row, that is at each step's end)."""
    out.mkdir(parents=True, exist_ok=True)
    marks = [(time.monotonic(), _busy_cpu_s())]
    with open(out / "job.stderr", "w+") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, env=os.environ.copy())
        seen = 0
        while True:
            done = proc.poll() is not None
            rows = _count_lines(out / "metrics.jsonl")
            if rows > seen:  # a step ended since the last sample (at most 0.1 s ago)
                marks.extend([(time.monotonic(), _busy_cpu_s())] * (rows - seen))
                seen = rows
            if done:
                break
            time.sleep(0.1)
        stderr.seek(0)
        return proc.returncode, stderr.read()[-4000:], marks


def _run_job(name: str, out: Path, num_rollout: int, flags: list[str], extra: list[str]) -> list[dict]:
    """Runs one training job; returns its metric rows (raises if the job fails).

    Each step's line also carries ``cpu_busy_s`` (the machine's busy CPU seconds between the
    previous step's end and this one's: the job is the only work here) and ``cpu_busy_share``
    (that over cores x the same wall time): a schedule cannot make a step shorter than
    ``cpu_busy_s / cores`` without doing less work.
    """
    slow = any("agent_timeline" in f for f in flags)
    cmd = [sys.executable, "-m", "relaxtrio", "train", "--num-rollout", str(num_rollout),
           "--output-dir", str(out), "--log-level", "INFO" if slow else "WARNING",
           "--save-debug-rollout-data", str(out / "dump" / "rollout_{rollout_id}.json"), *flags, *extra]
    start = time.monotonic()
    load_before = os.getloadavg()[0]
    returncode, stderr_tail, marks = _run_and_watch(cmd, out)
    wall_s = time.monotonic() - start
    load = [round(load_before, 1), round(os.getloadavg()[0], 1)]
    if returncode != 0:
        sys.stderr.write(stderr_tail)
        raise SystemExit(f"{name}: the job exited {returncode}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    cores = os.cpu_count() or 1
    for index, row in enumerate(rows):
        line = {"bench": "step_profile", "variant": name, "step": index, "job_wall_s": round(wall_s, 1),
                "load_1min_before_after": load}
        line.update({k: round(row[k], 3) for k in _PHASES if isinstance(row.get(k), (int, float))})
        if index + 1 < len(marks):
            (t0, busy0), (t1, busy1) = marks[index], marks[index + 1]
            row["cpu_busy_s"] = line["cpu_busy_s"] = round(busy1 - busy0, 1)
            line["cpu_busy_share"] = round((busy1 - busy0) / (cores * (t1 - t0)), 3)
        line["train_tokens"] = row.get("train_tokens")
        if row.get("step_s") and row.get("weight_sync_s") is not None:
            line["weight_push_share"] = round(row["weight_sync_s"] / row["step_s"], 3)
        print(json.dumps(line), flush=True)
    if slow:
        print(json.dumps(_timeline(name, out, num_rollout)), flush=True)
    return rows


def _update_split(dump_path: Path, model_dir: Path) -> dict[str, Any]:
    """Times old-logprob forward, forward+backward and optimizer on one dumped step."""
    import torch

    from relaxtrio.cpu_threads import available_cpus, split_cpu_threads
    from relaxtrio.rollout.dumps import load_dump
    from relaxtrio.rollout.scored import ScoredSample
    from relaxtrio.tools.replay import train_config_of
    from relaxtrio.train import Trainer

    # The trainer's threads in the synchronous job's update: every core, since no train Group
    # is resident then (relaxtrio.cpu_threads: trainer_solo_threads).
    threads = split_cpu_threads(cpus=available_cpus(), num_local_engines=1, trainer_here=True)
    torch.set_num_threads(threads.trainer_solo_threads)
    torch.manual_seed(0)
    dump = load_dump(dump_path)
    config, _ = train_config_of(dump)
    samples = [d.sample for d in dump.samples]
    scored = [ScoredSample(sample=d.sample, reward=d.scalar_reward,
                           advantage=0.0 if d.advantage is None else float(d.advantage)) for d in dump.samples]
    trainer = Trainer.from_pretrained(model_dir, config)
    start = time.perf_counter()
    trainer.compute_logprobs(samples)
    old_forward_s = time.perf_counter() - start
    optimizer_s = 0.0
    step = trainer.optimizer.step

    def timed_step(*args: Any, **kwargs: Any) -> Any:  # the real AdamW step, timed
        nonlocal optimizer_s
        t0 = time.perf_counter()
        try:
            return step(*args, **kwargs)
        finally:
            optimizer_s += time.perf_counter() - t0

    trainer.optimizer.step = timed_step  # type: ignore[method-assign]
    stats = trainer.train_step(scored)
    return {"bench": "step_profile", "part": "update_split", "num_samples": len(samples),
            "torch_threads": torch.get_num_threads(),
            "train_tokens": stats.num_tokens, "num_micro_batches": stats.num_micro_batches,
            "old_logprob_forward_s": round(old_forward_s, 3),
            "forward_backward_s": round(stats.elapsed_s - optimizer_s, 3),
            "optimizer_s": round(optimizer_s, 3), "train_step_s": round(stats.elapsed_s, 3)}


def _steady(rows: list[dict]) -> list[dict]:
    """The steps the ratios use: without the first (it runs the first rollout alone, cold) and,
    with 3 or more steps, without the last: nothing is backfilled or prelaunched after it, so its
    update runs alone while the overlapped work it would pay for was done in the step before."""
    if len(rows) >= 3:
        return rows[1:-1]
    return rows[1:] or rows


def _mean_step(rows: list[dict]) -> float:
    steps = [r["step_s"] for r in _steady(rows)]
    return sum(steps) / len(steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-rollout", type=int, default=2, help="steps per job")
    parser.add_argument("--variants", nargs="+", default=["sync"],
                        choices=[*_BASE_VARIANTS, *(f"{v}_stdlib" for v in _STDLIB_VARIANTS)])
    parser.add_argument("--short-num-rollout", type=int, default=4, help="steps per prelaunch_short job")
    parser.add_argument("--work-dir", type=Path, default=None, help="job outputs (default: a temp dir)")
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    from relaxtrio.models import ensure_smollm2

    model_dir = ensure_smollm2()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="step_profile_"))
    torch_threads = ["--trainer-num-threads", "0", "--engine-num-threads", "0"]
    jobs: dict[str, list[str]] = {}
    steps_of: dict[str, int] = {}

    def slow_pair(base: str, flags: list[str], script: str) -> None:
        for name, more in ((base, []), (f"{base}_prelaunch", ["--agentic-prelaunch"])):
            jobs[name] = ["--agent-command",
                          _slow_agent_command(work / name / "agent_timeline.txt", script), *flags, *more]

    for variant in args.variants:
        stdlib = variant.endswith("_stdlib")
        script, suffix = (_STDLIB_AGENT, "_stdlib") if stdlib else ("agent.py", "")
        variant = variant.removesuffix("_stdlib")
        if variant == "prelaunch":
            slow_pair(f"slow_agents{suffix}", [], script)
        elif variant.startswith("prelaunch_short"):
            from relaxtrio.testing.tiny_models import build_tiny_model

            tiny = build_tiny_model(work / "tiny_model")
            wide = variant.endswith("_wide")
            base = ("short_wide_slow_agents" if wide else "short_slow_agents") + suffix
            slow_pair(base, ["--hf-checkpoint", str(tiny),
                             "--agent-env", f"QUIZ_MAX_TOKENS={SHORT_MAX_TOKENS}",
                             *(["--agentic-concurrency", str(WIDE_CONCURRENCY)] if wide else [])],
                      script)
            steps_of.update({base: args.short_num_rollout, f"{base}_prelaunch": args.short_num_rollout})
        else:
            flags = ["--fully-async"] if variant.startswith("fully_async") else []
            if stdlib:
                flags += ["--agent-command", f"{shlex.quote(sys.executable)} {_STDLIB_AGENT}"]
            jobs[variant + suffix] = [*flags, *(torch_threads if variant.endswith("torch_threads") else [])]
    rows = {name: _run_job(name, work / name, steps_of.get(name, args.num_rollout), flags, extra)
            for name, flags in jobs.items()}
    summary: dict[str, Any] = {"bench": "step_profile", "summary": True, "steps_per_job": args.num_rollout,
                               "steps_used": [r["step"] for r in _steady(
                                   [{"step": i} for i in range(args.num_rollout)])],
                               "cpus": os.cpu_count()}
    for name, job_rows in rows.items():
        summary[f"{name}_step_s"] = round(_mean_step(job_rows), 2)
        busy = [r["cpu_busy_s"] for r in _steady(job_rows) if "cpu_busy_s" in r]
        if busy:  # the step no schedule of this job's work can beat on these cores
            summary[f"{name}_cpu_floor_s"] = round(sum(busy) / len(busy) / (os.cpu_count() or 1), 2)
    if "sync" in rows:
        last = args.num_rollout - 1
        split = _update_split(work / "sync" / "dump" / f"rollout_{last}.json", model_dir)
        print(json.dumps(split), flush=True)
        warm = _steady(rows["sync"])
        summary["weight_push_share"] = round(
            sum(r["weight_sync_s"] for r in warm) / sum(r["step_s"] for r in warm), 3)
        summary["weight_push_share_target"] = PUSH_SHARE_TARGET
    for fast, base, key in (("fully_async", "sync", "fully_async_ratio"),
                            ("fully_async_stdlib", "sync_stdlib", "fully_async_ratio_stdlib"),
                            ("fully_async_torch_threads", "sync_torch_threads",
                             "fully_async_torch_threads_ratio"),
                            ("sync", "sync_torch_threads", "sync_split_over_torch_threads"),
                            *((f"{base}{suffix}_prelaunch", f"{base}{suffix}", f"{key}{suffix}")
                              for base, key in (("slow_agents", "prelaunch_ratio"),
                                                ("short_slow_agents", "prelaunch_short_ratio"),
                                                ("short_wide_slow_agents", "prelaunch_short_wide_ratio"))
                              for suffix in ("", "_stdlib"))):
        if fast in rows and base in rows:
            summary[key] = round(_mean_step(rows[fast]) / _mean_step(rows[base]), 3)
            if f"{fast}_cpu_floor_s" in summary:  # the ratio's floor: its own CPU work / cores
                summary[f"{key}_cpu_floor"] = round(summary[f"{fast}_cpu_floor_s"] / _mean_step(rows[base]), 3)
    if any(key.startswith("fully_async_ratio") for key in summary):
        summary["fully_async_target"] = FULLY_ASYNC_TARGET
    if any(key.startswith("prelaunch") for key in summary):
        summary["prelaunch_target"] = PRELAUNCH_TARGET
    if any(name.startswith("short_") for name in rows):
        summary["short_steps_used"] = [r["step"] for r in _steady(
            [{"step": i} for i in range(args.short_num_rollout)])]
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
