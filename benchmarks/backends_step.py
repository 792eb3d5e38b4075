"""The main job's step time per rollout backend, side by side: the embedded engine and vLLM.

Runs ``python -m relaxtrio train`` (the main job: the default example, ``--num-rollout`` steps)
once per backend, one after the other in the same run: ``embedded`` (the default) and ``vllm``
(``--rollout-backend vllm``, launched from its own venv: ``--engine-python``,
``$RELAXTRIO_VLLM_PYTHON`` or ``.engines/vllm``, built by ``scripts/setup_vllm.sh``). From each
job's ``metrics.jsonl`` it prints, per step, ``step_s``, ``rollout_s``, ``update_s``,
``weight_sync_s`` (write + pause + reload + continue) and ``weight_pause_s`` (pause to continue:
the engines stand still), and per job its wall time and ``start_s`` (wall time less the steps:
start-up, engine launch included, and shutdown); vLLM step lines also carry the engines' own
counters (``engine/prefix_cache_hit_rate/<engine>``, ``engine/tokens_per_s/<engine>``, ...). The summary line gives the means over the steady
steps (all but the first; every step with fewer than 2) and the ratios vLLM / embedded.

One run per backend: on a shared machine read the load averages printed with each job, and
compare ``update_s`` (the same trainer work on both) to see how much of a ratio is the load;
``--backends vllm embedded`` runs them in the other order. Usage:
``python benchmarks/backends_step.py [--num-rollout 3] [--backends embedded vllm] [-- extra train
flags]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from _bench import emit, load_average

REPO: Final = Path(__file__).resolve().parents[1]
FIGURES: Final = ("step_s", "rollout_s", "update_s", "weight_sync_s", "weight_pause_s")


def _vllm_python(given: Path | None) -> Path:
    configured = given or os.environ.get("RELAXTRIO_VLLM_PYTHON")
    path = Path(configured) if configured else REPO / ".engines" / "vllm" / "bin" / "python"
    if not path.is_file():
        sys.exit(f"no vLLM environment at {path}: run scripts/setup_vllm.sh or pass --engine-python")
    return path


def _job(backend: str, args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Run the main job on ``backend``; returns its per-step rows, wall time and loads."""
    flags = ["--num-rollout", str(args.num_rollout), "--output-dir", str(out_dir),
             "--log-level", "WARNING", *args.train_flags]
    if backend == "vllm":
        flags += ["--rollout-backend", "vllm", "--engine-python", str(_vllm_python(args.engine_python))]
    load_before = load_average()
    start = time.monotonic()
    with (out_dir.parent / f"{backend}.log").open("w") as log:
        done = subprocess.run([sys.executable, "-m", "relaxtrio", "train", *flags], cwd=REPO,
                              stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout_s, check=False)
    wall_s = time.monotonic() - start
    if done.returncode != 0:
        tail = (out_dir.parent / f"{backend}.log").read_text()[-3000:]
        sys.exit(f"{backend}: train exited with {done.returncode}:\n{tail}")
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    for i, row in enumerate(rows):
        emit({"bench": "backends_step", "backend": backend, "step": i,
              **{k: round(row[k], 3) for k in FIGURES if k in row},
              "dropped_groups": row.get("dropped_groups"),
              **{k: round(v, 3) for k, v in row.items() if k.startswith("engine/")}})
    return {"rows": rows, "wall_s": wall_s, "load_before": load_before, "load_after": load_average(),
            "start_s": wall_s - sum(row["step_s"] for row in rows)}


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    steady = rows[1:] if len(rows) > 1 else rows
    values = [row[key] for row in steady if key in row]
    return sum(values) / len(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-rollout", type=int, default=3, help="steps per job (the main job: 3)")
    parser.add_argument("--backends", nargs="+", choices=("embedded", "vllm"), default=["embedded", "vllm"])
    parser.add_argument("--engine-python", type=Path, default=None, help="the vLLM venv's Python")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="per job")
    parser.add_argument("train_flags", nargs="*", help="after --: extra flags of both jobs")
    args = parser.parse_args()
    jobs = {}
    with tempfile.TemporaryDirectory(prefix="backends-step-") as tmp:
        for backend in args.backends:
            jobs[backend] = _job(backend, args, Path(tmp) / backend)
    summary: dict[str, Any] = {"bench": "backends_step_summary", "num_rollout": args.num_rollout}
    for backend, job in jobs.items():
        summary[backend] = {
            **{f"{k}_mean": round(v, 3) for k in FIGURES if (v := _mean(job["rows"], k)) is not None},
            "wall_s": round(job["wall_s"], 1), "start_s": round(job["start_s"], 1),
            "load_before": job["load_before"], "load_after": job["load_after"]}
    if {"embedded", "vllm"} <= jobs.keys():
        summary["ratio_vllm_over_embedded"] = {
            key: round(summary["vllm"][key] / summary["embedded"][key], 2)
            for key in (*(f"{k}_mean" for k in FIGURES), "wall_s")
            if summary["embedded"].get(key) and key in summary["vllm"]}
    emit(summary)


if __name__ == "__main__":
    main()
