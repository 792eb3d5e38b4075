"""Buffered SSE: hold the request open while the whole turn runs, then send the terminal events.

Timeline of one ``stream: true`` response (docs/agent-contract.md#buffered-sse):

1. status 200 with ``text/event-stream``, ``Cache-Control: no-cache``, ``X-Accel-Buffering: no``
   and the protocol's connection frame, at once;
2. one heartbeat frame every ``heartbeat_s`` seconds (trio clock, measured from the connection
   frame) while the turn is pending — heartbeats keep clients' and proxies' read timeouts alive;
3. the protocol's complete terminal event sequence in one chunk, or its in-stream failure
   sequence when the turn failed (the status is already 200 by then); if rendering itself fails,
   an internal-error failure sequence instead.

The body is a memory-channel producer, not an async generator: quart enters
:class:`BufferedSse` as an async context manager (``async with body: async for chunk in body``),
which opens a nursery holding two tasks — one waits for the turn, the other writes frames into
a zero-buffer channel that quart reads. Nothing ever yields from inside a cancel scope.

The turn itself runs in the Session's nursery (:meth:`Session.run_turn`): a client disconnect
cancels this body and its waiter, never the generation, which completes and is committed
(docs/agent-contract.md#client-disconnects).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Final

import attrs
import trio
from quart import Response
from quart.wrappers.response import ResponseBody

from .._errors import InternalError, RelaxError
from ..nursery.turns import TurnResult
from .errors import (
    GENERIC_INTERNAL_MESSAGE,
    RENDER_FAILED_MESSAGE,
    client_disconnect,
    describe_request,
    log_rejected,
)
from .wire import ParsedRequest, ProtocolAdapter

log = logging.getLogger(__name__)

SSE_HEADERS: Final = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

RunTurn = Callable[[], Awaitable[TurnResult]]


@attrs.define(eq=False)
class _Outcome:
    done: trio.Event = attrs.field(factory=trio.Event)  # the wait ended (the turn ended, or it was cancelled)
    result: TurnResult | None = None
    error: RelaxError | None = None

    @property
    def recorded(self) -> bool:
        """The turn's result or error is here (``done`` is also set by a cancelled wait)."""
        return self.result is not None or self.error is not None


class BufferedSse(ResponseBody):
    """A quart response body that streams one turn as Buffered SSE.

    Args:
        adapter: the request's protocol.
        request: the parsed request (echoed fields such as ``model``).
        run_turn: runs the turn and returns its committed result (``session.run_turn`` bound
            to the handler and the turn); may raise :class:`~relaxtrio.RelaxError`.
        heartbeat_s: seconds between heartbeat frames.
        target: ``"<METHOD> <path>"`` of the request, for log lines (the route is gone from
            quart's request context by the time the stream ends).
        session_id: the request's Session, for log lines.
    """

    def __init__(self, adapter: ProtocolAdapter, request: ParsedRequest, run_turn: RunTurn,
                 heartbeat_s: float, *, target: str | None = None, session_id: str | None = None):
        self._adapter = adapter
        self._request = request
        self._target = target
        self._session_id = session_id
        self._run_turn = run_turn
        self._heartbeat_s = heartbeat_s
        self._nursery_manager: AbstractAsyncContextManager[trio.Nursery] | None = None
        self._nursery: trio.Nursery | None = None
        self._receive: trio.MemoryReceiveChannel[bytes] | None = None
        self._outcome = _Outcome()

    async def __aenter__(self) -> BufferedSse:
        """Starts the turn waiter and the frame producer.

        Cancellation:
            A checkpoint only when entering the nursery; nothing has started if cancelled here.
        """
        send, self._receive = trio.open_memory_channel[bytes](0)
        self._nursery_manager = trio.open_nursery()
        self._nursery = await self._nursery_manager.__aenter__()
        self._nursery.start_soon(self._wait_turn)
        self._nursery.start_soon(self._produce, send)
        return self

    async def __aexit__(  # type: ignore[override]  # quart's stub says None; a context manager may suppress
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        """Stops the producer and the waiter (never the turn) and closes the channel.

        Cancellation:
            Exiting early (client disconnect) cancels only this body's tasks; the turn keeps
            running in the Session's nursery and is committed.
        """
        assert self._nursery is not None and self._nursery_manager is not None and self._receive is not None
        if not self._outcome.recorded:  # the stream ends before the turn did: the client went away
            log.info("%s (%s)", client_disconnect(body_read=True).message,
                     describe_request(499, target=self._target, session_id=self._session_id))
        self._nursery.cancel_scope.cancel()
        try:
            return await self._nursery_manager.__aexit__(exc_type, exc, tb)
        finally:
            self._receive.close()

    def __aiter__(self) -> trio.MemoryReceiveChannel[bytes]:
        assert self._receive is not None, "enter the body before iterating it"
        return self._receive

    async def _wait_turn(self) -> None:
        """Waits for the turn and records its result or error; never raises.

        Cancellation:
            Cancelled when the body closes early; only this wait stops, the turn goes on.
        """
        outcome = self._outcome
        try:
            outcome.result = await self._run_turn()
        except RelaxError as exc:
            outcome.error = exc
        except Exception:
            log.exception("unhandled error in a streamed %s turn", self._adapter.name)
            outcome.error = InternalError(GENERIC_INTERNAL_MESSAGE)
        finally:
            outcome.done.set()

    async def _produce(self, send: trio.MemorySendChannel[bytes]) -> None:
        """Sends the connection frame, heartbeats on an absolute schedule, then the terminal.

        Cancellation:
            Cancelled when the body closes early; the channel is closed on the way out.
        """
        async with send:
            await send.send(self._adapter.connected_frame)
            deadline = trio.current_time() + self._heartbeat_s
            while not self._outcome.done.is_set():
                with trio.move_on_at(deadline):
                    await self._outcome.done.wait()
                if self._outcome.done.is_set():
                    break
                await send.send(self._adapter.heartbeat_frame)
                deadline += self._heartbeat_s
                if deadline <= trio.current_time():  # a slow reader: don't send a burst
                    deadline = trio.current_time() + self._heartbeat_s
            await send.send(self._terminal())

    def _terminal(self) -> bytes:
        outcome = self._outcome
        try:
            if outcome.result is not None:
                return self._adapter.render_sse(outcome.result, self._request)
            error = outcome.error or InternalError(GENERIC_INTERNAL_MESSAGE)
            if error.http_status >= 500:
                log.warning("streamed %s turn failed (%s): %s", self._adapter.name,
                            describe_request(error.http_status, target=self._target,
                                             session_id=self._session_id or error.session_id),
                            error.message)
            else:
                log_rejected(self._adapter.name, error, self._session_id, target=self._target)
            return self._adapter.render_sse_error(error, self._request)
        except Exception:
            log.exception("rendering the %s stream terminal failed", self._adapter.name)
            return self._adapter.render_sse_error(InternalError(RENDER_FAILED_MESSAGE), self._request)


def sse_response(adapter: ProtocolAdapter, request: ParsedRequest, run_turn: RunTurn,
                 heartbeat_s: float, *, target: str | None = None,
                 session_id: str | None = None) -> Response:
    """A 200 ``text/event-stream`` response streaming one turn; it has no response timeout
    (``target`` and ``session_id``: see :class:`BufferedSse`)."""
    response = Response(
        BufferedSse(adapter, request, run_turn, heartbeat_s, target=target, session_id=session_id),
        status=200,
        content_type="text/event-stream",
        headers=SSE_HEADERS,
    )
    response.timeout = None  # a held generation may take minutes; nothing may cut it
    return response
