"""Errors in each protocol's own envelope, with the right status and retry header; never HTML."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
import trio
from tests.api.api_helpers import ENDPOINTS, ScriptedHandler, post, scripted_pipeline
from tests.support.apps import serve_app
from tests.support.sessions import open_session

from relaxtrio import (
    BackendError,
    ClientDisconnectError,
    ContextLengthExceededError,
    OverloadedError,
    SessionAbortedError,
)
from relaxtrio.api.app import create_app
from relaxtrio.api.errors import error_body, error_response, http_status, should_retry
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.config import ApiConfig
from relaxtrio.forest import ResponseNode
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.testing.scripted_engine import Reply

VALID = {
    "chat": {"messages": [{"role": "user", "content": "hi"}]},
    "responses": {"input": "hi"},
    "messages": {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
}


def _kind(protocol: str, body: dict) -> str:
    """The error type, read from the protocol's own envelope (and checking its shape)."""
    if protocol == "messages":
        assert set(body) == {"type", "error"} and body["type"] == "error"
        assert set(body["error"]) == {"type", "message"}
        return body["error"]["type"]
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]["type"]


@pytest.mark.parametrize("protocol", sorted(ENDPOINTS))
async def test_auth_and_session_errors(protocol: str, registry: SessionRegistry) -> None:
    app = create_app(registry, ScriptedHandler())
    path = ENDPOINTS[protocol]
    status, body, headers = await post(app, path, VALID[protocol])
    assert status == 401 and _kind(protocol, body) == "authentication_error"
    status, body, _ = await post(app, path, VALID[protocol], headers={"Authorization": "Basic abc"})
    assert status == 401 and "Bearer <token>" in json.dumps(body)
    status, body, _ = await post(app, path, VALID[protocol], headers={"Authorization": "Bearer "})
    assert status == 401
    # An unknown Session is an auth failure (the CLIs stop), not a 404 (a bad model / a retry).
    status, body, headers = await post(app, path, VALID[protocol], token="session-gone")
    assert status == 401 and _kind(protocol, body) == "authentication_error"
    assert headers["x-should-retry"] == "false"
    if protocol != "messages":
        assert body["error"]["code"] == "session_discarded"
    async with open_session(registry) as session:
        status, _, _ = await post(app, path, VALID[protocol], headers={"x-api-key": session.session_id})
        assert status == 200
        status, _, _ = await post(app, path, VALID[protocol],
                                  headers={"x-api-key": "wrong", "Authorization": f"Bearer {session.session_id}"})
        assert status == 200  # Authorization wins over x-api-key


@pytest.mark.parametrize("protocol", sorted(ENDPOINTS))
async def test_body_errors_are_400_naming_the_body(protocol: str, registry: SessionRegistry) -> None:
    app = create_app(registry, ScriptedHandler())
    async with open_session(registry) as session:
        for raw in (b"", b"{", b"[1]", b'"x"', b"\xff\xfe\xfa", b'{"a": NaN}', b"[" * 100_000):
            status, body, headers = await post(app, ENDPOINTS[protocol], raw=raw, token=session.session_id)
            assert status == 400, raw[:20]
            assert _kind(protocol, body) == "invalid_request_error"
            assert "x-should-retry" not in headers
            if protocol != "messages":
                assert body["error"]["param"] == "body"


@pytest.mark.parametrize("protocol", sorted(ENDPOINTS))
async def test_a_body_that_is_not_utf8_is_refused_as_such(protocol: str, registry: SessionRegistry) -> None:
    """JSON on the wire is UTF-8 (RFC 8259, section 8.1). A body that ``json.loads`` would guess to
    be UTF-16 or UTF-32 (a ``\\xff\\xfe`` start, NULs among the first bytes), or that holds bytes
    UTF-8 does not have, is a 400 saying so, not in a UTF-16 codec's words; a UTF-8 body with a
    BOM is still accepted, through the Session's body memo too (the second request)."""
    app = create_app(registry, ScriptedHandler())
    text = json.dumps(VALID[protocol])
    async with open_session(registry) as session:
        for raw in (b"\xff\xfe\xfa", b"\xff\xfe", text.encode("utf-16"), text.encode("utf-16-le"),
                    text.encode("utf-32"), b"\xff", b'{"a": "\xff"}',
                    b"\xef\xbb\xbf" + text.encode()[:-1] + b"\xc3("):
            status, body, _ = await post(app, ENDPOINTS[protocol], raw=raw, token=session.session_id)
            assert status == 400, raw[:20]
            assert _kind(protocol, body) == "invalid_request_error"
            message = body["error"]["message"]
            assert message.startswith("Invalid request body: the body is not valid UTF-8 JSON"), message
            assert "utf-16" not in message.lower() and "codec" not in message
            if protocol != "messages":
                assert body["error"]["param"] == "body"
        for _ in range(2):
            status, body, _ = await post(app, ENDPOINTS[protocol], raw=b"\xef\xbb\xbf" + text.encode(),
                                         token=session.session_id)
            assert status == 200, body


