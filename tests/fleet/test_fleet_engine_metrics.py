"""Each engine's own counters in the step's metrics row (``engine/<figure>/<host:port>``)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import trio

from relaxtrio.config import FleetConfig
from relaxtrio.fleet.engine_metrics import EngineCounters, EngineMetrics, step_figures, vllm_counters_from
from relaxtrio.fleet.gateway_metrics import parse_prometheus_text
from relaxtrio.fleet.fleet import open_engine_fleet
from relaxtrio.sglang.client import SamplingParams, open_engine_client

PROMPT = list(range(100, 160))  # 60 ids: the second request reuses 59 of them
GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)


def test_figures_are_the_change_between_two_readings() -> None:
    before = EngineCounters(generated_tokens=10, prefill_tokens=100, prefix_hit_tokens=20,
                            admitted_requests=2, queue_s=1.0)
    now = EngineCounters(generated_tokens=50, prefill_tokens=200, prefix_hit_tokens=80,
                         admitted_requests=6, queue_s=3.0)
    assert step_figures("h:1", now, before, elapsed_s=4.0) == {
        "engine/generated_tokens/h:1": 40.0, "engine/tokens_per_s/h:1": 10.0,
        "engine/prefix_cache_hit_rate/h:1": 0.6, "engine/queue_s/h:1": 0.5,
    }
    # a counter that went down: the engine restarted, its new value is the change
    restarted = EngineCounters(generated_tokens=5, prefill_tokens=10, prefix_hit_tokens=0,
                               admitted_requests=1, queue_s=0.25)
    assert step_figures("h:1", restarted, now, elapsed_s=1.0) == {
        "engine/generated_tokens/h:1": 5.0, "engine/tokens_per_s/h:1": 5.0,
        "engine/prefix_cache_hit_rate/h:1": 0.0, "engine/queue_s/h:1": 0.25,
    }
    # a backend that counts only tokens; nothing prefilled or admitted: no rate, no queue time
    assert step_figures("h:1", EngineCounters(generated_tokens=3), None, elapsed_s=3.0) == {
        "engine/generated_tokens/h:1": 3.0, "engine/tokens_per_s/h:1": 1.0}


async def test_two_requests_sharing_a_prefix_show_a_hit_rate(start_engines: Callable) -> None:
    engines = await start_engines(1, max_running_requests=1)
    url = engines.urls[0]
    config = FleetConfig(engine_urls=engines.urls, health_interval_s=60.0)
    async with open_engine_fleet(config, worker_urls=engines.urls) as fleet:
        metrics = EngineMetrics()
        engine = url.split("://", 1)[-1]
        assert await metrics.read(fleet.workers) == {
            f"engine/generated_tokens/{engine}": 0.0, f"engine/tokens_per_s/{engine}": 0.0}
        async with open_engine_client(url) as client:
            with trio.fail_after(60):
                async with trio.open_nursery() as calls:  # one row: the second one queues
                    calls.start_soon(functools.partial(client.generate, PROMPT, GREEDY, rid="a"))
                    calls.start_soon(functools.partial(client.generate, PROMPT[:-1] + [999], GREEDY,
                                                       rid="b"))
        row = await metrics.read(fleet.workers)
        assert row[f"engine/generated_tokens/{engine}"] == 16.0
        assert row[f"engine/tokens_per_s/{engine}"] > 0
        # 120 ids prefilled, 59 of the second request's from the cache (its first 59 ids)
        assert row[f"engine/prefix_cache_hit_rate/{engine}"] == pytest.approx(59 / 120)
        assert row[f"engine/queue_s/{engine}"] > 0  # the second waited for the first's row
        assert set(row) == {f"engine/{figure}/{engine}" for figure in (
            "generated_tokens", "tokens_per_s", "prefix_cache_hit_rate", "queue_s")}
        assert fleet.engine_counters is not metrics  # the fleet keeps its own baseline


async def test_a_worker_no_reader_recognises_adds_no_figures(start_engines: Callable) -> None:
    engines = await start_engines(1)
    config = FleetConfig(engine_urls=engines.urls, health_interval_s=60.0)
    async with open_engine_fleet(config, worker_urls=engines.urls) as fleet:

        async def other_backend(worker: object) -> EngineCounters | None:
            return None

        assert await EngineMetrics(readers=[other_backend]).read(fleet.workers) == {}


def test_vllm_counters_sum_each_counter_over_its_series() -> None:
    text = "\n".join([
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
        "# TYPE vllm:prefix_cache_queries_total counter",
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1202.0',
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 512.0',
        'vllm:generation_tokens_total{engine="0",model_name="m"} 6.0',
        'vllm:generation_tokens_total{engine="1",model_name="m"} 2.0',
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0',
    ])
    counters = vllm_counters_from(parse_prometheus_text(text))
    assert counters == EngineCounters(generated_tokens=8.0, prefill_tokens=1202.0, prefix_hit_tokens=512.0)
    figures = step_figures("h:1", counters, None, 2.0)
    assert figures == {"engine/generated_tokens/h:1": 8.0, "engine/tokens_per_s/h:1": 4.0,
                       "engine/prefix_cache_hit_rate/h:1": 512 / 1202}
