"""Does an agent measurably learn? relaxtrio trains SmolLM2-135M-Instruct through
examples/stock_lookup and evaluates the held-out split every k steps.

Per seed: a rollout-only run measures the base model on the eval split (step 0), then
``python -m relaxtrio train`` runs N steps with ``--eval-interval k``. One JSON line per eval:

    {"system": "relaxtrio", "variant": "multi", "seed": 1, "step": 8, "wall_s": 312.4,
     "samples": 128, "pass1": 0.23, "ci95": [0.18, 0.29], "n": 200, "reward_mean": 0.31,
     "response_len": 9.2, "logprob_abs_diff": 0.003, "clip_fraction": 0.01}

``wall_s`` is training time (rollout + update + weight push, summed over steps; eval time and
start-up excluded; ``eval_s`` is the eval's own time and ``elapsed_s`` the run's so far). ``reward_mean`` and
``response_len`` (sampled tokens per context) are the last train step's; ``logprob_abs_diff``
(mean |rollout - trainer| logprob) and ``clip_fraction`` the mean over the steps since the last
eval. The run fails (exit 1) when any step dropped a Group or an eval lost one.

``--variant multi`` trains the two-turn agent (answer, feedback, retry); ``single`` the one-turn
variant that ``learning_trl.py`` trains with TRL. ``--backend vllm`` generates on a vLLM server
(``scripts/setup_vllm.sh``; ``--engine-python`` or ``RELAXTRIO_VLLM_PYTHON`` names its
interpreter) and tags the result files ``-vllm``. ``--with-trl`` runs ``learning_trl.py`` with the
same shared flags afterwards, so one invocation measures both systems. ``--fully-async`` trains
relaxtrio with ``--fully-async --max-staleness 1`` (files tagged ``-async``). ``--profile-steps N``
replaces the curve by a profile of N steps per seed (:func:`profile`). ``--plot-only`` redraws the
PNG from the JSON lines under ``--out``. Each eval line carries ``load1``, the machine's load.

    python benchmarks/learning.py --variant single --with-trl
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TASK = REPO / "examples" / "stock_lookup"
RESULTS = Path(__file__).resolve().parent / "results"


def wilson(successes: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion; (nan, nan) when n is 0."""
    if n <= 0:
        return (math.nan, math.nan)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def eval_record(pass1: float, n: int, **fields: Any) -> dict[str, Any]:
    """One eval's JSON line: ``fields`` plus pass@1, its 95% Wilson interval, n and ``load1`` (the
    machine's 1-minute load average when the line is written: wall times only compare at similar
    loads)."""
    low, high = wilson(pass1 * n, n)
    return {**fields, "pass1": round(pass1, 4), "ci95": [round(low, 4), round(high, 4)], "n": n,
            "load1": round(os.getloadavg()[0], 2)}


