"""Each engine's own counters, read into each step's metrics row as per-engine figures.

Once per step :class:`EngineMetrics` reads every healthy worker's cumulative counters
(:class:`EngineCounters`) and reports what changed since its previous reading of that worker:

- ``engine/tokens_per_s/<host:port>``: tokens generated per wall second;
- ``engine/prefix_cache_hit_rate/<host:port>``: prompt ids served from the prefix cache over
  prompt ids prefilled (absent when nothing was prefilled);
- ``engine/queue_s/<host:port>``: mean seconds a request waited in the engine's queue before it
  was admitted (absent when none was admitted);
- ``engine/generated_tokens/<host:port>``: the tokens behind the rate.

Each backend reads its counters its own way: :data:`READERS` holds one function per backend,
tried in order on a worker until one recognises it (the first that does is kept for that URL).
The embedded engine's reader takes ``internal_states[0]`` of its ``/server_info``
(:class:`relaxtrio.engine.scheduler.SchedulerStatistics`); vLLM's reads its Prometheus text at
``GET /metrics``, summing each counter of :data:`VLLM_COUNTERS` over its label series. A worker no reader recognises adds no
figures; a failed read costs the step nothing but a warning. A counter that went down means the
engine restarted: its new value is the change.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

import attrs
import httpx

from .._errors import BackendError
from ..vllm.client import VllmEngineClient
from .gateway_metrics import Sample, parse_prometheus_text
from .members import Worker

__all__ = ["READERS", "VLLM_COUNTERS", "CounterReader", "EngineCounters", "EngineMetrics",
           "embedded_counters", "step_figures", "vllm_counters", "vllm_counters_from"]

log = logging.getLogger("relaxtrio.fleet.fleet")


@attrs.frozen(kw_only=True)
class EngineCounters:
    """One engine's cumulative counters (since it started).

    Attributes:
        generated_tokens: tokens sampled.
        prefill_tokens: prompt ids prefilled (computed plus served from the prefix cache), or
            None when the backend does not count them.
        prefix_hit_tokens: prompt ids served from the prefix cache, or None.
        admitted_requests: requests taken from the queue into a batch, or None.
        queue_s: their seconds in the queue, summed, or None.
    """

    generated_tokens: float
    prefill_tokens: float | None = None
    prefix_hit_tokens: float | None = None
    admitted_requests: float | None = None
    queue_s: float | None = None


CounterReader = Callable[[Worker], Awaitable[EngineCounters | None]]
"""Reads one worker's counters; None when the worker is not of the reader's backend.
Raises :class:`BackendError` (or ``KeyError``, ``TypeError``, ``ValueError`` on a malformed
answer) when the worker is of its backend but could not be read."""


async def embedded_counters(worker: Worker) -> EngineCounters | None:
    """The embedded engine's counters from ``GET /server_info`` (None for any other engine).

    Raises:
        BackendError: the call failed.
    """
    info: Mapping[str, Any] = await worker.client.server_info()
    if info.get("frontend") != "relaxtrio":
        return None
    stats = info["internal_states"][0]
    return EngineCounters(
        generated_tokens=float(stats["num_generated_tokens"]),
        prefill_tokens=float(stats["num_prefill_tokens"]),
        prefix_hit_tokens=float(stats["num_prefix_hit_tokens"]),
        admitted_requests=float(stats["num_admitted_reqs"]),
        queue_s=float(stats["queue_time_s"]),
    )


VLLM_COUNTERS: Final[Mapping[str, str]] = {
    "generated_tokens": "vllm:generation_tokens_total",
    "prefill_tokens": "vllm:prefix_cache_queries_total",
    "prefix_hit_tokens": "vllm:prefix_cache_hits_total",
}
""":class:`EngineCounters` field → the vLLM counter it sums (prompt tokens looked up in the prefix
cache count as prefilled)."""


def vllm_counters_from(samples: list[Sample]) -> EngineCounters:
    """The counters of one vLLM server's ``/metrics`` samples (0 for a counter it lacks)."""
    by_name = {name: field for field, name in VLLM_COUNTERS.items()}
    sums = dict.fromkeys(VLLM_COUNTERS, 0.0)
    for sample in samples:
        field = by_name.get(sample.name)
        if field is not None:
            sums[field] += sample.value
    return EngineCounters(**sums)


