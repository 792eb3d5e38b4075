"""The model routes on plain ASGI: what quart does for one request, minus what it costs here.

quart's request cycle (a ``Request`` with werkzeug ``Headers``, URL routing, app and request
contexts, signals, response finalization, and two tasks per request) measured about 0.2 ms of
CPU per request on the development machine: a third of a bare quart route's whole cost, and
the largest single item on the agent API's path (``benchmarks/gateway_overhead.py``). The agent
API therefore answers ``POST`` on its model routes (chat, responses, messages, count_tokens) in
:class:`ModelRoutes`, an ASGI wrapper installed as the quart app's ``asgi_app``; every other
request (other methods on those paths, health, models, ``HEAD``, unknown routes, WebSockets,
the lifespan) goes on to quart unchanged. The test client and hypercorn both call ``asgi_app``,
so tests and production take the same path.

What quart did and this keeps, step for step:

* **Body.** The body is read as it arrives; a ``Content-Length`` above the limit, or more bytes
  than the limit, raises :class:`BodyTooLarge` (quart's ``RequestEntityTooLarge``) before the
  excess is read. The body is read only when the view asks for it (after authentication).
* **Client disconnects.** quart ran a second task per request that read ASGI messages and
  cancelled the request on ``http.disconnect``. Here the request's own task waits for it where
  the request waits anyway: a JSON turn waits in :meth:`ModelCall.disconnected` and the turn's
  end cancels that wait (:meth:`relaxtrio.nursery.session.PendingTurn.result_unless`); a
  disconnect first leaves the turn (it goes on, committed for a retry:
  docs/agent-contract.md#retries) and cancels the request (:meth:`ModelCall.gone`), so the views'
  cancellation handling (the 499 log line) runs as before. A disconnect while the body is still
  arriving cancels the request too. A streamed answer (Buffered SSE) is sent beside a watcher
  task, which cancels the stream on ``http.disconnect`` before its last chunk. The second task
  and its cancellation at every request's end (a ``Cancelled`` through a nursery's exception
  group) cost about 0.1-0.2 ms per request here. A token count is short and commits nothing:
  it is not watched.
* **Response.** Status and headers as quart encodes them (names lower-cased, in order), then the
  body; a streamed body (Buffered SSE) is entered and iterated as quart does, one ASGI message
  per chunk.

May import: trio and quart (its response types and header encoding).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, NoReturn
from urllib.parse import urlparse

import attrs
import trio
from quart import Response
from quart.utils import encode_headers
from quart.wrappers.response import DataBody

__all__ = ["BodyTooLarge", "JsonReply", "ModelCall", "ModelRoutes", "request_path", "scope_headers",
           "send_response"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_JSON_TYPE: Final = b"application/json"


class BodyTooLarge(Exception):
    """The request body is larger than the limit (the view answers 413)."""


@attrs.frozen
class JsonReply:
    """A JSON answer already encoded: ``content-type: application/json`` and its length,
    exactly the headers quart's ``Response(body, content_type="application/json")`` sends.

    Attributes:
        body: the encoded JSON (UTF-8).
        status: the HTTP status.
    """

    body: bytes
    status: int = 200


class ModelCall:
    """One model request as the views see it (what they read of quart's ``request`` before).

    Args:
        scope: the ASGI HTTP scope.
        receive: the ASGI receive callable.
        request_scope: the cancel scope of the whole request; a client disconnect cancels it.
        max_body_bytes: the body limit in bytes.
        path: the request's path (:func:`request_path`).
    """

    __slots__ = ("_max_body_bytes", "_receive", "_request_scope", "answered", "body_complete",
                 "headers", "method", "path")

    def __init__(self, scope: Scope, receive: Receive, request_scope: trio.CancelScope, max_body_bytes: int,
                 path: str):
        self._receive = receive
        self._request_scope = request_scope
        self._max_body_bytes = max_body_bytes
        self.method: str = scope["method"]
        self.path = path
        """The request's path (of an absolute-form target, its path part)."""
        self.headers: Mapping[str, str] = scope_headers(scope)
        """Request headers by lower-cased name (the first value of a repeated header)."""
        self.body_complete = False
        """Set once the whole body was read (the next ASGI message can only be a disconnect)."""
        self.answered = False
        """Set when the answer's last message goes out: a disconnect no longer cancels anything."""

    @property
    def target(self) -> str:
        """``"<METHOD> <path>"``, for log lines."""
        return f"{self.method} {self.path}"

    async def body(self) -> bytes:
        """The whole request body.

        Raises:
            BodyTooLarge: ``Content-Length`` or the bytes received exceed the limit (nothing
                more is read).

        Cancellation:
            A checkpoint; a client that disconnects before the body is complete cancels the
            request (raises ``trio.Cancelled`` here).
        """
        declared = self.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._max_body_bytes:
            raise BodyTooLarge
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self._receive()
            if message["type"] != "http.request":  # http.disconnect: the client went away
                await self.gone()
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > self._max_body_bytes:
                    raise BodyTooLarge
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        self.body_complete = True
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def disconnected(self) -> None:
        """Returns when the client has gone away (``http.disconnect``; after a complete answer
        hypercorn sends one too, as the request's stream closes).

        Cancellation:
            A plain wait; a message it was about to take stays for the next receive.
        """
        while (await self._receive())["type"] != "http.disconnect":
            pass

    async def gone(self) -> NoReturn:
        """Ends the request because its client went away: cancels the request's scope.

        Raises:
            trio.Cancelled: always (caught by :class:`ModelRoutes`, which then sends nothing).
        """
        self._request_scope.cancel()
        await trio.lowlevel.checkpoint()  # raises trio.Cancelled
        raise AssertionError("a cancelled request went on")

    async def watch_disconnect(self, stream_scope: trio.CancelScope) -> None:
        """Cancels ``stream_scope`` (a streamed answer) when the client goes away before the
        answer's last chunk was sent; returns at the disconnect either way.

        Cancellation:
            A plain wait.
        """
        await self.disconnected()
        if not self.answered:
            stream_scope.cancel()


async def send_response(send: Send, response: Response | JsonReply) -> None:
    """Sends ``response`` as quart's ASGI layer does (a :class:`JsonReply` in one message).

    Cancellation:
        A checkpoint; a streamed body is left (its ``__aexit__`` runs) when cancelled.
    """
    if isinstance(response, JsonReply):
        await send({"type": "http.response.start", "status": response.status, "headers": [
            (b"content-type", _JSON_TYPE), (b"content-length", str(len(response.body)).encode())]})
        await send({"type": "http.response.body", "body": response.body, "more_body": False})
        return
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": encode_headers(response.headers)})
    async with response.response as body:
        async for data in body:
            await send({"type": "http.response.body",
                        "body": data.encode() if isinstance(data, str) else data, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


View = Callable[[ModelCall], Awaitable["Response | JsonReply"]]


def scope_headers(scope: Scope) -> dict[str, str]:
    """An ASGI scope's request headers by lower-cased name; of a repeated header, its first
    value (what werkzeug's ``Headers.get`` returns)."""
    headers: dict[str, str] = {}
    for name, value in scope["headers"]:
        headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return headers


def request_path(scope: Scope) -> str:
    """The path a request is routed by, as quart derives it: ``scope["path"]``, or the path part
    of an absolute-form target (``POST http://host:port/agentic_api/v1/messages``, which an
    HTTP/1.1 server must accept: RFC 9112 section 3.2.2)."""
    path: str = scope["path"]
    return path if path[:1] == "/" else urlparse(path).path


@attrs.frozen
class ModelRoutes:
    """An ASGI app that answers ``POST`` on ``views``' paths itself and passes everything else
    to ``fallback`` (the quart app's own ``asgi_app``).

    Attributes:
        fallback: the ASGI app for every other request.
        views: path → view; a view returns the response (a client that goes away cancels it).
        max_body_bytes: the body limit in bytes.
    """

    fallback: ASGIApp
    views: Mapping[str, View]
    max_body_bytes: int

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serves one ASGI connection scope.

        Cancellation:
            A client disconnect cancels the view (see :class:`ModelCall`); the function then
            returns normally.
        """
        path = request_path(scope) if scope["type"] == "http" and scope["method"] == "POST" else None
        view = self.views.get(path) if path is not None else None
        if view is None or path is None:
            await self.fallback(scope, receive, send)
            return
        with trio.CancelScope() as request_scope:
            call = ModelCall(scope, receive, request_scope, self.max_body_bytes, path)
            response = await view(call)
            if isinstance(response, JsonReply) or not call.body_complete or isinstance(response.response, DataBody):
                await send_response(send, response)
                return
            await self._stream(call, send, response)

    @staticmethod
    async def _stream(call: ModelCall, send: Send, response: Response) -> None:
        """Sends a streamed answer beside a task that cancels it when the client goes away."""

        async def send_noting_the_end(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                call.answered = True
            await send(message)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call.watch_disconnect, nursery.cancel_scope)
            await send_response(send_noting_the_end, response)
            # hypercorn hands the watcher the stream's end; where nothing comes (the test client)
            # it is stopped.
            await trio.lowlevel.cancel_shielded_checkpoint()
            nursery.cancel_scope.cancel()