def emit(record: dict[str, Any], sink: Path) -> None:
    """Prints ``record`` as one JSON line and appends it to ``sink``."""
    line = json.dumps(record, sort_keys=True)
    print(line, flush=True)
    with sink.open("a", encoding="utf-8") as f:
        f.write(line + "\n")


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings both systems share (learning_trl.py reads the same flags)."""
    return {"steps": args.steps, "eval_every": args.eval_every, "prompts_per_step": args.prompts_per_step,
            "group_size": args.group_size, "lr": args.lr, "max_tokens": args.max_tokens,
            "temperature": args.temperature, "eps_clip": 0.2, "eps_clip_high": 0.28, "kl_coef": 0.0,
            "loss": "token_mean (DAPO)", "advantage": "GRPO (group mean/std)"}


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """Flags shared with learning_trl.py, so that one set of values drives both systems."""
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=16, help="optimizer steps (one per rollout)")
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--prompts-per-step", type=int, default=4, help="Groups per step")
    parser.add_argument("--group-size", type=int, default=4, help="samples per prompt")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per model turn")
    parser.add_argument("--temperature", type=float, default=1.0, help="train and eval sampling")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--eval-concurrency", type=int, default=32, help="eval Sessions at once")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads per process (relaxtrio: engine and trainer each; TRL: its one process);"
                             " 0 (default): each system's own default on the whole machine (relaxtrio: its"
                             " trainer/engine core split, relaxtrio.cpu_threads; TRL: torch's, one per core)")
    parser.add_argument("--tag", default="", help="suffix of the result file names")


def _train_flags(args: argparse.Namespace, seed: int, attempts: int, *, training: bool = True) -> list[str]:
    backend = [] if args.backend == "embedded" else ["--rollout-backend", args.backend]
    if args.engine_python is not None:
        backend += ["--engine-python", str(args.engine_python)]
    return [
        *backend,
        "--agent-cwd", str(TASK), "--agent-command", f"{sys.executable} agent.py",
        "--agent-env", f"STOCK_ATTEMPTS={attempts}",
        "--prompt-data", str(TASK / "data" / "train.jsonl"),
        "--eval-prompt-data", "stock", str(TASK / "data" / "eval.jsonl"),
        "--rollout-batch-size", str(args.prompts_per_step), "--n-samples-per-prompt", str(args.group_size),
        "--rollout-max-response-len", str(args.max_tokens), "--rollout-temperature", str(args.temperature),
        "--lr", str(args.lr), "--eps-clip", "0.2", "--eps-clip-high", "0.28",
        "--seed", str(seed), "--rollout-seed", str(seed), "--log-level", "WARNING",
        "--agentic-eval-concurrency", str(args.eval_concurrency),
        *(["--engine-num-threads", str(args.threads), "--trainer-num-threads", str(args.threads)]
          if args.threads else []),
        *(["--fully-async", "--max-staleness", str(args.max_staleness)] if args.fully_async and training else []),
        "--engine-max-running-requests", str(max(args.eval_concurrency, args.prompts_per_step * args.group_size)),
    ]


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def _run(flags: list[str], out_dir: Path, timeout_s: float, on_row: Any = None) -> tuple[list[dict[str, Any]], float]:
    """Runs ``python -m relaxtrio train``, calling ``on_row(row)`` for each new metrics row as it is
    written; returns (metrics rows, elapsed s). Exits on failure (the log's tail)."""
    start = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    log = (out_dir / "train.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "relaxtrio", "train", *flags, "--output-dir", str(out_dir)],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
    seen = 0
    try:
        while True:
            try:
                code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            rows = _rows(out_dir / "metrics.jsonl")
            for row in rows[seen:]:
                if on_row is not None:
                    on_row(row)
            seen = len(rows)
            if code is not None:
                break
            if time.monotonic() - start > timeout_s:
                proc.terminate()
                proc.wait()
                raise SystemExit(f"relaxtrio train ran past {timeout_s:g} s; log: {out_dir / 'train.log'}")
    except BaseException:  # a dropped Group or Ctrl-C: stop the run (it stops its agents and engine)
        proc.terminate()
        proc.wait()
        raise
    log.close()
    if code != 0:
        tail = (out_dir / "train.log").read_text()[-3000:]
        raise SystemExit(f"relaxtrio train failed ({code}):\n{tail}")
    return rows, time.monotonic() - start


def _check_no_drops(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        lost = row.get("dropped_groups", 0) + row.get("eval/stock/dropped_groups", 0)
        if lost:
            raise SystemExit(f"step {row.get('step')}: {lost:g} Group(s) dropped; the curve is not valid")


def run_seed(args: argparse.Namespace, seed: int, sink: Path) -> None:
    """The base eval, then the training run; one JSON line per eval into ``sink``."""
    attempts = 2 if args.variant == "multi" else 1
    common = {"system": _system(args), "variant": args.variant, "seed": seed}
    work = args.work / f"{_system(args)}_{args.variant}_seed{seed}"
    base_rows, _ = _run(_train_flags(args, seed, attempts, training=False) + [
        "--debug-rollout-only", "--num-rollout", "1", "--rollout-batch-size", "1", "--eval-interval", "1"],
        work / "base", args.timeout_s)
    _check_no_drops(base_rows)
    base = base_rows[-1]
    emit(eval_record(base["eval/stock/reward_mean"], int(base["eval/stock/num_samples"]), **common, step=0,
                     wall_s=0.0, samples=0, eval_s=round(base["eval_s"], 1)), sink)
    state: dict[str, Any] = {"wall": 0.0, "samples": 0.0, "since": [], "start": time.monotonic()}

    def on_row(row: dict[str, Any]) -> None:
        _check_no_drops([row])
        state["wall"] += row["step_s"] - row.get("eval_s", 0.0)
        state["samples"] += row["num_samples"]
        state["since"].append(row)
        if "eval/stock/reward_mean" not in row:
            return
        since, state["since"] = state["since"], []
        emit(eval_record(
            row["eval/stock/reward_mean"], int(row["eval/stock/num_samples"]), **common,
            step=int(row["step"]) + 1, wall_s=round(state["wall"], 1),
            samples=int(state["samples"]), eval_s=round(row["eval_s"], 1),
            elapsed_s=round(time.monotonic() - state["start"], 1), reward_mean=round(row["reward_mean"], 4),
            response_len=round(row["response_length_mean"], 2),
            logprob_abs_diff=_mean(r.get("rollout_logprob_abs_diff") for r in since),
            clip_fraction=_mean(r.get("clip_fraction") for r in since)), sink)

    _run(_train_flags(args, seed, attempts) + [
        "--num-rollout", str(args.steps), "--eval-interval", str(args.eval_every)], work / "train",
        args.timeout_s, on_row)


def profile(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Where a training step's time goes: ``--profile-steps`` steps (no eval) with OpenTelemetry
    spans (``--otel-file``, the ``otel`` extra), averaged over the steps after the first.

    Per step: ``rollout_s``, ``update_s``, ``weight_sync_s`` (the driver's metrics). Per Session
    (seconds, mean): ``agent_start_s`` (Session start to its first request: ``bash -lc``, the
    interpreter, the agent's imports), ``requests_s`` (its requests, engine queue and generation
    included), ``agent_end_s`` (last request's end to the Session's end: the agent's reward and
    exit). ``session_s`` is the whole Session; the rollout ends with its Groups' slowest Session."""
    work = args.work / f"profile_seed{seed}"
    spans_path = work / "spans.jsonl"
    work.mkdir(parents=True, exist_ok=True)
    spans_path.unlink(missing_ok=True)
    attempts = 2 if args.variant == "multi" else 1
    rows, _ = _run(_train_flags(args, seed, attempts) + [
        "--num-rollout", str(args.profile_steps), "--otel-file", str(spans_path)], work / "train", args.timeout_s)
    spans = [json.loads(line) for line in spans_path.read_text().splitlines() if line.strip()]
    steps = {s["span_id"]: s["attributes"]["relaxtrio.rollout_id"] for s in spans if s["name"] == "relaxtrio.step"}
    groups = {s["span_id"]: steps.get(s["parent_span_id"]) for s in spans if s["name"] == "relaxtrio.group"}
    requests: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        if s["name"] == "relaxtrio.request":
            requests.setdefault(s["parent_span_id"], []).append(s)
    per: dict[str, list[float]] = {"agent_start_s": [], "requests_s": [], "agent_end_s": [], "session_s": []}
    for s in spans:
        if s["name"] != "relaxtrio.session" or not groups.get(s["parent_span_id"]) or s["span_id"] not in requests:
            continue  # the first step's Sessions also wait for the engine and the trainer to warm up
        reqs = requests[s["span_id"]]
        per["agent_start_s"].append((min(r["start_time_ns"] for r in reqs) - s["start_time_ns"]) / 1e9)
        per["requests_s"].append(sum(r["end_time_ns"] - r["start_time_ns"] for r in reqs) / 1e9)
        per["agent_end_s"].append((s["end_time_ns"] - max(r["end_time_ns"] for r in reqs)) / 1e9)
        per["session_s"].append((s["end_time_ns"] - s["start_time_ns"]) / 1e9)
    steady = rows[1:] or rows
    out = {key: _mean(r[key] for r in steady) for key in ("step_s", "rollout_s", "update_s", "weight_sync_s")}
    out.update({f"session_{k}" if not k.startswith("session") else k: _mean(v) for k, v in per.items()})
    return {"profile": {"system": _system(args), "variant": args.variant, "seed": seed, "steps": len(rows),
                        "sessions": len(per["session_s"]), **out, "load1": round(os.getloadavg()[0], 2)}}


def _system(args: argparse.Namespace) -> str:
    name = "relaxtrio" if args.backend == "embedded" else f"relaxtrio-{args.backend}"
    return name + ("-async" if args.fully_async else "")


def _mean(values: Any) -> float | None:
    present = [v for v in values if v is not None and not math.isnan(v)]
    return round(sum(present) / len(present), 5) if present else None


def plot(results: Path) -> Path:
    """Draws every ``*.jsonl`` under ``results``: pass@1 (with its 95% interval) against training
    wall seconds and against samples; returns the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for path in sorted(results.glob("*.jsonl")):
        recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if not recs:
            continue
        label = f"{recs[0]['system']} {recs[0]['variant']}-turn seed {recs[0]['seed']}"
        for ax, key in zip(axes, ("wall_s", "samples"), strict=True):
            xs = [r[key] for r in recs]
            ys = [r["pass1"] for r in recs]
            err = [[r["pass1"] - r["ci95"][0] for r in recs], [r["ci95"][1] - r["pass1"] for r in recs]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
    axes[0].set_xlabel("training wall seconds (eval and start-up excluded)")
    axes[1].set_xlabel("samples trained on")
    axes[0].set_ylabel("held-out pass@1 (200 prompts, 95% Wilson CI)")
    axes[1].legend(fontsize=7)
    fig.suptitle("SmolLM2-135M-Instruct on examples/stock_lookup, 2 shared CPU cores")
    fig.tight_layout()
    png = results / "learning_curve.png"
    fig.savefig(png, dpi=110)
    return png


def compare(results: Path) -> list[dict[str, Any]]:
    """Per result file: the final eval's pass@1 and interval, whether the first and last intervals
    are disjoint, and the training wall seconds of the first eval at or above TRL's final pass@1
    of the same seed (None when never reached or no TRL run is there)."""
    runs = {}
    for path in sorted(results.glob("*.jsonl")):
        recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if recs:
            runs[path.stem] = recs
    rows = []
    for name, recs in runs.items():
        first, last = recs[0], recs[-1]
        trl = runs.get(f"trl_single_seed{last['seed']}")
        target = trl[-1]["pass1"] if trl else None
        reach = next((r["wall_s"] for r in recs if target is not None and r["pass1"] >= target), None)
        rows.append({"run": name, "steps": last["step"], "pass1_first": first["pass1"], "pass1_final": last["pass1"],
                     "ci95_final": last["ci95"], "gain_not_noise": first["ci95"][1] < last["ci95"][0],
                     "wall_s_final": last["wall_s"], "trl_final_pass1": target,
                     "wall_s_to_trl_final": reach})
    return rows


def _trl_flags(argv: list[str]) -> list[str]:
    """``argv`` without the flags only this script takes (``learning_trl.py`` takes the shared ones)."""
    own = {"--variant": 1, "--backend": 1, "--engine-python": 1, "--timeout-s": 1, "--plot-only": 0,
           "--fully-async": 0, "--max-staleness": 1,
           "--profile-steps": 1}
    out, skip = [], 0
    for arg in argv:
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name in own:
            skip = own[name] if "=" not in arg else 0
            continue
        out.append(arg)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_flags(parser)
    parser.add_argument("--variant", choices=("multi", "single"), default="multi")
    parser.add_argument("--work", type=Path, default=Path("/tmp/relaxtrio-learning"))
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG and print the comparison")
    parser.add_argument("--backend", choices=("embedded", "vllm"), default="embedded",
                        help="relaxtrio's rollout engine (vllm: the CPU build from scripts/setup_vllm.sh)")
    parser.add_argument("--engine-python", type=Path, default=None,
                        help="the engine environment's interpreter (default: relaxtrio's lookup)")
    parser.add_argument("--fully-async", action="store_true",
                        help="relaxtrio trains step N while step N+1's Groups generate (--fully-async)")
    parser.add_argument("--max-staleness", type=int, default=1,
                        help="with --fully-async: the oldest weight version a trained sample may come from,"
                             " in versions behind the trainer's")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="instead of the curve: train this many steps per seed (no eval) with"
                             " OpenTelemetry spans and print where a step's time goes (the otel extra)")
    parser.add_argument("--with-trl", action="store_true",
                        help="then run learning_trl.py with the same shared flags (needs the bench extra)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.profile_steps:
        for seed in args.seeds:
            print(json.dumps(profile(args, seed), sort_keys=True), flush=True)
        return
    if not args.plot_only:
        print(json.dumps({"settings": settings(args), "variant": args.variant}), flush=True)
        start = time.monotonic()
        for seed in args.seeds:
            sink = args.out / f"{_system(args)}_{args.variant}_seed{seed}{args.tag}.jsonl"
            sink.write_text("")
            run_seed(args, seed, sink)
        if args.with_trl:
            shared = [a for a in sys.argv[1:] if a not in ("--with-trl",)]
            subprocess.run([sys.executable, str(Path(__file__).with_name("learning_trl.py")),
                            *_trl_flags(shared)], check=True)
        print(json.dumps({"elapsed_s": round(time.monotonic() - start, 1)}), flush=True)
    for row in compare(args.out):
        print(json.dumps({"compare": row}, sort_keys=True))
    print(f"curve: {plot(args.out)}")


if __name__ == "__main__":
    main()
