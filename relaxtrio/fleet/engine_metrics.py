"""The engines' own counters, read into each step's metrics row: prefix-cache hits and tokens/s.

A vLLM server serves Prometheus text at ``GET /metrics``. Per engine (summed over its label
series) it counts the prompt tokens looked up in its prefix cache
(``vllm:prefix_cache_queries_total``), those found there (``vllm:prefix_cache_hits_total``) and
the tokens it generated (``vllm:generation_tokens_total``). :class:`EngineMetrics` reads every
worker once per step and reports what changed since the previous reading (taken when the fleet
opened, for the first step):

- ``engine/prefix_cache_hit_rate/<host:port>``: hit tokens / looked-up tokens of that engine,
  and ``engine/prefix_cache_hit_rate`` over all of them (absent when nothing was looked up);
- ``engine/prefix_cache_hits`` and ``engine/prefix_cache_queries``: the token counts, summed;
- ``engine/gen_tokens_per_s/<host:port>``: generated tokens per wall second between the two
  readings (the whole step, idle time included), and their sum ``engine/gen_tokens_per_s``.

A counter that went down means the engine restarted: its new value is the change. A worker
whose metrics cannot be read costs the step nothing but a warning (once per worker).
SGLang and the embedded engine are not read (the fleet only watches vLLM workers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

import httpx

from .gateway_metrics import Sample, parse_prometheus_text

__all__ = ["COUNTERS", "EngineMetrics", "engine_counters"]

log = logging.getLogger("relaxtrio.fleet.fleet")

COUNTERS: Final[Mapping[str, str]] = {
    "queries": "vllm:prefix_cache_queries_total",
    "hits": "vllm:prefix_cache_hits_total",
    "generated": "vllm:generation_tokens_total",
}
"""Figure → vLLM counter name (summed over its series)."""


def engine_counters(samples: Iterable[Sample]) -> dict[str, float]:
    """The figures of :data:`COUNTERS` in one engine's samples (0 for a counter it lacks)."""
    out = dict.fromkeys(COUNTERS, 0.0)
    by_name = {name: figure for figure, name in COUNTERS.items()}
    for sample in samples:
        figure = by_name.get(sample.name)
        if figure is not None:
            out[figure] += sample.value
    return out


def _short(url: str) -> str:
    return url.split("://", 1)[-1]


class EngineMetrics:
    """Reads each worker's prefix-cache and generation counters; reports their change per
    reading.

    Args:
        http: the client to read ``<worker>/metrics`` with.
        timeout_s: each read's timeout.
        clock: seconds, monotonic (tokens/s is over the time between two readings).
    """

    def __init__(self, *, http: httpx.AsyncClient, timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self._http = http
        self._timeout_s = timeout_s
        self._clock = clock
        self._last: dict[str, tuple[float, dict[str, float]]] = {}
        self._warned: set[str] = set()

    async def _counters(self, url: str) -> dict[str, float] | None:
        try:
            response = await self._http.get(url + "/metrics", timeout=self._timeout_s)
            response.raise_for_status()
            return engine_counters(parse_prometheus_text(response.text))
        except (httpx.HTTPError, ValueError) as exc:
            if url not in self._warned:
                log.warning("fleet: could not read the engine metrics at %s/metrics: %s", url, exc)
                self._warned.add(url)
            return None

    async def read(self, urls: Sequence[str]) -> dict[str, float]:
        """What the counters of the workers ``urls`` did since the previous call (a worker read
        for the first time sets its baseline and reports nothing).

        Returns:
            The figures of the module docstring; empty when no worker had a previous reading.

        Cancellation:
            A checkpoint; a cancelled call records nothing for the workers not yet read.
        """
        row: dict[str, float] = {}
        totals = dict.fromkeys(COUNTERS, 0.0)
        rate_total, seen = 0.0, False
        for url in urls:
            counters = await self._counters(url)
            if counters is None:
                continue
            now = self._clock()
            before = self._last.get(url)
            self._last[url] = (now, counters)
            if before is None:
                continue
            then, old = before
            change = {k: v - old[k] if v >= old[k] else v for k, v in counters.items()}
            seen = True
            for figure, value in change.items():
                totals[figure] += value
            name = _short(url)
            if change["queries"] > 0:
                row[f"engine/prefix_cache_hit_rate/{name}"] = change["hits"] / change["queries"]
            rate = change["generated"] / (now - then) if now > then else 0.0
            row[f"engine/gen_tokens_per_s/{name}"] = rate
            rate_total += rate
        if not seen:
            return row
        row["engine/prefix_cache_hits"] = totals["hits"]
        row["engine/prefix_cache_queries"] = totals["queries"]
        if totals["queries"] > 0:
            row["engine/prefix_cache_hit_rate"] = totals["hits"] / totals["queries"]
        row["engine/gen_tokens_per_s"] = rate_total
        return row