@pytest.mark.parametrize("protocol", sorted(ENDPOINTS))
async def test_too_large_body_is_413_json(protocol: str, registry: SessionRegistry,
                                          caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(registry, ScriptedHandler(), config=ApiConfig(max_body_bytes=2048))
    async with open_session(registry) as session:
        big = {**VALID[protocol], "pad": "x" * 4096}
        with caplog.at_level(logging.WARNING, logger="relaxtrio.api"):
            status, body, headers = await post(app, ENDPOINTS[protocol], big, token=session.session_id)
    assert status == 413 and headers["Content-Type"] == "application/json"
    assert _kind(protocol, body) == ("request_too_large" if protocol == "messages" else "invalid_request_error")
    # The log line names the route and the (authenticated) Session, never a literal None.
    assert [r.getMessage() for r in caplog.records] == [
        f"{protocol} request rejected (HTTP 413, "
        f"POST {ENDPOINTS[protocol]}, session {session.session_id}, param body): "
        "Request body is larger than 2048 bytes"]


async def test_a_rejection_before_any_session_is_logged_without_one(
        registry: SessionRegistry, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(registry, ScriptedHandler())
    with caplog.at_level(logging.WARNING, logger="relaxtrio.api"):
        status, _, _ = await post(app, "/agentic_api/v1/nowhere", VALID["chat"])
    assert status == 404
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("chat request rejected (HTTP 404, POST /agentic_api/v1/nowhere): ")
    assert "None" not in line


@pytest.mark.parametrize("protocol", sorted(ENDPOINTS))
async def test_unexpected_and_backend_errors_reveal_nothing(protocol: str, registry: SessionRegistry) -> None:
    for error in (RuntimeError("secret at /srv/x.py"), BackendError("engine 10.0.0.7 returned 502")):
        app = create_app(registry, ScriptedHandler(error=error))
        async with open_session(registry) as session:
            status, body, headers = await post(app, ENDPOINTS[protocol], VALID[protocol], token=session.session_id)
        assert status == 500 and headers["x-should-retry"] == "false"
        assert _kind(protocol, body) == ("api_error" if protocol == "messages" else "internal_error")
        text = json.dumps(body)
        assert "secret" not in text and "10.0.0.7" not in text
        assert "Internal error while handling agentic request." in text


@pytest.mark.parametrize("protocol", sorted(ENDPOINTS))
async def test_an_empty_reply_is_a_retryable_500_that_commits_nothing(
        protocol: str, registry: SessionRegistry, compiler: ChatCompiler,
        caplog: pytest.LogCaptureFixture) -> None:
    """The model's first token is a stop token: nothing to commit or echo back. The agent gets a
    500 that names the cause and allows a retry (other 500s forbid it), and the details are
    logged (docs/agent-contract.md#errors)."""
    handler, engine = scripted_pipeline(compiler, [Reply(text="")])
    app = create_app(registry, handler)
    async with open_session(registry) as session:
        with caplog.at_level(logging.WARNING, logger="relaxtrio.api"):
            status, body, headers = await post(app, ENDPOINTS[protocol], VALID[protocol],
                                               token=session.session_id)
        assert not any(isinstance(n, ResponseNode) for n in session.forest.nodes())
    assert status == 500 and "x-should-retry" not in headers
    assert "reply was empty" in json.dumps(body) and "retry samples again" in json.dumps(body)
    if protocol == "messages":
        assert _kind(protocol, body) == "api_error"
    else:
        assert body["error"]["type"] == "server_error" and body["error"]["code"] == "empty_reply"
    assert len(engine.calls) == 1
    assert any("empty assistant message (1 output tokens, finish stop)" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("protocol", sorted(ENDPOINTS))
async def test_client_errors_from_the_turn_keep_their_message(protocol: str, registry: SessionRegistry) -> None:
    error = ContextLengthExceededError("This model's maximum context length is 8 tokens.", param="messages")
    app = create_app(registry, ScriptedHandler(error=error))
    async with open_session(registry) as session:
        status, body, headers = await post(app, ENDPOINTS[protocol], VALID[protocol], token=session.session_id)
    assert status == 400 and "x-should-retry" not in headers
    assert "maximum context length is 8 tokens" in json.dumps(body)
    if protocol != "messages":
        assert body["error"]["code"] == "context_length_exceeded" and body["error"]["param"] == "messages"


# Refused in either mode (docs/agent-contract.md): history items relaxtrio cannot replay, client
# tools it cannot show the model, and malformed values. (protocol, body, param)
REFUSED = [
    ("responses", {"input": [{"role": "user", "content": "hi"}, {"type": "frobnicate"}]}, "input[1].type"),
    ("responses", {"input": [{"role": "user", "content": "hi"}, {"type": "item_reference", "id": "m"}]},
     "input[1].type"),
    ("responses", {"input": [{"role": "user", "content": "hi"},
                             {"type": "web_search_call", "id": "ws", "status": "completed"}]}, "input[1].type"),
    ("responses", {"input": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}]}, "input[1].role"),
    ("messages", {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"},
                                                {"role": "tool", "content": "x"}]}, "messages[1].role"),
    ("messages", {**VALID["messages"], "tool_choice": "auto"}, "tool_choice"),
    ("messages", {**VALID["messages"], "tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
    ("chat", {**VALID["chat"], "n": 0}, "n"),
    ("chat", {**VALID["chat"], "parallel_tool_calls": 1}, "parallel_tool_calls"),
    ("chat", {**VALID["chat"], "tools": [{"type": "function", "function": {"name": "f"}},
                                         {"type": "custom", "custom": {"name": "g"}}]}, "tools[1].type"),
    ("chat", {**VALID["chat"], "tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools[0].function"),
]


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("protocol", "body", "param"), REFUSED)
async def test_refused_fields_are_400_naming_the_field(protocol: str, body: dict, param: str, stream: bool,
                                                       strict: bool, registry: SessionRegistry) -> None:
    handler = ScriptedHandler()
    app = create_app(registry, handler, config=ApiConfig(strict_request_fields=strict))
    async with open_session(registry) as session:
        status, answer, headers = await post(app, ENDPOINTS[protocol], {**body, "stream": stream},
                                             token=session.session_id)
    assert status == 400 and headers["Content-Type"] == "application/json"
    assert _kind(protocol, answer) == "invalid_request_error"
    assert answer["error"]["message"].startswith(f"{param} ")
    if protocol != "messages":
        assert answer["error"]["param"] == param
    assert handler.requests == []  # nothing was generated


async def test_unknown_routes_and_methods_are_json(registry: SessionRegistry) -> None:
    app = create_app(registry, ScriptedHandler())
    async with app.test_app() as test_app:
        client = test_app.test_client()
        for method, path, status in [("GET", "/agentic_api/nope", 404), ("POST", "/", 404),
                                     ("GET", "/agentic_api/v1/messages", 405), ("PUT", "/agentic_api/v1/responses", 405),
                                     ("DELETE", "/agentic_api/v1/models", 405)]:
            response = await client.open(path, method=method)
            assert response.status_code == status, (method, path)
            assert response.headers["Content-Type"] == "application/json"
            body = await response.get_json()
            assert body["type"] == "error" if path.endswith("/messages") else "error" in body
        models = await (await client.get("/agentic_api/v1/models")).get_json()
        assert models["data"][0]["id"] == "relaxtrio"
        assert (await (await client.get("/agentic_api/health")).get_json()) == {"ok": True, "active_sessions": 0}


async def test_malformed_http_gets_no_html(registry: SessionRegistry) -> None:
    app = create_app(registry, ScriptedHandler())
    with trio.fail_after(20):
        async with serve_app(app) as base_url:
            url = httpx.URL(base_url)
            for garbage in (b"NOT HTTP AT ALL\r\n\r\n", b"POST /agentic_api/v1/messages HTTP/1.1\r\n\x00\x01\r\n\r\n",
                            b"POST /x HTTP/1.1\r\nContent-Length: nope\r\n\r\n"):
                async with await trio.open_tcp_stream(url.host, url.port) as sock:
                    await sock.send_all(garbage)
                    received = b""
                    while chunk := await sock.receive_some():
                        received += chunk
                head, _, payload = received.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 400"), received[:80]
                assert b"<html" not in received.lower() and payload == b""


def test_envelope_table() -> None:
    disconnect = ClientDisconnectError("client disconnected before agentic completion was produced")
    assert http_status(disconnect, "chat") == 499
    assert error_body(disconnect, "chat")["error"]["type"] == "client_disconnect"
    assert error_body(disconnect, "chat")["error"]["code"] == "client_disconnect"
    overloaded = OverloadedError("busy")
    assert (http_status(overloaded, "chat"), http_status(overloaded, "messages")) == (503, 529)
    assert should_retry(overloaded, "chat") and should_retry(overloaded, "messages")
    aborted = SessionAbortedError("Unknown or discarded agentic session 's'.")
    assert not should_retry(aborted, "chat") and not should_retry(aborted, "messages")
    response = error_response(BackendError("boom"), "messages")
    assert response.status_code == 500 and response.headers["x-should-retry"] == "false"


_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
_TOOL_USE = {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "f", "input": {}}]}
_CALL_ITEM = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
# A tool result with no content, in each protocol's own shape: (protocol, body, param).
EMPTY_TOOL_RESULTS = [
    ("chat", {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None,
                                                             "tool_calls": [_CALL]},
                           {"role": "tool", "tool_call_id": "c1", "content": ""}]}, "messages[2].content"),
    ("chat", {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None,
                                                             "tool_calls": [_CALL]},
                           {"role": "tool", "tool_call_id": "c1", "content": None}]}, "messages[2].content"),
    ("responses", {"input": [{"role": "user", "content": "x"}, _CALL_ITEM,
                             {"type": "function_call_output", "call_id": "c1", "output": ""}]}, "input[2].output"),
    ("messages", {"max_tokens": 5, "messages": [
        {"role": "user", "content": "x"}, _TOOL_USE,
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": ""}]}]},
     "messages[2].content[0].content"),
    ("messages", {"max_tokens": 5, "messages": [  # content left out: the API's default is ""
        {"role": "user", "content": "x"}, _TOOL_USE,
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1"}]}]},
     "messages[2].content[0].content"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("protocol", "body", "param"), EMPTY_TOOL_RESULTS)
async def test_an_empty_tool_result_is_400_with_the_advice(protocol: str, body: dict, param: str, stream: bool,
                                                           registry: SessionRegistry) -> None:
    """The contract requires non-empty tool content (a None or "" result is sent as a stable
    non-empty value); an empty one is refused naming the field, on all three protocols, and
    nothing is generated. Once the agent sends a value, the same history is served."""
    handler = ScriptedHandler()
    app = create_app(registry, handler)
    async with open_session(registry) as session:
        status, answer, _ = await post(app, ENDPOINTS[protocol], {**body, "stream": stream},
                                       token=session.session_id)
        assert status == 400 and _kind(protocol, answer) == "invalid_request_error"
        message = answer["error"]["message"]
        assert message.startswith(f"{param} must not be empty"), message
        assert "stable non-empty value" in message
        if protocol != "messages":
            assert answer["error"]["param"] == param
        assert handler.requests == []
        fixed = json.loads(json.dumps(body).replace('"content": ""', '"content": "(no output)"')
                           .replace('"content": null', '"content": "(no output)"')
                           .replace('"output": ""', '"output": "(no output)"')
                           .replace('"tool_use_id": "c1"}', '"tool_use_id": "c1", "content": "(no output)"}'))
        status, answer, _ = await post(app, ENDPOINTS[protocol], fixed, token=session.session_id)
        assert status == 200, answer
