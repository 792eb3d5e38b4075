"""Concurrency: 1,000 Sessions over real HTTP, and 10,000 Sessions through the scheduler alone.

Part 1 (``http``): an instant engine (SGLang's native API, fixed reply) and the agent API with
``--sessions`` bare Sessions (``relaxtrio.testing.sessions``), in a server process pinned to one
CPU; this process runs one lightweight in-process agent per Session (a trio task with its own
keep-alive connection), all at once, each playing ``--turns`` turns of a growing chat (system +
user, then the reply and a new user message per turn). Reports errors (target 0), wall time, and
the server's memory per Session: its resident set after every turn minus that of the same server
with no Sessions, over the number of Sessions.

Part 2 (``mock``): ``--mock-sessions`` Sessions in Groups of 8, all concurrent in this process
under ``trio.testing.MockClock(autojump_threshold=0)``, with no HTTP and no engine process: each
agent thinks one virtual second, then sends its turn through ``Session.run_turn`` into the real
turn pipeline (match, render, commit) on a scripted engine. Reports errors, wall time, virtual
time and memory per Session (traced Python allocations).

One JSON line per part. Usage: ``python benchmarks/concurrency.py [--sessions 1000] [--turns 8]
[--mock-sessions 10000] [--mock-turns 2] [--parts http mock]``.
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from typing import Any

import _agent_api as api
import _bench
import trio
import trio.testing


async def _http_part(num_sessions: int, turns: int, server_cpu: int, driver_cpu: int) -> dict:
    from relaxtrio.sglang._pool import ConnectionPool

    engine = await api.start_instant_engine(driver_cpu)
    try:
        empty = await api.start_server("full", cpu=server_cpu, engine_url=engine.value)
        rss_empty = _bench.rss_bytes(empty.pid)
        await empty.stop()
        server = await api.start_server("full", cpu=server_cpu, engine_url=engine.value,
                                        num_sessions=num_sessions)
        _bench.pin(driver_cpu)
        url, sessions = api.server_info(server)
        rss_open = _bench.rss_bytes(server.pid)
        errors: list[str] = []
        latencies: list[float] = []

        async def agent(session_id: str, index: int) -> None:
            messages: list[dict[str, Any]] = [api.system()]
            try:
                for turn in range(turns):
                    messages.append(api.user(f"s{index} t{turn}"))
                    start = _bench.now()
                    reply = await api.post_chat(pool, url, session_id,
                                                {"model": "bench", "messages": messages})
                    latencies.append(_bench.now() - start)
                    messages.append(api.assistant(reply["content"]))
            except Exception as exc:  # a failed agent is a counted error, not a crash
                errors.append(repr(exc)[:200])

        cpu0 = _bench.process_cpu_s(server.pid)
        start = _bench.now()
        async with ConnectionPool(max_connections=num_sessions) as pool:
            async with trio.open_nursery() as nursery:
                for index, session_id in enumerate(sessions):
                    nursery.start_soon(agent, session_id, index)
        wall_s = _bench.now() - start
        cpu_s = _bench.process_cpu_s(server.pid) - cpu0
        rss_done = _bench.rss_bytes(server.pid)
        await server.stop()
    finally:
        await engine.stop()
    return {
        "bench": "concurrency", "part": "http", "sessions": num_sessions, "turns": turns,
        "requests": len(latencies), "errors": len(errors), "first_errors": errors[:3],
        "target_errors": 0, "wall_s": round(wall_s, 2),
        "p50_ms": round(_bench.percentile(latencies, 0.5) * 1000, 1),
        "p99_ms": round(_bench.percentile(latencies, 0.99) * 1000, 1),
        "server_cpu_ms_per_request": round(cpu_s * 1000 / max(1, len(latencies)), 3),
        "server_rss_empty_mb": round(rss_empty / 2**20, 1),
        "server_rss_open_mb": round(rss_open / 2**20, 1),
        "server_rss_done_mb": round(rss_done / 2**20, 1),
        "kb_per_session": round((rss_done - rss_empty) / num_sessions / 1024, 1),
        "kb_per_session_open_only": round((rss_open - rss_empty) / num_sessions / 1024, 1),
    }


async def _mock_part(num_sessions: int, turns: int, model_dir: Any) -> dict:
    from relaxtrio.api.chat import CHAT
    from relaxtrio.chat.compiler import ChatCompiler
    from relaxtrio.config import GenerationConfig
    from relaxtrio.models import load_tokenizer
    from relaxtrio.nursery.group import Group
    from relaxtrio.nursery.session import Session, SessionRegistry
    from relaxtrio.rollout.turns import EngineTurnHandler
    from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine

    compiler = ChatCompiler(load_tokenizer(model_dir))
    engine = ScriptedEngine(tokenizer=compiler.tokenizer, eos_id=compiler.stop_token_ids[0],
                            replies=lambda ids: Reply(text=api.REPLY_TEXT))
    handler = EngineTurnHandler(client=engine, compiler=compiler,  # type: ignore[arg-type]
                                config=GenerationConfig(max_response_tokens=64))
    registry = SessionRegistry()
    errors: list[str] = []
    done = 0
    group_size = 8

    async def agent(session: Session, index: int) -> None:
        nonlocal done
        messages: list[dict[str, Any]] = [api.system()]
        try:
            for turn in range(turns):
                await trio.sleep(1.0)  # the agent thinks (virtual time)
                messages.append(api.user(f"s{index} t{turn}"))
                parsed = CHAT.parse({"model": "bench", "messages": messages})
                result = await session.run_turn(handler, parsed.turn)
                messages.append(api.assistant(result.message["content"]))
            done += 1
        except Exception as exc:
            errors.append(repr(exc)[:200])

    async def run_group(index: int) -> None:
        group = Group.create(f"train:g{index}", num_sessions=group_size, input_payload={},
                             timeout_s=3600)
        sessions = group.sessions
        for session in sessions:
            registry.add(session)
        async with trio.open_nursery() as nursery:
            for session in sessions:
                nursery.start_soon(_serve_session, session, agent, index * group_size + session.index)
            group.lease()
        for session in sessions:
            registry.discard(session)

    tracemalloc.start()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    virtual0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        for g in range(num_sessions // group_size):
            nursery.start_soon(run_group, g)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "bench": "concurrency", "part": "mock", "sessions": num_sessions, "turns": turns,
        "completed": done, "errors": len(errors), "first_errors": errors[:3], "target_errors": 0,
        "wall_s": round(time.perf_counter() - wall0, 2),
        "cpu_ms_per_turn": round((time.process_time() - cpu0) * 1000 / max(1, done * turns), 3),
        "virtual_s": round(trio.current_time() - virtual0, 3),
        "peak_traced_mb": round(peak / 2**20, 1),
        "kb_per_session_peak": round(peak / num_sessions / 1024, 1),
    }


async def _serve_session(session: Any, agent: Any, index: int) -> None:
    async with session.serving():
        session.group.note_request(session)
        await agent(session, index)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--mock-sessions", type=int, default=10000)
    parser.add_argument("--mock-turns", type=int, default=2)
    parser.add_argument("--parts", nargs="+", default=["http", "mock"], choices=["http", "mock"])
    cpus = _bench.cpus()
    parser.add_argument("--server-cpu", type=int, default=cpus[0])
    parser.add_argument("--driver-cpu", type=int, default=cpus[-1])
    args = parser.parse_args(argv)
    if "http" in args.parts:
        _bench.emit({**trio.run(_http_part, args.sessions, args.turns, args.server_cpu,
                                args.driver_cpu), "load_average": _bench.load_average()})
    if "mock" in args.parts:
        from relaxtrio.models import ensure_smollm2

        record = trio.run(_mock_part, args.mock_sessions, args.mock_turns, ensure_smollm2(),
                          clock=trio.testing.MockClock(autojump_threshold=0))
        _bench.emit({**record, "load_average": _bench.load_average()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
