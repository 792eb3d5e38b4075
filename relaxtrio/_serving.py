"""Serving an ASGI app on hypercorn's trio backend so that one connection's fault stays its own.

Both servers we run (the agent API, :func:`relaxtrio.api.app.serve_api`, and the embedded engine,
:func:`relaxtrio.engine.server.serve_engine`) serve through :func:`serve_isolated`. It differs from
``hypercorn.trio.serve`` (hypercorn 0.18.0) in the connection handler, :class:`IsolatedTCPServer`:

* **One sender at a time.** hypercorn serializes ``send_all`` calls with a per-connection lock,
  but half-closes the socket (``send_eof``) without it. trio refuses two tasks sending on one
  stream, so when a protocol error and the app's own reply close the connection at the same time
  (a body cut short and then half-closed, an illegal chunk header, an HTTP/2 client that goes away
  with streams open), the loser raised ``trio.BusyResourceError``. Here ``send_eof`` takes the
  same lock (waiting at most :data:`CLOSE_FLUSH_S` for a send in flight; past that the socket is
  closed under it, which ends that send with ``trio.ClosedResourceError``, already handled).
* **A connection's failure ends that connection.** hypercorn lets any exception out of a
  connection's task group (``BusyResourceError``, a ``KeyError`` on an HTTP/2 stream the server
  already closed, a protocol-library error it does not expect) reach the nursery that holds every
  connection, which takes the whole server down: in a training run, the run. Here every
  ``Exception`` raised inside one connection closes that connection and logs one WARNING line
  (the traceback goes to DEBUG). Cancellation and ``KeyboardInterrupt`` still propagate.
* **A large body is handed over in one piece.** hypercorn reads at most 64 KiB per receive and
  passes every piece through h11, its stream and the ASGI queue separately (several task
  switches each), so a request's cost grew with its body: an agent replaying a 2,000-message
  history (126 KB) paid for 3-8 pieces. When a receive fills its 64 KiB, whatever the kernel
  already holds for the connection is read at once, without waiting
  (:func:`_drain_ready`, up to :data:`COALESCE_MAX_BYTES`), and handed over as one piece. A
  shorter receive is handed over as it is, so small requests make no extra system call.
* **A closed connection is let go at once.** hypercorn starts its keep-alive timer
  (``keep_alive_timeout``) after each answer, in the connection's task group, and nothing stops
  it when the client then closes the connection: the handler, and the socket in CLOSE-WAIT, stay
  until the timer runs out (120 s for the agent API; an agent that opens a connection per
  request could exhaust the file descriptors). Here the timer is stopped when the reader sees
  the end of the stream, and not started again after it. (quart's routes never hit this: quart
  cancels its request handler when the stream closes, which also cancelled the timer's start.)
* **A wire error is not an app error.** When such a fault surfaces inside the app's own send,
  hypercorn logs "Error in ASGI Framework" with a traceback; here that is one INFO line when every
  exception involved is a wire error (:data:`_WIRE_ERRORS`), and still the traceback otherwise.

Upstream shape: hypercorn issue #203 (a connection-level error takes the trio worker down) and
#225 (a WebSocket handshake with trailing bytes does the same). The trio ``TCPServer.run`` of the
0.18.0 release catches only ``OSError``, and its ``_close`` half-closes outside the send lock.

:func:`serve_isolated` is hypercorn's trio worker loop reduced to what we use: plain TCP binds
(no TLS, no QUIC, no ``max_requests``), the ASGI lifespan, a shutdown trigger and graceful close.
hypercorn hard-wires its handler class into that loop, so the loop is written out here.

May import: trio, hypercorn and its protocol libraries (h11, h2, wsproto, priority); never torch,
quart or another relaxtrio package.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from math import inf
from typing import Any, Final

import h2.exceptions
import h11
import priority
import trio
import wsproto.utilities
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.logging import Logger
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import repr_socket_addr, wrap_app

__all__ = [
    "CLOSE_FLUSH_S",
    "COALESCE_MAX_BYTES",
    "LISTEN_BACKLOG",
    "READ_BYTES",
    "SERVING_GC_THRESHOLDS",
    "IsolatedTCPServer",
    "freeze_startup_heap",
    "serve_isolated",
]

log = logging.getLogger(__name__)

LISTEN_BACKLOG: Final = 4096
"""Pending connections a listener queues before accepting them (the kernel caps it at
``net.core.somaxconn``). hypercorn's default of 100 overflows when a thousand agents connect at
once: the kernel then drops their handshakes, clients wait out SYN retransmits (1, 3, 7, 15 s...)
and some see their connection reset. Measured with ``benchmarks/concurrency.py``."""

SERVING_GC_THRESHOLDS: Final = (50_000, 10, 10)
"""The cyclic GC's generation thresholds in a serving process (Python's defaults: 700, 10, 10).

