"""A keep-alive HTTP/1.1 connection pool on trio's socket I/O, for ``/generate`` traffic.

Why not httpx here: on trio, one httpx call costs 1.5-3 ms of CPU at 64 concurrent calls (its
request/response models, header normalization and the anyio layer), which was most of what a
turn cost relaxtrio. This pool does one thing: send one JSON body, read one whole answer. The
request head is written by hand and the answer head parsed by hand: h11 on the same streams
measured about 0.5 ms per call here, this codec well under half of that
(``benchmarks/engine_client.py`` measures httpx, httpcore, h11 and this pool in one run).
Connections are opened with ``trio.open_tcp_stream`` and then driven as non-blocking sockets
with ``trio.lowlevel.wait_readable`` / ``wait_writable``: a ``trio.SocketStream`` passes through
the scheduler on every send and receive, this pool once per call (while it waits for the answer).

Behaviour:

- **Connections**: at most ``max_connections`` open at once over all origins; a call takes an
  idle keep-alive connection of its origin or opens a new one. Keep ``max_connections`` at or
  above the number of generations in flight, so calls never queue inside the pool; when they do,
  they wait in FIFO order (a ``trio.Semaphore``).
- **Stale connections**: a reused connection the server closed while it was idle fails before
  any answer byte arrives; the call is then sent once more on a fresh connection (what every
  keep-alive client does). Any later failure goes to the caller.
- **Errors** are httpx's transport exception types (:class:`httpx.ConnectError`,
  :class:`httpx.ConnectTimeout`, :class:`httpx.ReadTimeout`, :class:`httpx.ReadError`,
  :class:`httpx.WriteError`, :class:`httpx.RemoteProtocolError`), so the retry policy in
  :mod:`._http` treats both transports alike.
- **Cancellation** closes the connection in use (the server sees a disconnect); it never goes
  back to the pool half-read.
"""

from __future__ import annotations

import json
import math
import socket
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

import attrs
import httpx
import orjson
import trio

__all__ = ["ConnectionPool", "PoolResponse"]

_READ_BYTES: Final = 65536
_USER_AGENT: Final = "relaxtrio"
_MAX_HEAD_BYTES: Final = 65536
_Origin = tuple[str, int]


@attrs.frozen
class PoolResponse:
    """A complete answer: what the engine client reads of an ``httpx.Response``.

    Attributes:
        status_code: the HTTP status.
        content: the whole body, bytes.
        headers: response headers, names lower-cased.
    """

    status_code: int
    content: bytes
    headers: Mapping[str, str] = attrs.field(repr=False)

    def json(self) -> Any:
        """The body decoded as JSON, exactly as ``json.loads`` decodes it.

        orjson decodes it first (several times faster on ``/generate`` answers); what orjson
        refuses but ``json.loads`` takes (``NaN``/``Infinity``, integers past 64 bits, lone
        surrogate escapes) is decoded again by ``json.loads``, so the result never differs.

        Raises:
            ValueError: the body is not JSON (``json.JSONDecodeError``) or not UTF-8.
        """
        try:
            return orjson.loads(self.content)
        except orjson.JSONDecodeError:
            return json.loads(self.content)


@attrs.define(eq=False)
class _Connection:
    """One open connection: a non-blocking stdlib socket that this pool alone waits on."""

    sock: socket.socket

    def close(self) -> None:
        """Close the socket at once (any task waiting on it is woken with an error)."""
        trio.lowlevel.notify_closing(self.sock)
        self.sock.close()


class _StaleConnection(Exception):
    """A reused connection failed before the first answer byte (internal)."""


