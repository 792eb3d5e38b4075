"""Gateway overhead: the full agent-API path against a bare quart-trio route, same hypercorn setup.

Three processes: an instant engine (``relaxtrio.testing.instant_engine``: SGLang's native API,
a fixed 12-token reply, no model), the server under test pinned to one CPU, and this load driver
(pinned with the engine to another CPU). Targets (``benchmarks/_agent_api.py``), each served by
``relaxtrio.api.app.serve_api``:

* ``bare``: one quart-trio route that reads and parses the JSON body and answers a fixed chat
  completion (the framework ceiling);
* ``full``: the agent API (``create_app``): bearer auth to a Session, projection to canonical
  messages, forest match, render of the new observation (SmolLM2's chat template and tokenizer),
  ``/generate`` on the instant engine through ``EngineClient``, parse, commit, render;
* ``full_timeline_off`` (with ``--timeline-off``): the full path with every Session's timeline
  off (``relaxtrio.nursery.timeline``, bound 0): ``full``/``full_timeline_off`` is what the
  dashboard's recording costs;
* ``bare_hop`` (with ``--bare-hop``): the bare route plus one ``/generate`` call on the instant
  engine before its fixed answer, the ceiling of a gateway that forwards every request to an
  engine: ``bare_hop``/``bare`` is what the engine hop alone costs, and ``full``/``bare_hop``
  what relaxtrio's own per-request work costs.

Closed loop, keep-alive, one connection per client, ``--duration`` seconds per target and cell
after a warm-up, split into ``--rounds`` slices that alternate between the targets (the machine
may be shared: load changes then fall on every target alike), at 1, 16 and 64 clients; two
request mixes with the same bodies for both targets:

* ``new_observation``: an 8-message, ~2 KB chat whose first 7 messages are a committed history
  (3 earlier turns of that Session) and whose last user message is new on every request, so every
  request renders one new observation and branches off the same committed response;
* ``growing``: 8-turn conversations: each request is the previous one plus the reply and a new
  user message (the history grows from 2 to 16 messages, then a new conversation starts).

One JSON line per cell (req/s, p50/p99 latency ms, server CPU ms per request, engine CPU ms per
request) and one summary line per mix with ``full``/``bare`` throughput ratios against the
target 0.5. Usage: ``python benchmarks/gateway_overhead.py [--duration 6] [--clients 1 16 64]
[--baseline-src DIR]`` (about 3 minutes with the defaults on an idle machine).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Final

import _agent_api as api
import _bench
import trio

if TYPE_CHECKING:  # the driver's pool; server processes (maybe another checkout) never import it
    from relaxtrio.sglang._pool import ConnectionPool

TARGET_RATIO: Final = 0.5
# ------------------------------------------------------------------------------- load driver
class _Client:
    """One simulated agent: its Session, its conversation, its request mix."""

    def __init__(self, index: int, session_id: str | None, mix: str, run: str):
        self.index = index
        self.tag = f"{run} c{index}"
        self.headers = {"Authorization": f"Bearer {session_id or 'none'}"}
        self.mix = mix
        self.counter = itertools.count()
        self.history: list[dict[str, Any]] = []
        self.conversation = 0

    def body(self) -> dict[str, Any]:
        n = next(self.counter)
        if self.mix == "new_observation":
            messages = [*self.history, api.user(f"{self.tag} q{n}")]
        else:
            if not self.history or len(self.history) >= 16:
                self.conversation += 1
                self.history = [api.system()]
            messages = [*self.history, api.user(f"{self.tag} v{self.conversation} t{n}")]
            self.history = messages
        return {"model": "bench", "messages": messages, "max_tokens": 32}

    def answered(self, payload: dict[str, Any]) -> None:
        if self.mix == "growing":
            self.history = [*self.history, api.assistant(payload["choices"][0]["message"]["content"])]


async def _prepare(pool: ConnectionPool, url: str, client: _Client) -> None:
    """``new_observation``: commit a 3-turn history (7 messages) for the client's Session."""
    history: list[dict[str, Any]] = [api.system()]
    for turn in range(3):
        history.append(api.user(f"c{client.index} setup{turn}"))
        response = await pool.request("POST", url + api.CHAT_PATH, headers=client.headers,
                                      json={"model": "bench", "messages": history}, transport_timeout=api.NO_TIMEOUT)
        assert response.status_code == 200, response.content[:300]
        history.append(api.assistant(response.json()["choices"][0]["message"]["content"]))
    client.history = history


