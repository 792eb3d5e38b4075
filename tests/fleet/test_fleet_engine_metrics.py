"""Reading the engines' own counters per step (no process: each worker's Prometheus text is
given by a test transport; the real server's is read in tests/vllm/test_vllm_engine_metrics.py)."""

from __future__ import annotations

import httpx
import pytest

from relaxtrio.fleet.engine_metrics import EngineMetrics, engine_counters
from relaxtrio.fleet.gateway_metrics import parse_prometheus_text

# As vLLM 0.32 writes them (one engine, its labels), with a counter relaxtrio does not read.
TEXT = '''# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="/m"}} {queries}
vllm:prefix_cache_hits_total{{engine="0",model_name="/m"}} {hits}
vllm:generation_tokens_total{{engine="0",model_name="/m"}} {generated}
vllm:prompt_tokens_total{{engine="0",model_name="/m"}} 99
'''


def test_engine_counters_pick_the_prefix_cache_and_generation_counters() -> None:
    samples = parse_prometheus_text(TEXT.format(queries=800, hits=256, generated=12))
    assert engine_counters(samples) == {"queries": 800.0, "hits": 256.0, "generated": 12.0}
    assert engine_counters([]) == {"queries": 0.0, "hits": 0.0, "generated": 0.0}


async def test_each_reading_reports_the_change_since_the_last() -> None:
    counters = {"a:1": dict(queries=100, hits=0, generated=10),
                "b:2": dict(queries=0, hits=0, generated=0)}
    now = [0.0]

    def reply(request: httpx.Request) -> httpx.Response:
        host = f"{request.url.host}:{request.url.port}"
        if host not in counters:
            return httpx.Response(503)
        return httpx.Response(200, text=TEXT.format(**counters[host]))

    urls = ("http://a:1", "http://b:2", "http://gone:3")
    async with httpx.AsyncClient(transport=httpx.MockTransport(reply)) as http:
        metrics = EngineMetrics(http=http, clock=lambda: now[0])
        assert await metrics.read(urls) == {}  # the baseline
        counters["a:1"] = dict(queries=900, hits=512, generated=110)  # a step: 800 looked up
        counters["b:2"] = dict(queries=200, hits=0, generated=30)
        now[0] = 10.0
        row = await metrics.read(urls)
        assert row == {
            "engine/prefix_cache_hit_rate/a:1": 512 / 800, "engine/gen_tokens_per_s/a:1": 10.0,
            "engine/prefix_cache_hit_rate/b:2": 0.0, "engine/gen_tokens_per_s/b:2": 3.0,
            "engine/prefix_cache_hits": 512.0, "engine/prefix_cache_queries": 1000.0,
            "engine/prefix_cache_hit_rate": pytest.approx(0.512), "engine/gen_tokens_per_s": 13.0,
        }
        counters["a:1"] = dict(queries=40, hits=20, generated=4)  # restarted: counts from 0
        now[0] = 12.0
        row = await metrics.read(urls[:1])
        assert row["engine/prefix_cache_hit_rate"] == 0.5 and row["engine/gen_tokens_per_s"] == 2.0
        now[0] = 14.0  # an idle step: nothing looked up, so no hit rate
        assert await metrics.read(urls[:1]) == {
            "engine/gen_tokens_per_s/a:1": 0.0, "engine/prefix_cache_hits": 0.0,
            "engine/prefix_cache_queries": 0.0, "engine/gen_tokens_per_s": 0.0}
