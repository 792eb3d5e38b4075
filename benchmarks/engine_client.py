"""Engine client cost: CPU ms per ``/generate`` call for httpx, httpcore and the h11 pool.

An instant engine (``relaxtrio.testing.instant_engine``, pinned to its own CPU) answers every
call at once with 32 ids and logprobs; this process (pinned to another CPU) keeps ``--concurrency``
calls in flight (closed loop, keep-alive, pool size = concurrency so nothing queues in a pool)
and measures its own CPU time per call. The body is a realistic ``/generate`` request: 600
input ids, sampling params, ``return_logprob``. Transports, all in one run:

* ``httpx``: ``httpx.AsyncClient.request`` (what the engine client used before);
* ``httpcore``: ``httpcore.AsyncConnectionPool.request`` directly (json encode/decode by hand);
* ``h11``: pooled h11 connections over trio streams (:class:`_H11Pool` below);
* ``pool``: :class:`relaxtrio.sglang._pool.ConnectionPool`, the engine client's generation pool
  (pooled connections over trio streams, HTTP/1.1 head written and parsed by hand);
* ``client_httpx`` / ``client_pool``: the whole ``EngineClient.generate`` (body build, retries,
  response validation) on httpx and on the pool.

One JSON line per transport; the last line gives ratios. Target: ``client_pool`` at most 0.3 ms
CPU per call. Usage: ``python benchmarks/engine_client.py [--calls 3000] [--concurrency 64]``
(about a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Final

import _bench
import h11
import httpcore
import httpx
import trio

from relaxtrio.sglang._http import EngineClientConfig
from relaxtrio.sglang._pool import ConnectionPool
from relaxtrio.sglang.client import EngineClient, SamplingParams, open_engine_client

TARGET_CPU_MS: Final = 0.3
PROMPT_IDS: Final = [(i * 7919) % 49000 + 10 for i in range(600)]
REPLY_IDS: Final = [(i * 31) % 1000 + 5 for i in range(31)] + [2]
SAMPLING: Final = SamplingParams(max_new_tokens=256, temperature=1.0, top_p=1.0, stop_token_ids=[2],
                                 skip_special_tokens=False, no_stop_trim=True)


class _H11Pool:
    """Keep-alive h11 connections to one origin, at most one request per connection at a time."""

    def __init__(self, host: str, port: int):
        self.origin = (host, port)
        self.idle: list[tuple[trio.SocketStream, h11.Connection]] = []

    async def post_json(self, target: str, body: Any) -> tuple[int, bytes]:
        if self.idle:
            stream, conn = self.idle.pop()
        else:
            stream, conn = await trio.open_tcp_stream(*self.origin), h11.Connection(h11.CLIENT)
        payload = json.dumps(body, separators=(",", ":")).encode()
        head = [(b"Host", b"%s:%d" % (self.origin[0].encode(), self.origin[1])),
                (b"Content-Type", b"application/json"), (b"Content-Length", b"%d" % len(payload))]
        data = conn.send(h11.Request(method="POST", target=target, headers=head))
        data += conn.send(h11.Data(data=payload)) + conn.send(h11.EndOfMessage())
        await stream.send_all(data)
        status, chunks = 0, []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                raise RuntimeError(f"unexpected {event!r}")
        conn.start_next_cycle()
        self.idle.append((stream, conn))
        return status, b"".join(chunks)

    async def aclose(self) -> None:
        for stream, _ in self.idle:
            await stream.aclose()


def _body(rid: str) -> dict[str, Any]:
    return {"rid": rid, "input_ids": PROMPT_IDS, "sampling_params": SAMPLING.to_json(),
            "return_logprob": True}


async def _closed_loop(call, calls: int, concurrency: int) -> tuple[float, float]:
    """((user CPU s, system CPU s), wall s) of ``calls`` calls with ``concurrency`` in flight."""
    counter = iter(range(calls))

    async def worker() -> None:
        for i in counter:
            await call(i)

    times0, wall0 = os.times(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    times1 = os.times()
    return (times1.user - times0.user, times1.system - times0.system), time.perf_counter() - wall0


async def _measure(name: str, make_call, calls: int, concurrency: int, engine_pid: int) -> dict:
    await _closed_loop(make_call, max(concurrency * 2, calls // 10), concurrency)  # warm up
    engine_cpu0 = _bench.process_cpu_s(engine_pid)
    (user_s, sys_s), wall_s = await _closed_loop(make_call, calls, concurrency)
    cpu_s = user_s + sys_s
    engine_cpu_s = _bench.process_cpu_s(engine_pid) - engine_cpu0
    record = {"bench": "engine_client", "transport": name, "concurrency": concurrency,
              "calls": calls, "cpu_ms_per_call": round(cpu_s * 1000 / calls, 4),
              "user_ms_per_call": round(user_s * 1000 / calls, 4),
              "sys_ms_per_call": round(sys_s * 1000 / calls, 4),
              "calls_per_s": round(calls / wall_s, 1),
              "engine_cpu_ms_per_call": round(engine_cpu_s * 1000 / calls, 4)}
    _bench.emit(record)
    return record


async def run(calls: int, concurrency: int, client_cpu: int | None, engine_cpu: int | None) -> None:
    cmd = [_bench.python(), "-m", "relaxtrio.testing.instant_engine", "--eos-id", "2",
           "--reply-ids", *map(str, REPLY_IDS)]
    if engine_cpu is not None:
        cmd += ["--cpu", str(engine_cpu)]
    engine = await _bench.Child.start(cmd)
    url = engine.value
    _bench.pin(client_cpu)
    results: dict[str, dict] = {}
    try:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        timeout = httpx.Timeout(None, connect=10.0)
        async with httpx.AsyncClient(limits=limits) as client:
            async def httpx_call(i: int) -> None:
                response = await client.request("POST", url + "/generate", json=_body(f"x{i}"),
                                                timeout=timeout)
                assert response.status_code == 200 and response.json()["output_ids"]
            results["httpx"] = await _measure("httpx", httpx_call, calls, concurrency, engine.pid)

        async with httpcore.AsyncConnectionPool(max_connections=concurrency) as pool:
            async def httpcore_call(i: int) -> None:
                content = json.dumps(_body(f"c{i}")).encode()
                response = await pool.request(
                    "POST", url + "/generate", content=content,
                    headers=[(b"Content-Type", b"application/json")])
                assert response.status == 200 and json.loads(response.content)["output_ids"]
            results["httpcore"] = await _measure("httpcore", httpcore_call, calls, concurrency,
                                                 engine.pid)

        host, port = url.removeprefix("http://").rsplit(":", 1)
        h11_pool = _H11Pool(host, int(port))

        async def h11_call(i: int) -> None:
            status, content = await h11_pool.post_json("/generate", _body(f"h{i}"))
            assert status == 200 and json.loads(content)["output_ids"]
        results["h11"] = await _measure("h11", h11_call, calls, concurrency, engine.pid)
        await h11_pool.aclose()

        async with ConnectionPool(max_connections=concurrency) as pool:
            async def pool_call(i: int) -> None:
                response = await pool.request("POST", url + "/generate", json=_body(f"p{i}"),
                                              transport_timeout=timeout)
                assert response.status_code == 200 and response.json()["output_ids"]
            results["pool"] = await _measure("pool", pool_call, calls, concurrency, engine.pid)

        config = EngineClientConfig(max_generation_connections=concurrency)
        async with (httpx.AsyncClient(limits=limits) as generation,
                    httpx.AsyncClient() as control):
            engine_client = EngineClient(url, generation=generation, control=control, config=config)

            async def client_httpx_call(i: int) -> None:
                result = await engine_client.generate(PROMPT_IDS, SAMPLING, rid=f"e{i}")
                assert len(result.output_ids) == len(REPLY_IDS)
            results["client_httpx"] = await _measure("client_httpx", client_httpx_call, calls,
                                                     concurrency, engine.pid)

        async with open_engine_client(url, config=config) as pool_client:
            async def client_pool_call(i: int) -> None:
                result = await pool_client.generate(PROMPT_IDS, SAMPLING, rid=f"g{i}")
                assert len(result.output_ids) == len(REPLY_IDS)
            results["client_pool"] = await _measure("client_pool", client_pool_call, calls,
                                                    concurrency, engine.pid)
    finally:
        await engine.stop()
    base = results["httpx"]["cpu_ms_per_call"]
    _bench.emit({
        "bench": "engine_client", "summary": True, "concurrency": concurrency,
        "cpu_ms_per_call": {k: v["cpu_ms_per_call"] for k, v in results.items()},
        "cpu_ratio_vs_httpx": {k: round(v["cpu_ms_per_call"] / base, 3) for k, v in results.items()},
        "target_cpu_ms": TARGET_CPU_MS,
        "client_pool_meets_target": results["client_pool"]["cpu_ms_per_call"] <= TARGET_CPU_MS,
        "client_cpu": client_cpu, "engine_cpu": engine_cpu, "load_average": _bench.load_average(),
    })


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="measured calls per transport")
    parser.add_argument("--concurrency", type=int, default=64)
    cpus = _bench.cpus()
    parser.add_argument("--client-cpu", type=int, default=cpus[0])
    parser.add_argument("--engine-cpu", type=int, default=cpus[-1])
    args = parser.parse_args(argv)
    trio.run(run, args.calls, args.concurrency, args.client_cpu, args.engine_cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