async def _closed_loop(pool: ConnectionPool, url: str, clients: list[_Client],
                       duration_s: float) -> list[float]:
    latencies: list[float] = []
    deadline = _bench.now() + duration_s

    async def run(client: _Client) -> None:
        while _bench.now() < deadline:
            body = client.body()
            start = _bench.now()
            response = await pool.request("POST", url + api.CHAT_PATH, headers=client.headers,
                                          json=body, transport_timeout=api.NO_TIMEOUT)
            latencies.append(_bench.now() - start)
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {response.content[:300]!r}")
            client.answered(response.json())

    async with trio.open_nursery() as nursery:
        for client in clients:
            nursery.start_soon(run, client)
    return latencies


async def _cells(targets: dict[str, _bench.Child], engine: _bench.Child, mix: str,
                 num_clients: int, session_offset: int, duration_s: float, warmup_s: float,
                 rounds: int) -> dict[str, dict[str, Any]]:
    """Measure every target at one client count: ``rounds`` alternating slices per target, so
    load changes on this shared machine fall on all targets alike."""
    from relaxtrio.sglang._pool import ConnectionPool

    async with contextlib.AsyncExitStack() as stack:
        setups = {}
        for target, server in targets.items():
            info = json.loads(server.value)
            url, sessions = info["url"].rstrip("/"), info["sessions"]
            clients = [_Client(i, sessions[session_offset + i] if sessions else None, mix,
                               f"n{num_clients}") for i in range(num_clients)]
            pool = await stack.enter_async_context(ConnectionPool(max_connections=num_clients))
            if mix == "new_observation":
                async with trio.open_nursery() as nursery:
                    for client in clients:
                        nursery.start_soon(_prepare, pool, url, client)
            await _closed_loop(pool, url, clients, warmup_s)
            setups[target] = (server, url, clients, pool)
        totals = {t: {"latencies": [], "wall_s": 0.0, "server_cpu_s": 0.0, "engine_cpu_s": 0.0}
                  for t in targets}
        for _ in range(rounds):
            for target, (server, url, clients, pool) in setups.items():
                total = totals[target]
                server_cpu0 = _bench.process_cpu_s(server.pid)
                engine_cpu0 = _bench.process_cpu_s(engine.pid)
                start = _bench.now()
                total["latencies"] += await _closed_loop(pool, url, clients, duration_s / rounds)
                total["wall_s"] += _bench.now() - start
                total["server_cpu_s"] += _bench.process_cpu_s(server.pid) - server_cpu0
                total["engine_cpu_s"] += _bench.process_cpu_s(engine.pid) - engine_cpu0
    records = {}
    for target, total in totals.items():
        latencies, n = total["latencies"], len(total["latencies"])
        records[target] = record = {
            "bench": "gateway_overhead", "target": target, "mix": mix, "clients": num_clients,
            "requests": n, "req_s": round(n / total["wall_s"], 1),
            "p50_ms": round(_bench.percentile(latencies, 0.5) * 1000, 2),
            "p99_ms": round(_bench.percentile(latencies, 0.99) * 1000, 2),
            "server_cpu_ms_per_req": round(total["server_cpu_s"] * 1000 / n, 3),
            "engine_cpu_ms_per_req": (round(total["engine_cpu_s"] * 1000 / n, 3)
                                      if target != "bare" else None),
        }
        _bench.emit(record)
    return records


