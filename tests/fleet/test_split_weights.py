"""A mixed fleet's weights: shared memory for the engines on this machine, the directory for the
others (each worker is handed the path it can read), a worker that joins later included."""

from __future__ import annotations

from pathlib import Path

import torch
import trio

from relaxtrio.config import FleetConfig
from relaxtrio.run.inference import Inference, SplitWeightStore
from relaxtrio.models import load_model
from relaxtrio.fleet.fleet import open_engine_fleet
from relaxtrio.sglang.wire import SamplingParams
from relaxtrio.train.weight_store import DiskWeightStore, ShmWeightStore

PROMPT = [1, 87, 555, 201, 57, 74, 271, 321]
SHORT = SamplingParams(max_new_tokens=3, temperature=0.0)


async def test_each_worker_loads_the_store_it_can_read(start_engines, tiny_model_dir: Path,
                                                       tmp_path: Path) -> None:
    engines = await start_engines(2)
    near, far = engines.urls
    model = load_model(tiny_model_dir)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05)
    store = SplitWeightStore(ShmWeightStore(tmp_path), DiskWeightStore(tmp_path / "weights"),
                             frozenset({near}))
    config = FleetConfig(engine_urls=tuple(engines.urls), health_interval_s=0.5)
    try:
        with trio.fail_after(120):
            async with open_engine_fleet(config, worker_urls=engines.urls) as fleet:
                inference = Inference(fleet=fleet, store=store)
                await inference.push(model, "step-1")
                paths = {url: (await fleet.model_info(url))["model_path"] for url in engines.urls}
                assert paths[near].endswith("manifest.json")
                assert paths[far] == str(tmp_path / "weights" / "step-1")
                result = await fleet.generate(PROMPT, SHORT, rid="a:t0#", routing_key="a")
                assert result.weight_version == "step-1"
                # A worker that comes back is handed its path again.
                fleet.remove(far, "test: restarted", restarting=True)
                await fleet.readmit(far)
                assert (await fleet.model_info(far))["model_path"] == paths[far]
                assert (await fleet.model_info(far))["weight_version"] == "step-1"
    finally:
        store.close()
    assert not (tmp_path / "weights").exists()
