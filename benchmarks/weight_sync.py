"""Per-step weight-sync seconds: through the disk vs through shared memory, in one run.

Launches ``--engines`` embedded engines (``python -m relaxtrio.engine``) on SmolLM2-135M (or the
tiny test model with ``--tiny``), loads the same model here as the "trainer", and per step
nudges every parameter (a stand-in for an optimizer step), then brings every engine to the new
version, alternately with each store of :mod:`relaxtrio.train.weight_store`:

- ``disk``: ``save_pretrained`` into ``<weights dir>/<version>`` (absolute), every engine loads
  the directory (``/update_weights_from_disk``), the previous version directory is deleted;
- ``shm``: the parameters are copied into the shared-memory mailbox, every engine copies them
  from it (same route, the manifest path as ``model_path``).

Both go through :meth:`EngineFleet.update_weights` (pause → load → check ``/model_info`` →
continue on every engine). After each step one greedy generation checks that the engines serve
the new weights: its logprobs must equal the ones of the previous method's step on the same
weights. Prints one JSON line:

    {"bench": "weight_sync", "disk_s": [...], "shm_s": [...], "disk_mean_s": ..., "shm_mean_s": ...,
     "speedup": ..., "engines": 2, "model_bytes": ..., ...}

``*_s[i]`` = wall seconds of step i, writing included. Usage:
``python benchmarks/weight_sync.py [--steps 3] [--engines 2] [--tiny]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import trio

from relaxtrio.config import FleetConfig
from relaxtrio.models import ensure_smollm2, load_model
from relaxtrio.fleet.fleet import EngineFleet, open_engine_fleet
from relaxtrio.fleet.launch_fleet import open_launched_fleet
from relaxtrio.sglang.wire import SamplingParams
from relaxtrio.train.weight_store import DiskWeightStore, ShmWeightStore, WeightStore

_PROMPT = [1, 87, 555, 201, 57, 74, 271, 321, 294, 284, 446, 295]  # in every vocab used here
_GREEDY = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)


async def _sync(fleet: EngineFleet, store: WeightStore, model: torch.nn.Module,
                version: str) -> float:
    start = time.perf_counter()
    path = await trio.to_thread.run_sync(store.write, model, version)
    await fleet.update_weights(path, version)
    await trio.to_thread.run_sync(store.retire, path)
    return time.perf_counter() - start


async def _probe(fleet: EngineFleet, tag: str) -> list[list[float]]:
    out = []
    for i, url in enumerate(fleet.urls):
        result = await fleet.generate(_PROMPT, _GREEDY, rid=f"{tag}-{i}#", routing_key=url)
        out.append(list(result.output_logprobs))
    return out


async def run(model_dir: Path, steps: int, engines: int) -> dict:
    model = await trio.to_thread.run_sync(load_model, model_dir)
    model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    config = FleetConfig(num_engines=engines, health_interval_s=5.0)
    times: dict[str, list[float]] = {"disk": [], "shm": []}
    with tempfile.TemporaryDirectory(prefix="relaxtrio-bench-") as tmp:
        stores = {"disk": DiskWeightStore(Path(tmp) / "weights"), "shm": ShmWeightStore()}
        try:
            async with (
                open_launched_fleet(config, model_dir=model_dir, log_dir=Path(tmp) / "logs",
                                    kind="embedded") as launched,
                open_engine_fleet(config, worker_urls=launched.worker_urls) as fleet,
            ):
                launched.attach(fleet)
                for method in ("disk", "shm"):  # warm-up: first-call costs of either path
                    await _sync(fleet, stores[method], model, f"warmup-{method}")
                for step in range(steps):
                    with torch.no_grad():
                        for param in model.parameters():
                            param.mul_(1.0 + 1e-3 * (-1) ** step)
                    seen = []
                    for method in ("disk", "shm"):
                        times[method].append(
                            await _sync(fleet, stores[method], model, f"step-{step}-{method}"))
                        seen.append(await _probe(fleet, f"s{step}-{method}"))
                    assert seen[0] == seen[1], "disk and shm gave the engines different weights"
        finally:
            for store in stores.values():
                store.close()
    disk, shm = statistics.mean(times["disk"]), statistics.mean(times["shm"])
    return {
        "bench": "weight_sync",
        "disk_s": [round(t, 3) for t in times["disk"]],
        "shm_s": [round(t, 3) for t in times["shm"]],
        "disk_mean_s": round(disk, 3),
        "shm_mean_s": round(shm, 3),
        "speedup": round(disk / shm, 2),
        "engines": engines,
        "steps": steps,
        "model": model_dir.name,
        "model_bytes": model_bytes,
        "cpu_count": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="the tiny test model, not SmolLM2")
    args = parser.parse_args(argv)
    if args.tiny:
        from relaxtrio.testing.tiny_models import build_tiny_model

        model_dir = build_tiny_model(Path(tempfile.mkdtemp(prefix="relaxtrio-tiny-")))
    else:
        model_dir = ensure_smollm2()
    print(json.dumps(trio.run(run, model_dir, args.steps, args.engines)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
