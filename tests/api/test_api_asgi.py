"""The model routes on plain ASGI (relaxtrio.api.asgi): what quart did for them, kept.

Raw HTTP/1.1 on a served app, so a test can send what client libraries do not: a body cut off
by a disconnect, a chunked body past the limit, a repeated credential header.
"""

from __future__ import annotations

import json
import logging
import os

import pytest
import trio
import trio.testing
from tests.api.api_helpers import CHAT, ScriptedHandler
from tests.support.apps import serve_app
from tests.support.sessions import open_session
from tests.support.wire import open_raw, read_until_eof

from relaxtrio.api.app import create_app
from relaxtrio.api.asgi import ModelRoutes
from relaxtrio.api.errors import CLIENT_DISCONNECT_BODY
from relaxtrio.config import ApiConfig
from relaxtrio.nursery.session import SessionRegistry

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def _port(base_url: str) -> int:
    return int(base_url.split(":")[2].split("/")[0])


def _head(token: str, extra: str = "") -> bytes:
    return (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n{extra}").encode()


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


async def test_a_disconnect_before_the_body_is_complete_runs_no_turn(
        registry: SessionRegistry, caplog: pytest.LogCaptureFixture) -> None:
    handler = ScriptedHandler()
    app = create_app(registry, handler)
    assert isinstance(app.asgi_app, ModelRoutes)
    with trio.fail_after(20), caplog.at_level(logging.INFO, logger="relaxtrio.api"):
        async with serve_app(app) as base_url, open_session(registry) as session:
            stream = await open_raw(_port(base_url))
            await stream.send_all(_head(session.session_id, f"Content-Length: {len(BODY)}\r\n\r\n")
                                  + BODY[:10])
            await trio.testing.wait_all_tasks_blocked()  # the server read the head and part of the body
            await stream.aclose()
            await trio.testing.wait_all_tasks_blocked()
            assert any(CLIENT_DISCONNECT_BODY in r.getMessage() for r in caplog.records)
            # The connection's close reached the view while it read the body; a later request works.
            stream = await open_raw(_port(base_url))
            await stream.send_all(_head(session.session_id, f"Content-Length: {len(BODY)}\r\n"
                                        "Connection: close\r\n\r\n") + BODY)
            async with stream:
                assert _status(await read_until_eof(stream)) == 200
    assert len(handler.requests) == 1
    [line] = [r.getMessage() for r in caplog.records if CLIENT_DISCONNECT_BODY in r.getMessage()]
    assert f"HTTP 499, POST {CHAT}, session {session.session_id}" in line


async def test_a_chunked_body_past_the_limit_is_413_naming_the_session(
        registry: SessionRegistry, caplog: pytest.LogCaptureFixture) -> None:
    handler = ScriptedHandler()
    app = create_app(registry, handler, config=ApiConfig(max_body_bytes=1000))
    chunk = b" " * 600
    with trio.fail_after(20), caplog.at_level(logging.WARNING, logger="relaxtrio.api"):
        async with serve_app(app) as base_url, open_session(registry) as session:
            stream = await open_raw(_port(base_url))
            # No Content-Length: the limit is found while reading, in the second chunk.
            await stream.send_all(_head(session.session_id, "Transfer-Encoding: chunked\r\n"
                                        "Connection: close\r\n\r\n")
                                  + (f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n") * 2 + b"0\r\n\r\n")
            async with stream:
                answer = await read_until_eof(stream)
    assert _status(answer) == 413
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["message"] == "Request body is larger than 1000 bytes"
    assert not handler.requests
    assert [r.getMessage() for r in caplog.records] == [
        (f"chat request rejected (HTTP 413, POST {CHAT}, session {session.session_id}, param body): "
         "Request body is larger than 1000 bytes")]


async def test_a_repeated_credential_header_counts_once(registry: SessionRegistry) -> None:
    """Like werkzeug's ``Headers.get``: the first ``Authorization`` header is the credential."""
    handler = ScriptedHandler()
    app = create_app(registry, handler)
    with trio.fail_after(20):
        async with serve_app(app) as base_url, open_session(registry) as session:
            for first, second, expected in ((session.session_id, "nobody", 200),
                                            ("nobody", session.session_id, 401)):
                stream = await open_raw(_port(base_url))
                await stream.send_all(
                    _head(first, f"Authorization: Bearer {second}\r\nContent-Length: {len(BODY)}\r\n"
                          "Connection: close\r\n\r\n") + BODY)
                async with stream:
                    assert _status(await read_until_eof(stream)) == expected
    assert len(handler.requests) == 1


async def test_other_methods_and_paths_are_still_quarts(registry: SessionRegistry) -> None:
    """Only POST on a model path is answered on plain ASGI; a GET there is quart's 405 and a
    path with a trailing slash quart's 404, both in the protocol's envelope."""
    app = create_app(registry, ScriptedHandler())
    client = app.test_client()
    response = await client.get(CHAT)
    assert response.status_code == 405
    assert (await response.get_json())["error"]["message"] == f"Method GET is not allowed for {CHAT}"
    response = await client.post(CHAT + "/", json={})
    assert response.status_code == 404
    assert (await response.get_json())["error"]["message"] == f"No route for POST {CHAT}/"


async def test_keep_alive_connections_serve_answer_after_answer(
        registry: SessionRegistry, caplog: pytest.LogCaptureFixture) -> None:
    """An answered request ends quietly: the ``http.disconnect`` hypercorn sends as each
    answered request's stream closes must neither cancel the connection's next request nor log
    a client disconnect (JSON turns wait for it themselves, streams beside a watcher)."""
    handler = ScriptedHandler()
    app = create_app(registry, handler)
    stream_body = json.dumps({"model": "m", "stream": True,
                              "messages": [{"role": "user", "content": "hi"}]}).encode()
    with trio.fail_after(20), caplog.at_level(logging.INFO, logger="relaxtrio.api"):
        async with serve_app(app) as base_url, open_session(registry) as session, \
                await open_raw(_port(base_url)) as stream:
            for body in (BODY, stream_body, BODY, stream_body):
                await stream.send_all(_head(session.session_id, f"Content-Length: {len(body)}\r\n\r\n")
                                      + body)
                answer = b""
                while not (answer.endswith(b"}") if body is BODY else answer.endswith(b"0\r\n\r\n")):
                    answer += await stream.receive_some()
                assert _status(answer) == 200
    assert len(handler.requests) == 4
    assert not [r for r in caplog.records if "disconnect" in r.getMessage()]


async def test_an_absolute_form_target_is_routed_by_its_path(registry: SessionRegistry) -> None:
    """``POST http://host:port/agentic_api/v1/...`` (RFC 9112 section 3.2.2): served like the
    origin form, including its errors (it once reached quart's placeholder view: a 500)."""
    handler = ScriptedHandler()
    app = create_app(registry, handler)
    with trio.fail_after(20):
        async with serve_app(app) as base_url, open_session(registry) as session:
            port = _port(base_url)
            for token, expected in ((session.session_id, 200), ("nobody", 401)):
                async with await open_raw(port) as stream:
                    await stream.send_all(
                        f"POST http://127.0.0.1:{port}{CHAT} HTTP/1.1\r\nHost: x\r\n"
                        f"Authorization: Bearer {token}\r\nContent-Length: {len(BODY)}\r\n"
                        "Connection: close\r\n\r\n".encode() + BODY)
                    assert _status(await read_until_eof(stream)) == expected
    assert len(handler.requests) == 1


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_connection_the_client_closes_is_let_go_at_once(registry: SessionRegistry) -> None:
    """After an answer hypercorn starts its keep-alive timer (120 s); a client that then closes
    its connection must not leave the server's socket open until the timer runs out."""
    app = create_app(registry, ScriptedHandler())
    with trio.fail_after(20):
        async with serve_app(app) as base_url, open_session(registry) as session:
            port = _port(base_url)
            await trio.testing.wait_all_tasks_blocked()
            before = _open_fds()
            for token, status in [(session.session_id, 200), ("nobody", 401)] * 5:
                async with await open_raw(port) as stream:
                    await stream.send_all(_head(token, f"Content-Length: {len(BODY)}\r\n\r\n") + BODY)
                    answer = b""
                    while not answer.endswith(b"}"):
                        answer += await stream.receive_some()
                    assert _status(answer) == status
                    await trio.testing.wait_all_tasks_blocked()  # kept alive, then closed by the client
            await trio.testing.wait_all_tasks_blocked()
            assert _open_fds() == before  # each server-side socket is closed too


async def test_every_disconnect_mid_stream_is_logged_once(
        registry: SessionRegistry, caplog: pytest.LogCaptureFixture) -> None:
    """A client that hangs up a Buffered SSE stream while its turn runs gets its 499 line each
    time (the waiter's own cancellation once hid it about every other time)."""
    handler = ScriptedHandler(gate=trio.Event())  # the turns wait for the whole test
    app = create_app(registry, handler)
    stream_body = json.dumps({"model": "m", "stream": True,
                              "messages": [{"role": "user", "content": "hi"}]}).encode()

    def disconnect_lines() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.getMessage().startswith("client disconnected before agentic completion")]

    with trio.fail_after(20), caplog.at_level(logging.INFO, logger="relaxtrio.api"):
        async with serve_app(app) as base_url, open_session(registry) as session:
            for attempt in range(1, 9):
                async with await open_raw(_port(base_url)) as stream:
                    await stream.send_all(_head(session.session_id, f"Content-Length: {len(stream_body)}\r\n\r\n")
                                          + stream_body)
                    answer = b""
                    while b": connected" not in answer:
                        answer += await stream.receive_some()
                await trio.testing.wait_all_tasks_blocked()
                assert len(disconnect_lines()) == attempt
    assert len(handler.requests) == 8