async def _drive(args: argparse.Namespace) -> int:
    server_cpu, driver_cpu = args.server_cpu, args.driver_cpu
    engine = await api.start_instant_engine(driver_cpu)
    max_clients = max(args.clients)
    servers: dict[str, _bench.Child] = {}
    full = functools.partial(api.start_server, "full", cpu=server_cpu, engine_url=engine.value,
                             num_sessions=2 * max_clients)
    targets = ["bare", "full"]
    try:
        servers["bare"] = await api.start_server("bare", cpu=server_cpu)
        servers["full"] = await full()
        if args.bare_hop:
            servers["bare_hop"] = await api.start_server("bare_hop", cpu=server_cpu,
                                                         engine_url=engine.value)
            targets.append("bare_hop")
        if args.baseline_src:
            # The same full path served from another checkout (e.g. an older commit), for a
            # before/after figure in one run; it needs relaxtrio.testing.sessions.
            env = {**os.environ, "PYTHONPATH": args.baseline_src}
            servers["full_baseline"] = await full(env=env)
            targets.append("full_baseline")
        if args.timeline_off:
            # The same full path with every Session's timeline off (nursery/timeline.py): what
            # the dashboard's recording costs, measured in this run.
            servers["full_timeline_off"] = await full(timeline_events=0)
            targets.append("full_timeline_off")
        _bench.pin(driver_cpu)
        for mix_index, mix in enumerate(args.mixes):
            ratios: dict[str, float] = {}
            cpu_ratios: dict[str, float] = {}
            baseline_ratios: dict[str, float] = {}
            timeline_ratios: dict[str, float] = {}
            hop_ratios: dict[str, dict[str, float]] = {"bare_hop_over_bare": {}, "full_over_bare_hop": {}}
            for num_clients in args.clients:
                # Sessions [0, max) serve new_observation, [max, 2 max) growing: each mix gets
                # fresh forests. Client counts reuse them (their forests keep growing).
                cells = await _cells({t: servers[t] for t in targets}, engine, mix, num_clients,
                                     mix_index * max_clients, args.duration, args.warmup,
                                     args.rounds)
                ratios[str(num_clients)] = round(cells["full"]["req_s"] / cells["bare"]["req_s"], 3)
                if "full_baseline" in cells:
                    baseline_ratios[str(num_clients)] = round(
                        cells["full_baseline"]["req_s"] / cells["bare"]["req_s"], 3)
                if "full_timeline_off" in cells:
                    timeline_ratios[str(num_clients)] = round(
                        cells["full"]["req_s"] / cells["full_timeline_off"]["req_s"], 4)
                if "bare_hop" in cells:
                    hop = cells["bare_hop"]["req_s"]
                    hop_ratios["bare_hop_over_bare"][str(num_clients)] = round(hop / cells["bare"]["req_s"], 3)
                    hop_ratios["full_over_bare_hop"][str(num_clients)] = round(cells["full"]["req_s"] / hop, 3)
                cpu_ratios[str(num_clients)] = round(
                    cells["full"]["server_cpu_ms_per_req"] / cells["bare"]["server_cpu_ms_per_req"], 3)
            _bench.emit({
                "bench": "gateway_overhead", "summary": True, "mix": mix,
                "throughput_ratio_full_over_bare": ratios, "target_ratio": TARGET_RATIO,
                "meets_target": all(r >= TARGET_RATIO for r in ratios.values()),
                "server_cpu_ratio_full_over_bare": cpu_ratios,
                **({"throughput_ratio_baseline_over_bare": baseline_ratios} if baseline_ratios else {}),
                **({"throughput_ratio_timeline_on_over_off": timeline_ratios} if timeline_ratios else {}),
                **({f"throughput_ratio_{k}": v for k, v in hop_ratios.items()} if args.bare_hop else {}),
                "server_cpu": server_cpu, "driver_and_engine_cpu": driver_cpu,
                "load_average": _bench.load_average(),
            })
    finally:
        for child in servers.values():
            await child.stop()
        await engine.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=6.0,
                        help="measured seconds per target and cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per cell")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating slices per target and cell (the duration is split)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--mixes", nargs="+", default=["new_observation", "growing"],
                        choices=["new_observation", "growing"])
    cpus = _bench.cpus()
    parser.add_argument("--server-cpu", type=int, default=cpus[0])
    parser.add_argument("--driver-cpu", type=int, default=cpus[-1])
    parser.add_argument("--bare-hop", action="store_true",
                        help="also serve the bare route plus one /generate call per request")
    parser.add_argument("--timeline-off", action="store_true",
                        help="also serve the full path with Session timelines off (full_timeline_off)")
    parser.add_argument("--baseline-src", help="also serve the full path from this source tree "
                        "(PYTHONPATH of another checkout) and report it as full_baseline")
    args = parser.parse_args(argv)
    return trio.run(_drive, args)


if __name__ == "__main__":
    sys.exit(main())
