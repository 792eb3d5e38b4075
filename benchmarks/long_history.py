"""Long histories: one Session with 1,000 turns; per-request cost of the last 100 over the first 100.

An instant engine (fixed 12-token reply) and the agent API with one bare Session run in a
server process pinned to one CPU; this process plays one agent that sends ``--turns`` chat
turns, each the whole history so far plus one short new user message (so turn ``n`` carries
``2n`` messages, the way every chat client replays its history). Per window of ``--window``
turns it records the server's CPU ms per request and the client's latency per request.

Server CPU is read two ways: the window's total from ``/proc/PID/stat`` (10 ms ticks) divided by
its requests (``server_cpu_ms_per_request``), and per request from the scheduler's nanosecond
run time of every server thread (``/proc/PID/task/*/schedstat``), whose median per window
(``server_cpu_ms_p50``) a burst of other processes' work on the same core (this machine is
shared) moves much less than the mean. The latency includes the client's and the engine's work
(both also grow with the history: they encode and decode every message and id).

Prints one JSON line per window and a summary with ``last/first`` ratios of these figures
(target at most 1.2). Usage: ``python benchmarks/long_history.py [--turns 1000] [--window 100]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Final

import _agent_api as api
import _bench
import trio

TARGET_RATIO: Final = 1.2


def _run_time_ns(pid: int) -> int:
    """Nanoseconds every thread of ``pid`` has run so far (field 1 of each task's schedstat)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # a thread that just ended
            pass
    return total


async def run(turns: int, window: int, server_cpu: int, driver_cpu: int) -> None:
    from relaxtrio.sglang._pool import ConnectionPool

    engine = await api.start_instant_engine(driver_cpu)
    server = None
    try:
        server = await api.start_server("full", cpu=server_cpu, engine_url=engine.value,
                                        num_sessions=1)
        _bench.pin(driver_cpu)
        url, [session_id] = api.server_info(server)
        messages: list[dict[str, Any]] = [api.system()]
        windows = []
        async with ConnectionPool(max_connections=1) as pool:
            for start in range(0, turns, window):
                latencies, cpu_ns = [], []
                cpu0 = _bench.process_cpu_s(server.pid)
                for turn in range(start, min(turns, start + window)):
                    messages.append(api.user(f"t{turn}", "Next step?"))
                    run0 = _run_time_ns(server.pid)
                    begin = _bench.now()
                    reply = await api.post_chat(pool, url, session_id,
                                                {"model": "bench", "messages": messages})
                    latencies.append(_bench.now() - begin)
                    cpu_ns.append(_run_time_ns(server.pid) - run0)
                    messages.append(api.assistant(reply["content"]))
                cpu_s = _bench.process_cpu_s(server.pid) - cpu0
                record = {
                    "bench": "long_history", "first_turn": start, "turns": len(latencies),
                    "messages_at_end": len(messages),
                    "server_cpu_ms_per_request": round(cpu_s * 1000 / len(latencies), 3),
                    "server_cpu_ms_p50": round(_bench.percentile(cpu_ns, 0.5) / 1e6, 3),
                    "server_cpu_ms_mean": round(sum(cpu_ns) / len(cpu_ns) / 1e6, 3),
                    "latency_ms_mean": round(sum(latencies) * 1000 / len(latencies), 3),
                    "latency_ms_p50": round(_bench.percentile(latencies, 0.5) * 1000, 3),
                }
                windows.append(record)
                _bench.emit(record)
    finally:
        if server is not None:
            await server.stop()
        await engine.stop()
    first, last = windows[0], windows[-1]
    cpu_ratio = last["server_cpu_ms_per_request"] / first["server_cpu_ms_per_request"]
    latency_ratio = last["latency_ms_p50"] / first["latency_ms_p50"]
    cpu_p50_ratio = last["server_cpu_ms_p50"] / first["server_cpu_ms_p50"]
    _bench.emit({
        "bench": "long_history", "summary": True, "turns": turns, "window": window,
        "server_cpu_ratio_last_over_first": round(cpu_ratio, 3),
        "server_cpu_p50_ratio_last_over_first": round(cpu_p50_ratio, 3),
        "server_cpu_mean_ratio_last_over_first": round(
            last["server_cpu_ms_mean"] / first["server_cpu_ms_mean"], 3),
        "latency_p50_ratio_last_over_first": round(latency_ratio, 3),
        "target_ratio": TARGET_RATIO,
        "meets_target": cpu_ratio <= TARGET_RATIO and latency_ratio <= TARGET_RATIO,
        "load_average": _bench.load_average(),
    })


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--window", type=int, default=100)
    cpus = _bench.cpus()
    parser.add_argument("--server-cpu", type=int, default=cpus[0])
    parser.add_argument("--driver-cpu", type=int, default=cpus[-1])
    args = parser.parse_args(argv)
    trio.run(run, args.turns, args.window, args.server_cpu, args.driver_cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
