"""Helpers shared by the benchmark scripts: pinning, CPU clocks, child processes, JSON lines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import trio

URL_LINE_PREFIX = "RELAXTRIO_ENGINE_URL="


def cpus() -> list[int]:
    """The CPUs this process may run on, sorted."""
    return sorted(os.sched_getaffinity(0))


def pin(cpu: int | None) -> None:
    """Pin this process to one CPU (None: leave it)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14, 15)


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages (for the record: this machine is shared)."""
    return [round(x, 2) for x in os.getloadavg()]


def emit(record: dict[str, Any]) -> None:
    """Print one measurement as one JSON line."""
    print(json.dumps(record), flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class Child:
    """A child process that prints ``<prefix><value>`` as its first stdout line once ready."""

    def __init__(self, process: trio.Process, value: str):
        self.process = process
        self.value = value

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    async def start(cls, cmd: Sequence[str], prefix: str = URL_LINE_PREFIX,
                    timeout_s: float = 120.0, env: dict[str, str] | None = None) -> Child:
        process = await trio.lowlevel.open_process(list(cmd), stdout=subprocess.PIPE, env=env)
        assert process.stdout is not None
        buffer = b""
        with trio.fail_after(timeout_s):
            while b"\n" not in buffer:
                chunk = await process.stdout.receive_some()
                if not chunk:
                    raise RuntimeError(f"{cmd[:4]} exited before it was ready")
                buffer += chunk
        line = buffer.decode().splitlines()[0]
        if not line.startswith(prefix):
            raise RuntimeError(f"unexpected first line {line!r} from {cmd[:4]}")
        return cls(process, line[len(prefix):])

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            with trio.move_on_after(20):
                await self.process.wait()
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


def python() -> str:
    return sys.executable


def now() -> float:
    return time.perf_counter()
