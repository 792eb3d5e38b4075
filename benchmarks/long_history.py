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

The first window runs in the first second of the benchmark and the last one about half a minute
later, and on a shared machine the server's speed drifts by more than the target between the
two: the same code gave first windows of 3.5 to 6.1 ms per request in quiet runs. So the
last window is also measured against a *control*: a second, fresh Session of the same server
whose first ``--window`` turns are sent interleaved with the long Session's last ones, in
blocks of ``--block`` requests of each Session in turn, so that drift falls on both alike. The
control window runs warm (the long Session compiled the template and filled the tokenizer's
caches), while the first window of the long Session also pays for those first-time costs. The
first request of each block follows the other Session's, whose data may have evicted its own
from the CPU caches: with blocks of one request (each small request after a large one) the
control cost 5.2-5.5 ms per request, with blocks of ten 3.6-4.7 ms.

Prints one JSON line per window (and one for the control window) and a summary with the
``last/first`` ratios of these figures and the ``last/control`` ratios. ``meets_target`` judges
the target (at most 1.2) on the server's CPU per request, the cost that is relaxtrio's own, in
the pairing measured at the same time: the median per request, last over control. Usage:
``python benchmarks/long_history.py [--turns 1000] [--window 100]``.
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


async def _turn(pool: Any, url: str, session_id: str, messages: list[dict[str, Any]], tag: str,
                server_pid: int) -> tuple[float, int]:
    """One request of a Session (its history plus a new user message); appends the exchange.

    Returns:
        (latency in s, nanoseconds the server ran for it).
    """
    messages.append(api.user(tag, "Next step?"))
    run0 = _run_time_ns(server_pid)
    begin = _bench.now()
    reply = await api.post_chat(pool, url, session_id, {"model": "bench", "messages": messages})
    latency = _bench.now() - begin
    cpu_ns = _run_time_ns(server_pid) - run0
    messages.append(api.assistant(reply["content"]))
    return latency, cpu_ns


def _window_record(first_turn: int, latencies: list[float], cpu_ns: list[int], cpu_s: float,
                   messages: int, **extra: Any) -> dict[str, Any]:
    n = len(latencies)
    return {
        "bench": "long_history", "first_turn": first_turn, "turns": n, "messages_at_end": messages,
        **extra,
        "server_cpu_ms_per_request": round(cpu_s * 1000 / n, 3),
        "server_cpu_ms_p50": round(_bench.percentile(cpu_ns, 0.5) / 1e6, 3),
        "server_cpu_ms_mean": round(sum(cpu_ns) / n / 1e6, 3),
        "latency_ms_mean": round(sum(latencies) * 1000 / n, 3),
        "latency_ms_p50": round(_bench.percentile(latencies, 0.5) * 1000, 3),
    }


async def run(turns: int, window: int, block: int, server_cpu: int, driver_cpu: int) -> None:
    from relaxtrio.sglang._pool import ConnectionPool

    engine = await api.start_instant_engine(driver_cpu)
    server = None
    try:
        server = await api.start_server("full", cpu=server_cpu, engine_url=engine.value,
                                        num_sessions=2)
        _bench.pin(driver_cpu)
        url, [session_id, control_id] = api.server_info(server)
        messages: list[dict[str, Any]] = [api.system()]
        control: list[dict[str, Any]] = [api.system()]
        windows = []
        last_start = (turns - 1) // window * window
        async with ConnectionPool(max_connections=1) as pool:
            for start in range(0, turns, window):
                latencies, cpu_ns = [], []
                control_latencies, control_cpu_ns = [], []
                cpu0 = _bench.process_cpu_s(server.pid)
                end = min(turns, start + window)
                for turn in range(start, end):
                    latency, ns = await _turn(pool, url, session_id, messages, f"t{turn}", server.pid)
                    latencies.append(latency)
                    cpu_ns.append(ns)
                    if start == last_start and ((turn - start + 1) % block == 0 or turn == end - 1):
                        # as many of the control's first turns as the long Session just sent
                        while len(control_cpu_ns) < turn - start + 1:
                            latency, ns = await _turn(pool, url, control_id, control,
                                                      f"r{len(control_cpu_ns)}", server.pid)
                            control_latencies.append(latency)
                            control_cpu_ns.append(ns)
                cpu_s = _bench.process_cpu_s(server.pid) - cpu0
                # The last window's total also ran the control's requests: split it between
                # the two Sessions in proportion to their per-request run times.
                share = sum(cpu_ns) / (sum(cpu_ns) + sum(control_cpu_ns))
                record = _window_record(start, latencies, cpu_ns, cpu_s * share, len(messages))
                windows.append(record)
                _bench.emit(record)
                if control_cpu_ns:
                    control_record = _window_record(
                        0, control_latencies, control_cpu_ns, cpu_s * (1 - share), len(control),
                        control=True, interleaved_with_turn=start)
                    _bench.emit(control_record)
    finally:
        if server is not None:
            await server.stop()
        await engine.stop()
    first, last = windows[0], windows[-1]

    def ratio(key: str, base: dict[str, Any]) -> float:
        return round(last[key] / base[key], 3)

    control_ratio = ratio("server_cpu_ms_p50", control_record)
    _bench.emit({
        "bench": "long_history", "summary": True, "turns": turns, "window": window,
        "server_cpu_ratio_last_over_first": ratio("server_cpu_ms_per_request", first),
        "server_cpu_p50_ratio_last_over_first": ratio("server_cpu_ms_p50", first),
        "server_cpu_mean_ratio_last_over_first": ratio("server_cpu_ms_mean", first),
        "latency_p50_ratio_last_over_first": ratio("latency_ms_p50", first),
        "server_cpu_p50_ratio_last_over_control": control_ratio,
        "server_cpu_mean_ratio_last_over_control": ratio("server_cpu_ms_mean", control_record),
        "latency_p50_ratio_last_over_control": ratio("latency_ms_p50", control_record),
        "target_ratio": TARGET_RATIO,
        "meets_target": control_ratio <= TARGET_RATIO,
        "load_average": _bench.load_average(),
    })


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--block", type=int, default=10,
                        help="requests of one Session in a row while the last window and the "
                             "control alternate")
    cpus = _bench.cpus()
    parser.add_argument("--server-cpu", type=int, default=cpus[0])
    parser.add_argument("--driver-cpu", type=int, default=cpus[-1])
    args = parser.parse_args(argv)
    trio.run(run, args.turns, args.window, args.block, args.server_cpu, args.driver_cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