async def vllm_counters(worker: Worker) -> EngineCounters | None:
    """A vLLM server's counters from ``GET /metrics`` (None for any other engine).

    Raises:
        BackendError: the call failed.
        ValueError: the text is not Prometheus text.
    """
    if not isinstance(worker.client, VllmEngineClient):
        return None
    try:  # once per step per worker: a short-lived client costs nothing that matters
        async with httpx.AsyncClient(timeout=10.0) as http:
            response = await http.get(worker.url + "/metrics")
            response.raise_for_status()
    except httpx.HTTPError as exc:
        raise BackendError(f"GET {worker.url}/metrics failed: {exc}") from exc
    return vllm_counters_from(parse_prometheus_text(response.text))


READERS: list[CounterReader] = [vllm_counters, embedded_counters]  # the type check first
"""The per-backend readers, tried in order on a worker not yet recognised."""


def _change(now: float | None, before: float | None) -> float | None:
    if now is None:
        return None
    if before is None:
        return now
    return now if now < before else now - before  # went down: the engine restarted


def step_figures(engine: str, now: EngineCounters, before: EngineCounters | None,
                 elapsed_s: float) -> dict[str, float]:
    """The row's figures of one engine from two readings ``elapsed_s`` wall seconds apart.

    Args:
        engine: the key suffix (``host:port``).
        now: this reading.
        before: the previous reading, or None (counted from the engine's start).
        elapsed_s: seconds between the readings (> 0).

    Returns:
        ``engine/<figure>/<engine>`` → value; see the module docstring for the figures.
    """
    old = before or EngineCounters(generated_tokens=0.0)
    tokens = _change(now.generated_tokens, old.generated_tokens) or 0.0
    row = {f"engine/generated_tokens/{engine}": tokens,
           f"engine/tokens_per_s/{engine}": tokens / max(elapsed_s, 1e-9)}
    prefill = _change(now.prefill_tokens, old.prefill_tokens)
    hits = _change(now.prefix_hit_tokens, old.prefix_hit_tokens)
    if prefill and hits is not None:
        row[f"engine/prefix_cache_hit_rate/{engine}"] = hits / prefill
    admitted = _change(now.admitted_requests, old.admitted_requests)
    queued = _change(now.queue_s, old.queue_s)
    if admitted and queued is not None:
        row[f"engine/queue_s/{engine}"] = queued / admitted
    return row


class EngineMetrics:
    """Reads the workers' counters and reports the change per reading (see the module docstring).

    Args:
        readers: the per-backend readers (default :data:`READERS`).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, readers: Iterable[CounterReader] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self._readers = tuple(READERS if readers is None else readers)
        self._clock = clock
        self._started = clock()
        self._chosen: dict[str, CounterReader | None] = {}  # URL → its reader (None: no reader)
        self._last: dict[str, tuple[EngineCounters, float]] = {}
        self._warned: set[str] = set()

    async def _counters(self, worker: Worker) -> EngineCounters | None:
        if worker.url in self._chosen:
            reader = self._chosen[worker.url]
            return None if reader is None else await reader(worker)
        for reader in self._readers:
            counters = await reader(worker)
            if counters is not None:
                self._chosen[worker.url] = reader
                return counters
        self._chosen[worker.url] = None
        return None

    async def read(self, workers: Iterable[Worker]) -> dict[str, float]:
        """Each worker's figures since the previous call (since this object was made, for a
        worker read the first time): ``engine/<figure>/<host:port>``.

        Returns:
            The figures; a worker that could not be read is left out (warned once per URL).

        Cancellation:
            A checkpoint; a worker read before the cancel keeps its new baseline.
        """
        row: dict[str, float] = {}
        for worker in workers:
            try:
                counters = await self._counters(worker)
            except (BackendError, KeyError, IndexError, TypeError, ValueError) as exc:
                if worker.url not in self._warned:
                    log.warning("fleet: could not read the counters of %s: %s", worker.url, exc)
                    self._warned.add(worker.url)
                continue
            if counters is None:
                continue
            now = self._clock()
            before, since = self._last.get(worker.url, (None, self._started))
            row.update(step_figures(worker.url.split("://", 1)[-1], counters, before, now - since))
            self._last[worker.url] = (counters, now)
        return row
