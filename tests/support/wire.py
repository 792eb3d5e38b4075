"""Raw HTTP/1.1 and HTTP/2 clients for connection-fault tests.

HTTP/1.1 is bytes on a trio socket (so a test can send what no client library would: a body cut
short, an illegal chunk header, garbage). HTTP/2 is the ``h2`` library's state machine (shipped
with hypercorn) over a trio socket, prior-knowledge cleartext (h2c), which hypercorn detects from
the connection preface.
"""

from __future__ import annotations

import re
import socket
import struct
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager

import attrs
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import trio

Header = tuple[str, str]


async def open_raw(port: int) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port)


async def read_until_eof(stream: trio.SocketStream, limit_s: float = 5.0) -> bytes:
    """Everything the server sends until it closes (or ``limit_s`` seconds pass, or a reset)."""
    chunks = []
    with trio.move_on_after(limit_s):
        try:
            while data := await stream.receive_some():
                chunks.append(data)
        except trio.BrokenResourceError:
            pass  # reset by the server: what came before still counts
    return b"".join(chunks)


async def exchange(port: int, data: bytes, *, half_close: bool = False, limit_s: float = 5.0) -> bytes:
    """Sends ``data`` on a new connection (then half-closes when asked) and returns the reply bytes."""
    stream = await open_raw(port)
    try:
        try:
            await stream.send_all(data)
            if half_close:
                await stream.send_eof()
        except trio.BrokenResourceError:
            pass  # the server already closed: read what it said
        return await read_until_eof(stream, limit_s)
    finally:
        await stream.aclose()


def reset_on_close(stream: trio.SocketStream) -> None:
    """Makes the next ``aclose`` send a TCP RST instead of a FIN (SO_LINGER 0)."""
    stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def statuses(raw: bytes) -> list[int]:
    """Status codes of every HTTP/1.1 response in ``raw``, in order (pipelined responses follow
    each other's bodies directly, so this scans rather than splits lines)."""
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", raw)]


def http1_request(method: str, path: str, headers: Sequence[Header] = (), body: bytes | None = None,
                  *, content_length: int | None = None) -> bytes:
    """One HTTP/1.1 request's bytes; ``content_length`` may lie about ``body``."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers)]
    if body is not None or content_length is not None:
        lines.append(f"Content-Length: {len(body or b'') if content_length is None else content_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


@attrs.define(eq=False)
class H2Response:
    status: int | None = None
    body: bytes = b""
    ended: bool = False
    reset: bool = False


@attrs.define(eq=False)
class H2Client:
    """One HTTP/2 connection driven by hand: queue frames, flush, read responses."""

    stream: trio.SocketStream
    conn: h2.connection.H2Connection
    responses: dict[int, H2Response] = attrs.field(factory=dict)
    terminated: bool = False


    def request(self, method: str, path: str, headers: Iterable[Header] = (), body: bytes | None = None,
                *, end_stream: bool = True, protocol: str | None = None) -> int:
        """Queues one request; returns its stream id. With ``end_stream=False`` the body stays open;
        ``protocol`` is RFC 8441's ``:protocol`` (extended CONNECT)."""
        sid = self.conn.get_next_available_stream_id()
        pseudo = [(":method", method), (":path", path), (":scheme", "http"), (":authority", "127.0.0.1")]
        if protocol is not None:
            pseudo.insert(1, (":protocol", protocol))
        self.conn.send_headers(sid, [*pseudo, *headers], end_stream=body is None and end_stream)
        if body is not None:
            self.conn.send_data(sid, body, end_stream=end_stream)
        self.responses[sid] = H2Response()
        return sid

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            try:
                await self.stream.send_all(data)
            except trio.BrokenResourceError:
                self.terminated = True

    async def read(self, until: Iterable[int] | None = None, limit_s: float = 10.0, *,
                   headers_only: bool = False) -> None:
        """Processes server frames until every stream in ``until`` ended (or was reset; with
        ``headers_only``, until each has its response headers), the server closed the connection,
        or ``limit_s`` seconds passed (``until=None``: until the connection ends or time is up)."""
        waiting = None if until is None else set(until)

        def pending(sid: int) -> bool:
            response = self.responses[sid]
            return response.status is None if headers_only else not (response.ended or response.reset)

        with trio.move_on_after(limit_s):
            while not self.terminated and (waiting is None or any(pending(sid) for sid in waiting)):
                await self.read_some()

    async def read_some(self) -> None:
        """Processes one chunk of server bytes (a checkpoint; waits for the server)."""
        try:
            data = await self.stream.receive_some()
        except trio.BrokenResourceError:
            data = b""
        if not data:
            self.terminated = True
            return
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.terminated = True
            return
        for event in events:
            self._on_event(event)
        await self.flush()

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            self.responses[event.stream_id].status = int(dict(event.headers)[":status"])
        elif isinstance(event, h2.events.DataReceived):
            self.responses[event.stream_id].body += event.data
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            self.responses[event.stream_id].ended = True
        elif isinstance(event, h2.events.StreamReset):
            self.responses[event.stream_id].reset = True
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.terminated = True



@asynccontextmanager
async def open_h2(port: int, settings: dict[int, int] | None = None) -> AsyncIterator[H2Client]:
    """An HTTP/2 connection (preface and SETTINGS sent); the socket is closed on exit."""
    async with await open_raw(port) as stream:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        if settings:
            conn.update_settings(settings)
        client = H2Client(stream, conn)
        await client.flush()
        yield client
