"""``IsolatedTCPServer``'s receive loop: a large body reaches the protocol in one piece.

The loop's unit tests run it on one end of a Unix socket pair whose other end wrote everything
before the loop starts (so what the kernel holds is known), with a protocol that records each
event. The served test sends bodies of sizes around the 64 KiB receive size, and larger than
:data:`COALESCE_MAX_BYTES`, through a real hypercorn server, pipelined on one connection.
"""

from __future__ import annotations

import hashlib
import os
import socket
from typing import Any

import pytest
import trio
from hypercorn.config import Config
from hypercorn.events import Closed, RawData
from quart import Response, request
from quart_trio import QuartTrio
from tests.support.apps import serve_app
from tests.support.wire import http1_request, open_raw

from relaxtrio._serving import (
    COALESCE_MAX_BYTES,
    READ_BYTES,
    IsolatedTCPServer,
    _drain_ready,
)

_PAIR_BUFFER = 1 << 20


class _Recorder:
    """Stands in for hypercorn's protocol: records every event handed to it."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self._handed = trio.Event()

    async def handle(self, event: Any) -> None:
        self.events.append(event)
        self._handed.set()
        self._handed = trio.Event()

    async def wait_for(self, count: int) -> None:
        """Returns once ``count`` events were handed over (the data crosses a real socket)."""
        while len(self.events) < count:
            await self._handed.wait()


def _filled_pair(payload: bytes, *, close: bool) -> tuple[socket.socket, socket.socket]:
    """A socket pair whose reading end already holds ``payload`` (and an end of stream)."""
    writer, reader = socket.socketpair()
    writer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _PAIR_BUFFER)
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _PAIR_BUFFER)
    writer.sendall(payload)
    if close:
        writer.close()
    reader.setblocking(False)
    return writer, reader


async def _read_all(reader: socket.socket) -> list[Any]:
    server = IsolatedTCPServer(None, Config(), None, None,
                               trio.SocketStream(trio.socket.from_stdlib_socket(reader)))
    recorder = _Recorder()
    server.protocol = recorder
    with trio.fail_after(10):
        await server._read_data()
    return recorder.events


def _payload(size: int) -> bytes:
    return bytes(i % 251 for i in range(size))


async def test_a_body_already_waiting_reaches_the_protocol_in_one_piece() -> None:
    payload = _payload(3 * READ_BYTES + 1234)
    _writer, reader = _filled_pair(payload, close=True)
    events = await _read_all(reader)
    reader.close()
    # hypercorn's own loop hands this over as four pieces (64 KiB each, then the rest)
    assert [type(e) for e in events] == [RawData, RawData, Closed]
    assert events[0].data == payload
    assert events[1].data == b""


async def test_a_short_receive_is_handed_over_as_it_is() -> None:
    writer, reader = _filled_pair(b"GET / HTTP/1.1\r\n\r\n", close=False)
    async with trio.open_nursery() as nursery:
        server = IsolatedTCPServer(None, Config(), None, None,
                                   trio.SocketStream(trio.socket.from_stdlib_socket(reader)))
        recorder = _Recorder()
        server.protocol = recorder
        nursery.start_soon(server._read_data)
        await trio.testing.wait_all_tasks_blocked()
        assert [e.data for e in recorder.events] == [b"GET / HTTP/1.1\r\n\r\n"]
        writer.sendall(b"more")  # arrives later: its own piece
        with trio.fail_after(5):
            await recorder.wait_for(2)
        writer.close()
    assert [e.data for e in recorder.events[:3]] == [b"GET / HTTP/1.1\r\n\r\n", b"more", b""]
    assert isinstance(recorder.events[-1], Closed)
    reader.close()


def test_drain_reads_only_what_is_waiting_and_stops_at_the_limit() -> None:
    payload = _payload(5 * READ_BYTES)
    writer, reader = _filled_pair(payload, close=False)
    first = reader.recv(READ_BYTES)
    assert _drain_ready(reader.fileno(), first, limit=2 * READ_BYTES) == payload[:2 * READ_BYTES]
    rest = _drain_ready(reader.fileno(), reader.recv(READ_BYTES))  # stops when nothing waits
    assert rest == payload[2 * READ_BYTES:]
    with pytest.raises(BlockingIOError):
        os.read(reader.fileno(), 1)
    writer.close()
    reader.close()


def test_drain_leaves_an_end_of_stream_to_the_next_receive() -> None:
    payload = _payload(READ_BYTES + 10)
    _writer, reader = _filled_pair(payload, close=True)
    assert _drain_ready(reader.fileno(), reader.recv(READ_BYTES)) == payload
    assert reader.recv(READ_BYTES) == b""
    reader.close()


def test_a_short_first_piece_is_returned_untouched() -> None:
    writer, reader = _filled_pair(b"abc", close=False)
    first = reader.recv(READ_BYTES)
    writer.sendall(b"def")
    assert _drain_ready(reader.fileno(), first) is first
    assert reader.recv(READ_BYTES) == b"def"
    writer.close()
    reader.close()


def _echo_app() -> QuartTrio:
    app = QuartTrio(__name__)
    app.config["MAX_CONTENT_LENGTH"] = 16 << 20

    @app.post("/digest")
    async def digest() -> Response:
        body = await request.get_data()
        return Response(f"{len(body)} {hashlib.sha256(body).hexdigest()}", mimetype="text/plain")

    return app


async def test_bodies_of_every_size_arrive_intact_through_hypercorn() -> None:
    sizes = [0, 1, READ_BYTES - 1, READ_BYTES, READ_BYTES + 1, 3 * READ_BYTES,
             COALESCE_MAX_BYTES + 3 * READ_BYTES + 7]
    bodies = [_payload(n)[::-1] for n in sizes]
    async with serve_app(_echo_app()) as base_url:
        port = int(base_url.split(":")[2].split("/")[0])
        stream = await open_raw(port)
        data = b"".join(http1_request("POST", "/digest", body=body) for body in bodies)
        received = b""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream.send_all, data)  # pipelined: all requests on one connection
            with trio.fail_after(30):
                while received.count(b"HTTP/1.1 200") < len(bodies) or not received.endswith(
                        hashlib.sha256(bodies[-1]).hexdigest().encode()):
                    chunk = await stream.receive_some(1 << 16)
                    assert chunk, received[-300:]
                    received += chunk
        await stream.aclose()
    answers = [part.rsplit(b"\r\n\r\n", 1)[-1].decode() for part in received.split(b"HTTP/1.1 ")[1:]]
    assert answers == [f"{len(b)} {hashlib.sha256(b).hexdigest()}" for b in bodies]