def _encode(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


@attrs.define(eq=False)
class ConnectionPool:
    """Keep-alive HTTP/1.1 connections to any number of origins (plain ``http://`` only).

    Answers may be ``Content-Length``, ``chunked`` or close-delimited (HTTP/1.0); a connection
    goes back to the pool only after a complete answer that allows keep-alive.

    Args:
        max_connections: the most connections open at once, over all origins.

    Use it as an async context manager; leaving it closes every idle connection.
    """

    max_connections: int
    _limit: trio.Semaphore = attrs.field(init=False)
    _idle: dict[_Origin, list[_Connection]] = attrs.field(init=False, factory=dict)
    _targets: dict[str, tuple[_Origin, str, str]] = attrs.field(init=False, factory=dict)
    _closed: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        self._limit = trio.Semaphore(self.max_connections)

    async def __aenter__(self) -> ConnectionPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every idle connection; calls in flight close theirs when they end.

        Cancellation:
            Not a checkpoint that can leave anything open: sockets are closed forcefully.
        """
        self._closed = True
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()

    def _split(self, url: str) -> tuple[_Origin, str, str]:
        """(origin, Host header, request target) of ``url``, cached per URL string."""
        cached = self._targets.get(url)
        if cached is None:
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                raise httpx.UnsupportedProtocol(f"only plain http:// URLs are pooled, got {url!r}")
            port = parts.port or 80
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            host = parts.netloc.rsplit("@", 1)[-1]
            cached = ((parts.hostname, port), host, target)
            if len(self._targets) < 1024:  # a handful of engine routes in practice
                self._targets[url] = cached
        return cached

    async def request(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        transport_timeout: httpx.Timeout | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> PoolResponse:
        """Send one request with an optional JSON body and read the whole answer.

        Args:
            method: HTTP method.
            url: absolute ``http://`` URL.
            json: the body, encoded as compact UTF-8 JSON; None sends no body.
            content: a body that is JSON already (UTF-8 bytes); used instead of ``json``.
            transport_timeout: ``connect`` bounds opening a connection, ``read`` the wait for the whole
                answer (seconds; None = no limit); other fields are ignored.
            headers: extra request headers.

        Returns:
            The answer, any status.

        Raises:
            httpx.ConnectError, httpx.ConnectTimeout: no connection could be opened.
            httpx.ReadTimeout: the answer took longer than ``transport_timeout.read``.
            httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError: the connection broke
                or the answer was not valid HTTP/1.1.
            httpx.UnsupportedProtocol: not an ``http://`` URL.

        Cancellation:
            A checkpoint; cancelling closes the connection in use.
        """
        if self._closed:
            raise httpx.ConnectError("the connection pool is closed")
        origin, host, target = self._split(url)
        body = content if content is not None else b"" if json is None else _encode(json)
        lines = [f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {_USER_AGENT}\r\n"
                 f"Content-Length: {len(body)}\r\n"]
        if json is not None or content is not None:
            lines.append("Content-Type: application/json\r\n")
        if headers:
            lines.extend(f"{_header_text(k)}: {_header_text(v)}\r\n" for k, v in headers.items())
        lines.append("\r\n")
        head = "".join(lines).encode("latin-1")
        connect_s = _seconds(transport_timeout.connect if transport_timeout is not None else None)
        read_s = _seconds(transport_timeout.read if transport_timeout is not None else None)
        await trio.lowlevel.checkpoint_if_cancelled()
        try:  # a free slot is taken without a trip through the scheduler (the common case)
            self._limit.acquire_nowait()
        except trio.WouldBlock:
            await self._limit.acquire()
        try:
            connection = self._take_idle(origin)
            if connection is not None:
                try:
                    return await self._exchange(origin, connection, (head, body), read_s, reused=True)
                except _StaleConnection:
                    pass
            connection = await _connect(origin, connect_s)
            return await self._exchange(origin, connection, (head, body), read_s, reused=False)
        finally:
            self._limit.release()

    def _take_idle(self, origin: _Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        return idle.pop() if idle else None

    async def _exchange(
        self, origin: _Origin, connection: _Connection, data: tuple[bytes, ...], read_s: float, *,
        reused: bool,
    ) -> PoolResponse:
        """One request/response on ``connection``; it goes back to the pool only when clean.

        The request is written straight to the socket (a request fits the socket's send buffer,
        so this rarely waits), and the first wait is for the answer: one trip through trio's
        scheduler per call instead of one per socket operation.
        """
        sock = connection.sock
        reader = _Reader(sock, origin, stale_ok=reused)
        reusable = False
        try:
            try:
                await _send_all(sock, data)
            except OSError as exc:
                if reused:
                    raise _StaleConnection from exc
                raise httpx.WriteError(f"sending to {_where(origin)} failed: {exc!r}") from exc
            if read_s == math.inf:  # /generate: no read limit, and no cancel scope to pay for
                response, reusable = await _read_response(reader)
            else:
                with trio.move_on_after(read_s) as scope:
                    response, reusable = await _read_response(reader)
                if scope.cancelled_caught:
                    raise httpx.ReadTimeout(f"{_where(origin)} sent no complete answer in {read_s} s")
        finally:
            if reusable and not reader.buffer and not self._closed:
                self._idle.setdefault(origin, []).append(connection)
            else:
                connection.close()
        return response


def _where(origin: _Origin) -> str:
    return f"{origin[0]}:{origin[1]}"


async def _send_all(sock: socket.socket, chunks: tuple[bytes, ...]) -> None:
    """Write ``chunks`` in order to a non-blocking socket (gathered by ``sendmsg``, so a large
    body is not copied behind its head), waiting only while the send buffer is full.

    Raises:
        OSError: the connection broke.

    Cancellation:
        A checkpoint only when it waits; a cancelled wait leaves the request half-sent (the
        caller closes the connection).
    """
    views = [memoryview(chunk) for chunk in chunks if chunk]
    while views:
        try:
            sent = sock.sendmsg(views)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        while sent:  # drop what went out; a partly sent chunk goes on from where it stopped
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0] = views[0][sent:]
                sent = 0


class _Reader:
    """Buffered reads of one answer; EOF or a reset before its first byte marks a stale connection."""

    def __init__(self, sock: socket.socket, origin: _Origin, *, stale_ok: bool):
        self.sock = sock
        self.origin = origin
        self.buffer = bytearray()
        self._stale_ok = stale_ok
        self._waited = False  # the first read waits first: the answer cannot be there yet
        self.eof = False

    async def fill(self) -> None:
        """Read more bytes into :attr:`buffer` (sets :attr:`eof` at the end of the stream).

        Cancellation:
            A checkpoint (the first call of an answer always waits for the socket).
        """
        try:
            while True:
                if not self._waited:
                    self._waited = True
                    await trio.lowlevel.wait_readable(self.sock)
                try:
                    chunk = self.sock.recv(_READ_BYTES)
                    break
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(self.sock)
        except OSError as exc:
            if self._stale_ok:
                raise _StaleConnection from exc
            raise httpx.ReadError(f"reading from {_where(self.origin)} failed: {exc!r}") from exc
        if not chunk:
            if self._stale_ok:
                raise _StaleConnection
            self.eof = True
        self._stale_ok = False
        self.buffer += chunk

    async def until(self, marker: bytes, limit: int) -> bytes:
        """Bytes up to and including ``marker`` (consumed from the buffer)."""
        start = 0
        while (end := self.buffer.find(marker, start)) < 0:
            if len(self.buffer) > limit:
                raise httpx.RemoteProtocolError(f"{_where(self.origin)} sent an oversized header")
            if self.eof:
                raise httpx.RemoteProtocolError(
                    f"{_where(self.origin)} closed the connection in the middle of an answer")
            start = max(0, len(self.buffer) - len(marker) + 1)
            await self.fill()
        end += len(marker)
        data = bytes(self.buffer[:end])
        del self.buffer[:end]
        return data

    async def exactly(self, size: int) -> bytes:
        """The next ``size`` bytes (consumed from the buffer)."""
        while len(self.buffer) < size:
            if self.eof:
                raise httpx.RemoteProtocolError(
                    f"{_where(self.origin)} closed the connection in the middle of an answer")
            await self.fill()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    async def rest(self) -> bytes:
        """Everything up to the end of the stream (a close-delimited body)."""
        while not self.eof:
            await self.fill()
        data = bytes(self.buffer)
        self.buffer.clear()
        return data


async def _read_response(reader: _Reader) -> tuple[PoolResponse, bool]:
    """(the answer, whether the connection may carry another request).

    Reads HTTP/1.0 and 1.1 answers: ``Content-Length``, ``chunked`` and close-delimited bodies;
    1xx interim answers are skipped.

    Raises:
        httpx.RemoteProtocolError: not a valid answer.
        httpx.ReadError: the connection broke.
    """
    while True:
        head = await reader.until(b"\r\n\r\n", _MAX_HEAD_BYTES)
        lines = head[:-4].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise httpx.RemoteProtocolError(
                f"{_where(reader.origin)} sent an invalid status line {lines[0][:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise httpx.RemoteProtocolError(
                    f"{_where(reader.origin)} sent an invalid header line {line[:80]!r}")
            name = name.strip().lower()
            value = value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        if status >= 200:
            break
    keep_alive = parts[0] == "HTTP/1.1"
    connection = headers.get("connection", "").lower()
    if "close" in connection:
        keep_alive = False
    elif "keep-alive" in connection:
        keep_alive = True
    if status in (204, 304):
        return PoolResponse(status, b"", headers), keep_alive
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return PoolResponse(status, await _read_chunked(reader), headers), keep_alive
    length = headers.get("content-length")
    if length is None:
        return PoolResponse(status, await reader.rest(), headers), False
    if not length.isdigit():
        raise httpx.RemoteProtocolError(
            f"{_where(reader.origin)} sent an invalid Content-Length {length[:40]!r}")
    return PoolResponse(status, await reader.exactly(int(length)), headers), keep_alive


async def _read_chunked(reader: _Reader) -> bytes:
    chunks = []
    while True:
        line = (await reader.until(b"\r\n", _MAX_HEAD_BYTES))[:-2]
        size_text = line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise httpx.RemoteProtocolError(
                f"{_where(reader.origin)} sent an invalid chunk size {size_text[:40]!r}") from None
        if size == 0:
            while await reader.until(b"\r\n", _MAX_HEAD_BYTES) != b"\r\n":  # trailers
                pass
            return b"".join(chunks)
        chunks.append(await reader.exactly(size))
        if await reader.exactly(2) != b"\r\n":
            raise httpx.RemoteProtocolError(f"{_where(reader.origin)} sent a malformed chunk")


def _header_text(value: str) -> str:
    if "\r" in value or "\n" in value:
        raise ValueError(f"invalid header text {value[:40]!r}")
    return value


def _seconds(value: float | None) -> float:
    return math.inf if value is None else float(value)


async def _connect(origin: _Origin, connect_s: float) -> _Connection:
    """A fresh connection to ``origin``.

    Raises:
        httpx.ConnectTimeout: not connected within ``connect_s`` seconds.
        httpx.ConnectError: the connection was refused or the host is unknown.
    """
    host, port = origin
    with trio.move_on_after(connect_s) as scope:
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc!r}") from exc
    if scope.cancelled_caught:
        raise httpx.ConnectTimeout(f"connecting to {host}:{port} took longer than {connect_s} s")
    # trio set the socket up (non-blocking, TCP_NODELAY); the pool drives it from here on.
    sock = socket.socket(fileno=stream.socket.detach())
    sock.setblocking(False)
    return _Connection(sock)
