"""Start-up of one launched embedded engine: a local process vs a Ray actor, in one run.

Starts a local Ray instance (``ray.init(num_cpus=...)``, timed as ``ray_start_s``), then, in
``--rounds`` alternating rounds, launches one embedded engine through
:func:`~relaxtrio.fleet.launch_fleet.open_launched_fleet` with the local starter and with
:class:`~relaxtrio.cluster.engines.RayEngineStarter`, each until its ``/health`` answers, and
stops it again. The model is the tiny test model (``--smollm2`` for SmolLM2-135M). Prints one
JSON line:

    {"bench": "ray_engines", "ray_start_s": ..., "local_s": [...], "ray_s": [...],
     "local_mean_s": ..., "ray_mean_s": ..., "ray_over_local_s": ..., "rounds": 3}

``*_s[i]`` = wall seconds from the launch call to a healthy engine in round ``i`` (Ray: actor
placement, the actor's worker process and the engine process on its node). Usage:
``python benchmarks/ray_engines.py [--rounds 3] [--smollm2]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import trio

from relaxtrio.config import FleetConfig
from relaxtrio.fleet.launch_fleet import open_launched_fleet


async def _startup_s(model_dir: Path, log_dir: Path, starter: object | None) -> float:
    start = time.perf_counter()
    async with open_launched_fleet(FleetConfig(num_engines=1), model_dir=model_dir,
                                   log_dir=log_dir, kind="embedded", starter=starter):
        return time.perf_counter() - start


async def _rounds(args: argparse.Namespace, model_dir: Path, tmp: Path,
                  out: dict[str, object]) -> dict[str, object]:
    from relaxtrio.cluster.engines import RayEngineStarter

    starter = await trio.to_thread.run_sync(
        functools.partial(RayEngineStarter.connect, "auto", num_cpus=1.0))
    local, remote = [], []
    for i in range(args.rounds):
        local.append(await _startup_s(model_dir, tmp / f"local-{i}", None))
        remote.append(await _startup_s(model_dir, tmp / f"ray-{i}", starter))
    out.update(local_s=[round(s, 2) for s in local], ray_s=[round(s, 2) for s in remote],
               local_mean_s=round(statistics.mean(local), 2),
               ray_mean_s=round(statistics.mean(remote), 2),
               ray_over_local_s=round(statistics.mean(remote) - statistics.mean(local), 2))
    return out


def main() -> None:
    import ray

    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--smollm2", action="store_true", help="SmolLM2-135M instead of the tiny model")
    args = p.parse_args()
    out: dict[str, object] = {"bench": "ray_engines", "rounds": args.rounds, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        if args.smollm2:
            from relaxtrio.models import ensure_smollm2

            model_dir = ensure_smollm2()
        else:
            from relaxtrio.testing.tiny_models import build_tiny_model

            model_dir = build_tiny_model(Path(tmp) / "model")
        # On this thread: Ray ties the processes it starts to the thread that started them
        # (a trio worker thread exits when idle, and Ray's GCS would go with it).
        start = time.perf_counter()
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}})
        out["ray_start_s"] = round(time.perf_counter() - start, 2)
        try:
            trio.run(_rounds, args, model_dir, Path(tmp), out)
        finally:
            ray.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
