"""The gateway's per-worker counters, read into each step's metrics row.

The launched gateway (PyPI ``smg`` 1.13) serves Prometheus text on its metrics port
(``--prometheus-port``, :func:`relaxtrio.fleet.launch_fleet.gateway_command`). Per worker
(label ``worker="<base URL>"``) it counts the requests it sent there
(``smg_worker_requests_total``) and those that failed there
(``smg_worker_cb_outcomes_total{outcome="failure"}``: the circuit breaker's bookkeeping, kept
with the breaker itself off); across workers, the errors by type (``smg_worker_errors_total``,
which carries no worker label). A worker deleted from the gateway loses its series, so its last
failures show only in the total. :class:`GatewayMetrics` reads them once per step and reports
what changed since the previous reading: ``gateway/requests/<host:port>``,
``gateway/failures/<host:port>``, their sums ``gateway/requests`` and ``gateway/failures``, and
``gateway/errors``. A counter that went down means the gateway restarted: its new value is the
change. An unreachable metrics port costs the step nothing but a warning.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from typing import Final

import attrs
import httpx

__all__ = ["FIGURES", "TOTALS", "GatewayMetrics", "Sample", "parse_prometheus_text",
           "worker_counters"]

log = logging.getLogger("relaxtrio.fleet.fleet")

FIGURES: Final[Mapping[str, tuple[str, Mapping[str, str]]]] = {
    "requests": ("smg_worker_requests_total", {}),
    "failures": ("smg_worker_cb_outcomes_total", {"outcome": "failure"}),
}
"""Per-worker figure → (counter name, labels a series must have); summed over its series."""
TOTALS: Final[Mapping[str, str]] = {"errors": "smg_worker_errors_total"}
"""Fleet-wide figure → counter name (summed over all its series)."""


@attrs.frozen
class Sample:
    """One sample line of Prometheus text: ``name{labels} value``."""

    name: str
    labels: Mapping[str, str]
    value: float


_ESCAPES: Final = {"\\": "\\", '"': '"', "n": "\n"}


def _parse_labels(text: str, start: int, line: str) -> tuple[dict[str, str], int]:
    """The labels of ``{a="x",b="y"}`` beginning at ``text[start] == "{"``; returns them and the
    index after ``}``."""
    labels: dict[str, str] = {}
    i = start + 1
    while True:
        while i < len(text) and text[i] in " ,":
            i += 1
        if i < len(text) and text[i] == "}":
            return labels, i + 1
        eq = text.find("=", i)
        if eq < 0 or eq + 1 >= len(text) or text[eq + 1] != '"':
            raise ValueError(f"bad labels in metrics line {line!r}")
        key, i, value = text[i:eq].strip(), eq + 2, []
        while i < len(text) and text[i] != '"':
            if text[i] == "\\" and i + 1 < len(text):
                value.append(_ESCAPES.get(text[i + 1], "\\" + text[i + 1]))
                i += 2
            else:
                value.append(text[i])
                i += 1
        if i >= len(text):
            raise ValueError(f"unterminated label value in metrics line {line!r}")
        labels[key] = "".join(value)
        i += 1


def parse_prometheus_text(text: str) -> list[Sample]:
    """The samples of a Prometheus text exposition (``# HELP`` / ``# TYPE`` lines and blank
    lines skipped; a trailing timestamp ignored).

    Raises:
        ValueError: a malformed sample line (bad labels, or a value that is not a number).
    """
    samples = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace, space = line.find("{"), line.find(" ")
        if brace >= 0 and (space < 0 or brace < space):
            name = line[:brace]
            labels, end = _parse_labels(line, brace, raw)
        elif space >= 0:
            name, labels, end = line[:space], {}, space
        else:
            raise ValueError(f"metrics line without a value: {raw!r}")
        fields = line[end:].split()
        if not fields:
            raise ValueError(f"metrics line without a value: {raw!r}")
        samples.append(Sample(name=name, labels=labels, value=float(fields[0])))
    return samples


def worker_counters(samples: Iterable[Sample]) -> dict[str, dict[str, float]]:
    """Per worker base URL, each figure of :data:`FIGURES` summed over its series (a worker that
    has no series of a figure gets 0 for it), and under ``""`` the totals of :data:`TOTALS`.

    Returns:
        ``{worker URL: {"requests": n, "failures": n}, "": {"errors": n}}``.
    """
    out: dict[str, dict[str, float]] = {"": dict.fromkeys(TOTALS, 0.0)}
    for sample in samples:
        if not math.isfinite(sample.value):
            continue
        for total, name in TOTALS.items():
            if sample.name == name:
                out[""][total] += sample.value
        worker = sample.labels.get("worker")
        for figure, (name, wanted) in FIGURES.items():
            if (sample.name == name and worker is not None
                    and all(sample.labels.get(k) == v for k, v in wanted.items())):
                counts = out.setdefault(worker.rstrip("/"), dict.fromkeys(FIGURES, 0.0))
                counts[figure] += sample.value
    return out


def _short(url: str) -> str:
    return url.split("://", 1)[-1]


class GatewayMetrics:
    """Reads the gateway's per-worker counters and reports their change per reading.

    Args:
        url: the metrics listener's base URL (``http://127.0.0.1:<prometheus port>``).
        http: the client to read it with.
        timeout_s: the read's timeout.
    """

    def __init__(self, url: str, *, http: httpx.AsyncClient, timeout_s: float = 5.0):
        self.url = url.rstrip("/")
        self._http = http
        self._timeout_s = timeout_s
        self._last: dict[str, dict[str, float]] = {}
        self._warned = False

    async def read(self) -> dict[str, float]:
        """What the counters did since the previous call (since the gateway started, the first
        time): ``gateway/<figure>/<host:port>`` per worker, ``gateway/<figure>`` in all, and
        ``gateway/errors``.

        Returns:
            The figures; empty when the metrics could not be read (warned once).

        Cancellation:
            A checkpoint; nothing is recorded when cancelled.
        """
        try:
            response = await self._http.get(self.url + "/metrics", timeout=self._timeout_s)
            response.raise_for_status()
            counters = worker_counters(parse_prometheus_text(response.text))
        except (httpx.HTTPError, ValueError) as exc:
            if not self._warned:
                log.warning("fleet: could not read the gateway's metrics at %s/metrics: %s",
                            self.url, exc)
                self._warned = True
            return {}
        row: dict[str, float] = {}
        for worker, counts in sorted(counters.items()):
            before = self._last.get(worker, {})
            for figure, value in counts.items():
                change = value - before.get(figure, 0.0)
                change = value if change < 0 else change  # the gateway restarted
                if worker:
                    row[f"gateway/{figure}/{_short(worker)}"] = change
                    row[f"gateway/{figure}"] = row.get(f"gateway/{figure}", 0.0) + change
                else:
                    row[f"gateway/{figure}"] = change
        for figure in FIGURES:
            row.setdefault(f"gateway/{figure}", 0.0)
        self._last = counters
        return row
