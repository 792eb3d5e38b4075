"""Prefix-cache hits and tokens/s per step from a real vLLM server's own counters, as the fleet
opened by ``open_fleet`` reads them into the step's metrics row
(:mod:`relaxtrio.fleet.engine_metrics`)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Final

import pytest
import trio
from tests.vllm.vllm_helpers import VllmServer

from relaxtrio.config import FleetConfig
from relaxtrio.fleet.connect import open_fleet
from relaxtrio.sglang.wire import SamplingParams

pytestmark = pytest.mark.slow  # a real vLLM server

# Longer than a few KV blocks (vLLM's CPU block is 128 tokens at most), and new to the server
# even when it is reused across test sessions (RELAXTRIO_VLLM_URLS): a random start.
_START: Final = random.Random().randrange(40000)
SHARED_PREFIX: Final = tuple(100 + (_START + i * 6151) % 40000 for i in range(600))


async def test_a_step_reports_the_prefix_cache_hits_of_a_shared_prefix(vllm_server: VllmServer,
                                                                      tmp_path: Path):
    sampling = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    config = FleetConfig(engine_urls=(vllm_server.url,), backend="vllm")
    with trio.fail_after(300):
        async with open_fleet(config, model_dir=vllm_server.model_dir, log_dir=tmp_path) as opened:
            metrics = opened.fleet.engine_counters
            quiet = await metrics.read(opened.fleet.workers)  # nothing ran since the fleet opened
            for i, tail in enumerate((11, 12)):  # the same prefix, two Sessions
                await opened.fleet.generate((*SHARED_PREFIX, tail), sampling, rid=f"metrics-{i}#",
                                            routing_key=f"s{i}")
            row = await metrics.read(opened.fleet.workers)
    name = vllm_server.url.split("://", 1)[1]
    print(f"\nvLLM engine counters over 2 requests sharing {len(SHARED_PREFIX)} tokens: {row}")
    assert quiet[f"engine/generated_tokens/{name}"] == 0 and f"engine/prefix_cache_hit_rate/{name}" not in quiet
    assert row[f"engine/generated_tokens/{name}"] == 8
    # The second request finds the whole blocks of the shared prefix: between 1/4 and 1/2 of
    # the prompt tokens both requests looked up.
    assert 0.25 <= row[f"engine/prefix_cache_hit_rate/{name}"] <= 0.5
    assert row[f"engine/tokens_per_s/{name}"] > 0