Generation 0 is collected once the tracked objects allocated since its last collection
outnumber those freed by the first threshold. Under load, most of what a young collection finds
is alive only because its request is still in flight (parsed bodies, conversations, lineage
id tuples of up to 64 concurrent turns); at 700 those objects were walked, promoted and walked
again in generation 1 (and their promotions triggered full collections of every Session's
forest): about a tenth of the agent API's CPU. At 50,000 most of them are freed by reference
counting before any collection sees them; garbage cycles (rare here) wait longer, a few MB at
most. Measured with ``benchmarks/gateway_overhead.py``."""

CLOSE_FLUSH_S: Final = 1.0
"""Seconds a closing connection waits for a send in flight before closing the socket under it."""

READ_BYTES: Final = 1 << 16
"""Bytes one receive asks for (hypercorn's own size). A bytes object this small comes from the
heap; asking for 256 KiB or more made every small request about 28 µs dearer here (the
allocation is then a fresh mapping each time), so larger reads only follow a full one."""

COALESCE_MAX_BYTES: Final = 4 << 20
"""Bytes after which a connection stops reading what is already waiting and hands its piece
to the protocol (so a piece is at most this plus one receive); the rest waits for the next
receive."""


_WIRE_ERRORS: Final = (
    h11.ProtocolError,
    h2.exceptions.H2Error,
    wsproto.utilities.ProtocolError,
    priority.PriorityError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    trio.BusyResourceError,
)
"""What a broken or misbehaving peer raises inside hypercorn (never a bug of the app's own)."""


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _describe(exc: BaseException) -> str:
    """One line naming every leaf exception of ``exc`` (type and message)."""
    return "; ".join(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__ for e in _leaves(exc))


class _FaultLogger(Logger):
    """hypercorn's logger, except that an ASGI task ended by a wire error (the peer broke the
    connection under the app's reply) is one INFO line, not an ERROR traceback blaming the app."""

    async def exception(self, message: str, *args: Any, **kwargs: Any) -> None:
        exc = sys.exc_info()[1]
        leaves = [e for e in _leaves(exc) if not isinstance(e, trio.Cancelled)] if exc else []
        if leaves and all(isinstance(e, _WIRE_ERRORS) for e in leaves):
            await self.info("an ASGI task ended with its connection: %s", _describe(exc))
        else:
            await super().exception(message, *args, **kwargs)


class IsolatedTCPServer(TCPServer):
    """hypercorn's trio connection handler, with its close under the send lock and its failures
    kept to itself (see the module docstring). Constructed and awaited by trio's
    ``serve_listeners`` exactly like :class:`hypercorn.trio.tcp_server.TCPServer`."""

    _peer_gone = False  # the reader saw the end of the stream (or the connection broke)

    async def run(self) -> None:
        """Serves one connection until it closes; never raises an ``Exception``.

        Cancellation:
            Cancelling closes the connection (hypercorn's own ``finally``) and propagates.
        """
        peer = _peer_name(self.stream)
        try:
            await super().run()
        except* Exception as group:
            log.warning("connection from %s closed after a fault: %s", peer, _describe(group))
            log.debug("connection fault detail", exc_info=group)

    async def _read_data(self) -> None:
        """hypercorn's receive loop, except that a full receive is followed by whatever else the
        kernel already holds (:func:`_drain_ready`), handed to the protocol as one piece.

        Cancellation:
            Cancelling ends the loop (the connection is closing).
        """
        stream = self.stream
        fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else None
        while True:
            try:
                with trio.fail_after(self.config.read_timeout or inf):
                    data = await stream.receive_some(READ_BYTES)
            except (trio.ClosedResourceError, trio.BrokenResourceError, trio.TooSlowError):
                break
            if fd is not None and len(data) == READ_BYTES:
                data = _drain_ready(fd, data)
            await self.protocol.handle(RawData(bytes(data)))
            if not data:
                break
        self._peer_gone = True
        await self.protocol.handle(Closed())
        await self.idle_task.stop()  # no keep-alive wait may hold a connection its peer closed

    async def protocol_send(self, event: Event) -> None:
        """hypercorn's, except that once the peer closed the connection no keep-alive timer is
        started (an answer finished after the close would start one otherwise).

        Cancellation:
            As hypercorn's.
        """
        if isinstance(event, Updated) and event.idle and self._peer_gone:
            return
        await super().protocol_send(event)

    async def _close(self) -> None:
        """Half-closes (under the send lock) and closes the socket.

        Cancellation:
            A checkpoint; the socket is closed even when cancelled.
        """
        try:
            if self.send_lock.statistics().owner is not trio.lowlevel.current_task():
                with trio.move_on_after(CLOSE_FLUSH_S):
                    async with self.send_lock:
                        await self.stream.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError, AttributeError):
            pass  # the peer is gone already, or a TLS stream (no half-close)
        finally:
            await self.stream.aclose()


def _drain_ready(fd: int, first: bytes | bytearray, limit: int = COALESCE_MAX_BYTES) -> bytes | bytearray:
    """``first`` (a receive that filled :data:`READ_BYTES`) followed by what the non-blocking
    socket ``fd`` already holds, read without waiting, while each read fills
    :data:`READ_BYTES` and the total is under ``limit`` bytes.

    An end of stream, a reset or any other error ends the reading here, and the bytes read so
    far are returned; the next receive reports the condition. An end of stream repeats; a reset
    is reported once, so the next receive sees an end of stream instead of
    ``trio.BrokenResourceError``: either way the protocol gets the data, then the close
    (``tests/test_serving.py`` resets connections mid-body).

    Returns:
        ``first`` itself when nothing more was read, else the bytes read, in order.
    """
    parts = [first]
    size = last = len(first)
    while last == READ_BYTES and size < limit:
        try:
            more = os.read(fd, READ_BYTES)
        except OSError:  # BlockingIOError: nothing waiting; anything else: the next receive says
            break
        if not more:
            break
        parts.append(more)
        size += len(more)
        last = len(more)
    return first if len(parts) == 1 else b"".join(parts)


def freeze_startup_heap() -> None:
    """Moves every object alive now into the cyclic GC's permanent generation and raises the
    youngest generation's threshold to :data:`SERVING_GC_THRESHOLDS`, once per process.

    A serving process holds a large heap that never becomes garbage (torch, transformers, the
    tokenizer: about 340,000 tracked objects here), and every full collection of the cyclic GC
    walks all of it; with the agent API under load those walks took about a tenth of the server's
    CPU. Called by the processes that serve agents (``train``, ``serve``, the benchmark servers)
    once their start-up is done: it collects first (so no garbage is frozen), then freezes. A
    second call in the same process does nothing. Frozen objects are still freed by reference
    counting; only reference cycles among them are never collected (``gc.unfreeze`` undoes it).
    """
    if gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()
        gc.set_threshold(*SERVING_GC_THRESHOLDS)


def _peer_name(stream: Any) -> str:
    sock = getattr(stream, "socket", None)
    try:
        return repr_socket_addr(sock.family, sock.getpeername())
    except (AttributeError, OSError):
        return "an unknown peer"


async def serve_isolated(
    app: Any,
    config: Config,
    *,
    shutdown_trigger: Callable[[], Awaitable[object]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serves an ASGI app with :class:`IsolatedTCPServer` connections until cancelled or
    ``shutdown_trigger`` returns.

    Args:
        app: the ASGI app (a QuartTrio app).
        config: hypercorn settings; ``bind``, ``backlog``, ``graceful_timeout``,
            ``keep_alive_timeout``, the h11/h2 limits and the loggers are honoured. TLS, QUIC and
            ``max_requests`` are not offered here. Its ``logger_class`` is replaced (set before
            ``config.log`` is first read) so that wire errors inside ASGI tasks log one line.
        shutdown_trigger: when it returns, the listeners close, open connections get
            ``config.graceful_timeout`` seconds to finish, and the function returns.
        task_status: receives the bound URLs (``["http://127.0.0.1:41234"]``) once listening.

    Raises:
        ValueError: ``config`` asks for TLS, QUIC or ``max_requests``.
        OSError: a bind failed (e.g. the port is in use); raised before anything started.

    Cancellation:
        Cancelling closes the listeners and every connection at once (their ASGI tasks are
        cancelled with them).
    """
    if config.ssl_enabled or config.quic_bind or config.max_requests is not None:
        raise ValueError("serve_isolated serves plain TCP binds only (no TLS, QUIC or max_requests)")
    config.logger_class = _FaultLogger
    asgi = wrap_app(app, config.wsgi_max_body_size, "asgi")
    lifespan_state: dict[str, Any] = {}
    lifespan = Lifespan(asgi, config, lifespan_state)
    context = WorkerContext(None)
    # Bind before anything starts: a port in use raises OSError here, not from inside nurseries.
    sockets = config.create_sockets().insecure_sockets
    try:
        await _serve_bound(asgi, config, sockets, lifespan, lifespan_state, context, shutdown_trigger,
                           task_status)
    finally:
        for sock in sockets:  # closed already when they became listeners; closing again is a no-op
            sock.close()


async def _serve_bound(
    asgi: Any, config: Config, sockets: list[Any], lifespan: Lifespan, lifespan_state: dict[str, Any],
    context: WorkerContext, shutdown_trigger: Callable[[], Awaitable[object]] | None,
    task_status: trio.TaskStatus[list[str]],
) -> None:
    """:func:`serve_isolated` once its sockets are bound."""
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:
            listeners = []
            binds = []
            for sock in sockets:
                sock.listen(config.backlog)
                listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
                binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
            handler = functools.partial(
                IsolatedTCPServer, asgi, config, context, ConnectionState(lifespan_state.copy())
            )
            task_status.started(binds)
            try:
                async with trio.open_nursery() as accepting:
                    accepting.start_soon(
                        functools.partial(trio.serve_listeners, handler, listeners,
                                          handler_nursery=connections)
                    )
                    if shutdown_trigger is None:
                        await trio.sleep_forever()
                    await shutdown_trigger()
                    accepting.cancel_scope.cancel()
            finally:
                with trio.CancelScope(shield=True):
                    for listener in listeners:  # refuse new connections while the open ones finish
                        await listener.aclose()
                await context.terminated.set()  # idle keep-alive connections close now
                connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
