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
* **Client disconnects.** Once the body is complete, one watcher task waits for the next ASGI
  message; ``http.disconnect`` before the last byte of the answer is sent cancels the request
  (quart's ``handle_messages`` task did the same from the start). A disconnect while the body is
  still arriving cancels the request too. The views' own cancellation handling (the 499 log line,
  leaving an orphaned generation for a retry: docs/agent-contract.md#retries) therefore runs as
  before. After a complete answer hypercorn hands the watcher an ``http.disconnect`` (the
  request's stream closed) and it simply ends; only where none comes (the test client) is it
  cancelled. Cancelling it every time, as quart did, cost about 0.1-0.2 ms per request here
  (a ``Cancelled`` through the nursery's exception group), a fifth of what this module saves.
* **Response.** Status and headers as quart encodes them (names lower-cased, in order), then the
  body; a streamed body (Buffered SSE) is entered and iterated as quart does, one ASGI message
  per chunk.

May import: trio, quart (its response types only) and werkzeug's datastructures.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import attrs
import trio
from quart import Response
from quart.utils import encode_headers

__all__ = ["BodyTooLarge", "JsonReply", "ModelCall", "ModelRoutes", "send_response"]

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
        nursery: the request's nursery: the disconnect watcher runs in it once the body is
            complete, and a client disconnect cancels its scope (the whole request).
        max_body_bytes: the body limit in bytes.
    """

    __slots__ = ("_max_body_bytes", "_nursery", "_receive", "_scope", "answered", "headers", "method",
                 "path", "watching")

    def __init__(self, scope: Scope, receive: Receive, nursery: trio.Nursery, max_body_bytes: int):
        self._scope = scope
        self._receive = receive
        self._nursery = nursery
        self._max_body_bytes = max_body_bytes
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:  # the first of repeated headers, like werkzeug's get
            headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
        self.headers: Mapping[str, str] = headers
        """Request headers by lower-cased name (the first value of a repeated header)."""
        self.answered = False
        """Set when the answer's last message goes out: a disconnect no longer cancels anything."""
        self.watching = False
        """True while the disconnect watcher runs (from the complete body until it ends)."""

    @property
    def target(self) -> str:
        """``"<METHOD> <path>"``, for log lines."""
        return f"{self.method} {self.path}"

    async def body(self) -> bytes:
        """The whole request body; from then on a client disconnect cancels the request.

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
                self._nursery.cancel_scope.cancel()
                await trio.lowlevel.checkpoint()  # raises trio.Cancelled
                raise AssertionError("a cancelled request went on")
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > self._max_body_bytes:
                    raise BodyTooLarge
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        self.watching = True
        self._nursery.start_soon(self._watch_disconnect)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _watch_disconnect(self) -> None:
        """Waits for the message after a complete body (only ``http.disconnect`` can come) and
        cancels the request when it comes before the answer was sent."""
        try:
            while (await self._receive())["type"] != "http.disconnect":
                pass
            if not self.answered:
                self._nursery.cancel_scope.cancel()
        finally:
            self.watching = False


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
        view = self.views.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if view is None:
            await self.fallback(scope, receive, send)
            return
        async with trio.open_nursery() as nursery:
            call = ModelCall(scope, receive, nursery, self.max_body_bytes)
            response = await view(call)

            async def send_noting_the_end(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    call.answered = True
                await send(message)

            await send_response(send_noting_the_end, response)
            if call.watching:  # hypercorn has handed it the stream's end; let it take it
                await trio.lowlevel.cancel_shielded_checkpoint()
                if call.watching:  # nothing came (the test client): stop it
                    nursery.cancel_scope.cancel()
