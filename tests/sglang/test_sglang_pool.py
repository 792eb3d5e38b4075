"""The generation connection pool (``sglang/_pool.py``) against real TCP servers on 127.0.0.1.

Servers here are small trio handlers that answer scripted bytes, for the shapes a real engine
will not produce on demand (chunked and close-delimited bodies, idle closes, resets, silence);
the instant engine stands in for a well-behaved SGLang server.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

import attrs
import httpx
import pytest
import trio
import trio.testing

from relaxtrio import BackendError
from relaxtrio.sglang._pool import ConnectionPool
from relaxtrio.sglang.client import (
    EngineClientConfig,
    SamplingParams,
    open_engine_client,
)
from relaxtrio.testing.instant_engine import InstantEngine, serve_instant_engine

FAST = EngineClientConfig(retry_sleep_s=0.0, max_attempts=2)
NO_READ_LIMIT = httpx.Timeout(None, connect=5.0)


def _answer(body: bytes, status: int = 200, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
            % (status, len(body), extra)) + body


@attrs.define(eq=False)
class ScriptedServer:
    """Answers request i with ``script[i]``: bytes to send, or a coroutine fn of the stream
    that returns whether the connection stays open."""

    script: list[bytes | Callable[[trio.SocketStream], Awaitable[bool | None]]]
    connections: int = 0
    open_now: int = 0
    max_open: int = 0
    requests: int = 0
    closed_by_client: trio.Event = attrs.field(factory=trio.Event)

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        self.closed_by_client.set()
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                while len(buffer) < length:
                    buffer += await stream.receive_some(65536)
                buffer = buffer[length:]
                step = self.script[self.requests]
                self.requests += 1
                if isinstance(step, bytes):
                    await stream.send_all(step)
                elif not await step(stream):
                    return
        except trio.BrokenResourceError:
            return
        finally:
            self.open_now -= 1
            await trio.aclose_forcefully(stream)


async def _serve(nursery: trio.Nursery, server: ScriptedServer) -> str:
    listeners = await nursery.start(functools.partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
    return f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"


async def _close(stream: trio.SocketStream) -> None:
    await stream.aclose()


async def test_keep_alive_reuses_one_connection(nursery: trio.Nursery) -> None:
    server = ScriptedServer([_answer(b'{"n":1}'), _answer(b'{"n":2}', status=503)])
    url = await _serve(nursery, server)
    async with ConnectionPool(max_connections=4) as pool:
        with trio.fail_after(10):
            first = await pool.request("POST", url + "/generate", json={"a": [1, 2]}, transport_timeout=NO_READ_LIMIT)
            second = await pool.request("GET", url + "/health", transport_timeout=NO_READ_LIMIT)
    assert (first.status_code, first.json()) == (200, {"n": 1})
    assert (second.status_code, second.json()) == (503, {"n": 2})
    assert first.headers["content-type"] == "application/json"
    assert server.connections == 1


async def test_chunked_and_close_delimited_bodies(nursery: trio.Nursery) -> None:
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"4\r\n{\"a\"\r\n3;ext=1\r\n:12\r\n1\r\n}\r\n0\r\nTrailer: x\r\n\r\n")

    async def close_delimited(stream: trio.SocketStream) -> None:
        await stream.send_all(b"HTTP/1.0 200 OK\r\n\r\n[1, 2, 3]")

    server = ScriptedServer([chunked, close_delimited, _answer(b"{}")])
    url = await _serve(nursery, server)
    async with ConnectionPool(max_connections=1) as pool:
        with trio.fail_after(10):
            assert (await pool.request("POST", url + "/a", json={}, transport_timeout=NO_READ_LIMIT)).json() == {"a": 12}
            assert (await pool.request("POST", url + "/b", json={}, transport_timeout=NO_READ_LIMIT)).json() == [1, 2, 3]
            assert (await pool.request("POST", url + "/c", json={}, transport_timeout=NO_READ_LIMIT)).json() == {}
    assert server.connections == 2  # the HTTP/1.0 answer closed its connection


async def test_a_connection_closed_while_idle_is_replaced_transparently(nursery: trio.Nursery) -> None:
    async def answer_then_close(stream: trio.SocketStream) -> None:
        await stream.send_all(_answer(b"1"))

    server = ScriptedServer([answer_then_close, _answer(b"2")])
    url = await _serve(nursery, server)
    async with ConnectionPool(max_connections=1) as pool:
        with trio.fail_after(10):
            assert (await pool.request("POST", url + "/x", json={}, transport_timeout=NO_READ_LIMIT)).json() == 1
            await trio.testing.wait_all_tasks_blocked()  # the server has closed it
            # the first connection carried no Connection: close, so it went back to the pool;
            # the server closed it: the second call finds it dead and opens a fresh one
            assert (await pool.request("POST", url + "/x", json={}, transport_timeout=NO_READ_LIMIT)).json() == 2
    assert server.connections == 2 and server.requests == 2


async def test_broken_answers_raise_httpx_transport_errors(nursery: trio.Nursery) -> None:
    async def half(stream: trio.SocketStream) -> None:
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"cut")

    server = ScriptedServer([b"garbage\r\n\r\n", half])
    url = await _serve(nursery, server)
    async with ConnectionPool(max_connections=1) as pool:
        with trio.fail_after(10):
            with pytest.raises(httpx.RemoteProtocolError, match="invalid status line"):
                await pool.request("POST", url + "/x", json={}, transport_timeout=NO_READ_LIMIT)
            with pytest.raises(httpx.RemoteProtocolError, match="middle of an answer"):
                await pool.request("POST", url + "/x", json={}, transport_timeout=NO_READ_LIMIT)


async def test_connect_errors_and_read_timeouts(nursery: trio.Nursery) -> None:
    with trio.socket.socket() as probe:  # a port nobody listens on
        await probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    gate = trio.Event()

    async def silent(stream: trio.SocketStream) -> None:
        await gate.wait()

    server = ScriptedServer([silent])
    url = await _serve(nursery, server)
    async with ConnectionPool(max_connections=2) as pool:
        with trio.fail_after(10):
            with pytest.raises(httpx.ConnectError):
                await pool.request("GET", f"http://127.0.0.1:{free_port}/health", transport_timeout=NO_READ_LIMIT)
            with pytest.raises(httpx.ReadTimeout):
                await pool.request("GET", url + "/health", transport_timeout=httpx.Timeout(0.2, connect=5.0))
            with pytest.raises(httpx.UnsupportedProtocol):
                await pool.request("GET", "https://127.0.0.1/x", transport_timeout=NO_READ_LIMIT)
    gate.set()


async def test_cancelling_a_call_closes_its_connection(nursery: trio.Nursery) -> None:
    gate = trio.Event()

    async def hold(stream: trio.SocketStream) -> None:
        await gate.wait()
        await stream.receive_some(1)  # the client's close arrives as EOF
        server.closed_by_client.set()

    server = ScriptedServer([hold])
    url = await _serve(nursery, server)
    async with ConnectionPool(max_connections=1) as pool:
        with trio.fail_after(10):
            with trio.move_on_after(0.2):
                await pool.request("POST", url + "/generate", json={}, transport_timeout=NO_READ_LIMIT)
            gate.set()
            await server.closed_by_client.wait()


async def test_calls_beyond_max_connections_wait_for_a_connection(nursery: trio.Nursery) -> None:
    gate = trio.Event()

    async def gated(stream: trio.SocketStream) -> bool:
        await gate.wait()
        await stream.send_all(_answer(b"{}"))
        return True

    server = ScriptedServer([gated] * 4)
    url = await _serve(nursery, server)
    results: list[int] = []
    async with ConnectionPool(max_connections=2) as pool:

        async def one() -> None:
            results.append((await pool.request("POST", url + "/g", json={}, transport_timeout=NO_READ_LIMIT)).status_code)

        with trio.fail_after(10):
            async with trio.open_nursery() as calls:
                for _ in range(4):
                    calls.start_soon(one)
                await trio.testing.wait_all_tasks_blocked()
                assert server.max_open == 2
                gate.set()
    assert results == [200] * 4 and server.max_open == 2


async def test_engine_client_generates_through_the_pool_and_retries_5xx(nursery: trio.Nursery) -> None:
    engine = InstantEngine(reply_ids=[7, 8, 2], eos_id=2, logprob=-0.125)
    url = await nursery.start(serve_instant_engine, engine)
    async with open_engine_client(url, config=FAST) as client:
        with trio.fail_after(10):
            result = await client.generate([1, 2, 3], SamplingParams(max_new_tokens=8), rid="r1")
            cut = await client.generate([1, 2, 3], SamplingParams(max_new_tokens=2), rid="r2")
            assert await client.health()
    assert result.output_ids == (7, 8, 2) and result.output_logprobs == (-0.125,) * 3
    assert (result.finish_type, result.finish_matched, result.prompt_tokens) == ("stop", 2, 3)
    assert (cut.output_ids, cut.finish_type, cut.finish_matched) == ((7, 8), "length", 2)
    assert engine.num_generate_calls == 2 and engine.num_prompt_tokens == 6

    reply = b'{"output_ids":[5],"meta_info":{"finish_reason":{"type":"length","length":1},"output_token_logprobs":[[-1.0,5,null]]}}'
    server = ScriptedServer([_answer(b'{"error":"busy"}', status=503), _answer(reply)])
    flaky = await _serve(nursery, server)
    async with open_engine_client(flaky, config=FAST) as client:
        with trio.fail_after(10):
            assert (await client.generate([1], SamplingParams(), rid="r3")).output_ids == (5,)
    assert server.requests == 2

    with trio.socket.socket() as probe:
        await probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    async with open_engine_client(dead, config=FAST) as client:
        with trio.fail_after(10), pytest.raises(BackendError, match="unreachable after 2 attempts"):
            await client.generate([1], SamplingParams(), rid="r4")


def test_ids_json_encoder_reuses_prefixes_and_matches_json_dumps() -> None:
    import json
    import random

    from relaxtrio.sglang._ids_json import IdsJsonEncoder

    encoder = IdsJsonEncoder(max_entries=4)
    rng = random.Random(0)
    history: list[int] = []
    sent = 0
    for turn in range(30):
        if turn % 7 == 6:
            history = history[: rng.randrange(len(history) + 1)]  # a branch off an earlier state
        history = history + [rng.randrange(50000) for _ in range(rng.randrange(0, 40))]
        fields = {"rid": f"r{turn}", "sampling_params": {"max_new_tokens": 4}, "return_logprob": True}
        body = encoder.body(history, fields)
        assert json.loads(body) == {"input_ids": history, **fields}
        assert body == json.dumps({"input_ids": history, **fields}, separators=(",", ":")).encode()
        sent += len(history)
    assert 0 < encoder.num_reused_ids < sent
    assert encoder.body([], {}) == b'{"input_ids":[]}'


def test_ids_json_encoder_keys_compare_only_their_own_sequences() -> None:
    import json

    from relaxtrio.sglang._ids_json import IdsJsonEncoder

    def _compact(ids: list[int]) -> str:
        return json.dumps(ids, separators=(",", ":"))

    encoder = IdsJsonEncoder(max_entries=2, keyed_entries=2, max_keys=2)
    shared = list(range(100, 140))
    for key in ("a", "b"):
        assert encoder.ids_text([*shared, ord(key)], key) == _compact([*shared, ord(key)])[1:-1]
    assert encoder.num_reused_ids == 0  # "b" never looks at "a"'s sequence
    grown = [*shared, ord("a"), 7, 8]
    assert encoder.ids_text(grown, "a") == _compact(grown)[1:-1]
    assert encoder.num_reused_ids == len(shared) + 1
    encoder.ids_text([1], "c")  # a third key forgets the least recently used one ("b")
    assert encoder.ids_text([*shared, ord("b"), 9], "b") == _compact([*shared, ord("b"), 9])[1:-1]
    assert encoder.num_reused_ids == len(shared) + 1


def test_ids_json_encoder_extends_lineage_views_without_comparing_ids() -> None:
    import json
    import random

    from relaxtrio.forest import LineageIds
    from relaxtrio.sglang._ids_json import IdsJsonEncoder

    encoder = IdsJsonEncoder()
    rng = random.Random(1)
    views = [LineageIds.of([rng.randrange(50000) for _ in range(5)])]
    reused = 0
    for turn in range(40):
        # Mostly the next turn (extend the last view), sometimes a branch off an earlier one.
        base = views[-1] if turn % 5 else views[rng.randrange(len(views))]
        view = base.extended([rng.randrange(50000) for _ in range(rng.randrange(0, 30))])
        views.append(view)
        before = encoder.num_reused_ids
        fields = {"rid": f"r{turn}", "return_logprob": True}
        body = encoder.body(view, fields, "s")
        assert body == json.dumps({"input_ids": list(view), **fields}, separators=(",", ":")).encode()
        assert encoder.ids_text(tuple(view), "s") == json.dumps(list(view), separators=(",", ":"))[1:-1]
        if turn % 5 and base is views[-2]:  # the next turn reuses the text of the previous one
            assert encoder.num_reused_ids - before >= len(base)
        reused = encoder.num_reused_ids
    assert reused > 0
    # Only views of the same buffer count as prefixes: equal ids in another buffer are encoded.
    other = LineageIds.of(list(views[-1]))
    before = encoder.num_reused_ids
    assert encoder.ids_text(other, "t") == json.dumps(list(other), separators=(",", ":"))[1:-1]
    assert encoder.num_reused_ids == before


def test_pool_response_json_decodes_exactly_like_json_loads() -> None:
    import json
    import math

    from relaxtrio.sglang._pool import PoolResponse

    bodies = [
        b'{"output_ids":[1,2],"meta_info":{"output_token_logprobs":[[-0.5,1,null],[-1e-05,2,"x"]]}}',
        b'[-Infinity, 1.5, "\\u00e9t\\u00e9", {"k": 1}, {"k": 2}]',  # orjson refuses -Infinity
        b'{"big": 123456789012345678901234567890, "s": "\\ud800"}',  # past 64 bits, lone surrogate
        b'{"dup": 1, "dup": 2}',
    ]
    for body in bodies:
        assert repr(PoolResponse(200, body, {}).json()) == repr(json.loads(body))
    assert math.isnan(PoolResponse(200, b"[NaN]", {}).json()[0])
    for broken in (b"", b"{", b"\xff"):
        with pytest.raises(ValueError):
            PoolResponse(200, broken, {}).json()


def test_generate_reply_parsing_fast_and_checked_paths_agree() -> None:
    from relaxtrio.sglang._replies import parse_generate_response

    def reply(rows: list, ids: list) -> dict:
        return {"output_ids": ids, "meta_info": {"finish_reason": {"type": "length", "length": 2},
                                                 "output_token_logprobs": rows}}

    fast = parse_generate_response(reply([[-0.5, 7, None], [float("-inf"), 8, "x"]], [7, 8]),
                                   return_logprob=True)
    assert fast.output_logprobs == (-0.5, float("-inf"))
    mixed = parse_generate_response(reply([[-1, 7], (-0.25, 8)], [7, 8]), return_logprob=True)
    assert mixed.output_logprobs == (-1.0, -0.25) and type(mixed.output_logprobs[0]) is float
    for rows, match in (([[-0.5, 7], [float("nan"), 8]], r"output_token_logprobs\[1\] has no logprob"),
                        ([[-0.5, 7], [-0.5, 9]], r"output_token_logprobs\[1\] is for id 9"),
                        ([[-0.5, 7], [True, 8]], r"output_token_logprobs\[1\] has no logprob"),
                        ([[-0.5, 7], [-0.5]], r"output_token_logprobs\[1\] is not a")):
        with pytest.raises(BackendError, match=match):
            parse_generate_response(reply(rows, [7, 8]), return_logprob=True)
    with pytest.raises(BackendError, match="output_ids must be a list of integers"):
        parse_generate_response(reply([[-0.5, 7], [-0.5, 8]], [7, True]), return_logprob=True)


async def test_instant_engine_reads_http_by_itself(nursery: trio.Nursery) -> None:
    """Its minimal HTTP/1.1 reader: keep-alive with a query and a body split over reads, then
    a bad request line (400), a chunked body (501) and ``Connection: close`` each end the
    connection after their answer."""
    engine = InstantEngine(reply_ids=[7, 2], eos_id=2)
    url = await nursery.start(serve_instant_engine, engine)
    host, port = url.removeprefix("http://").split(":")

    async def exchange(*parts: bytes) -> bytes:
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            for part in parts:
                await stream.send_all(part)
                await trio.sleep(0.01)
            received = b""
            while chunk := await stream.receive_some(65536):
                received += chunk
        return received

    body = b'{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":1}}'
    head = b"POST /generate?x=1 HTTP/1.1\r\nHost: e\r\nContent-Length: %d\r\n\r\n" % len(body)
    with trio.fail_after(10):
        kept = await exchange(head + body[:10], body[10:] + b"GET /health HTTP/1.1\r\n\r\n",
                              b"GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n")
        bad = await exchange(b"NONSENSE\r\n\r\n")
        chunked = await exchange(b"POST /generate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    answers = kept.split(b"HTTP/1.1 ")[1:]
    assert [a.split(b" ", 1)[0] for a in answers] == [b"200", b"200", b"404"]
    assert b'"output_ids":[7]' in answers[0] and b"Connection: close" in answers[2]
    assert bad.startswith(b"HTTP/1.1 400 ") and b"malformed request line" in bad
    assert chunked.startswith(b"HTTP/1.1 501 ") and engine.num_generate_calls == 1

    def post(payload: bytes, extra: bytes = b"") -> bytes:
        return b"POST /generate HTTP/1.1\r\nContent-Length: %d\r\n%s\r\n%s" % (len(payload), extra, payload)

    # Bodies of the wrong shape are 400s on a connection that stays open; heads it cannot read
    # (bare LF, two different lengths, past 64 KiB) are answered and closed; it serves on.
    with trio.fail_after(10):
        shapes = await exchange(post(b"[1,2]"), post(b'{"sampling_params":[1]}'),
                                post(b'{"sampling_params":{"max_new_tokens":1.5}}'),
                                post(b'{"input_ids":{"a":1}}'),
                                post(body, b"Connection: close\r\n"))
        bare_lf = await exchange(b"GET /health HTTP/1.1\n\n")
        twice = await exchange(post(body, b"Content-Length: 3\r\n"))
        large = await exchange(b"GET /health HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n")
    answers = shapes.split(b"HTTP/1.1 ")[1:]
    assert [a.split(b" ", 1)[0] for a in answers] == [b"400"] * 4 + [b"200"]
    assert b"max_new_tokens must be a non-negative integer" in answers[2]
    assert bare_lf.startswith(b"HTTP/1.1 400 ") and b"CRLF" in bare_lf
    assert twice.startswith(b"HTTP/1.1 400 ") and large.startswith(b"HTTP/1.1 431 ")
    assert engine.num_generate_calls == 2
