"""Chat Completions endpoint: auth, validation envelopes, rendering, disconnects, discarded sessions."""

from __future__ import annotations

import functools
import json
import logging

import httpx
import pytest
import trio
from tests.api.api_helpers import ScriptedHandler
from tests.support.apps import serve_app
from tests.support.sessions import open_session

from relaxtrio.api.app import create_app
from relaxtrio.nursery.session import SessionRegistry

CHAT = "/agentic_api/v1/chat/completions"
USER = {"role": "user", "content": "hi"}


async def _post(app, path: str, body, token: str | None = None, raw: bytes | None = None):
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with app.test_app() as test_app:
        client = test_app.test_client()
        data = raw if raw is not None else json.dumps(body).encode()
        response = await client.post(path, data=data, headers=headers)
        return response.status_code, await response.get_json(), response.headers


async def test_auth_errors_use_openai_envelope(registry: SessionRegistry, handler: ScriptedHandler) -> None:
    app = create_app(registry, handler)
    status, body, _ = await _post(app, CHAT, {"messages": [USER]})
    assert status == 401 and body["error"]["type"] == "authentication_error"
    assert body["error"]["message"] == "Missing Authorization header"
    async with app.test_app() as test_app:
        response = await test_app.test_client().post(
            CHAT, json={"messages": [USER]}, headers={"Authorization": "Token abc"})
        assert response.status_code == 401
        assert (await response.get_json())["error"]["message"] == "Authorization header must be 'Bearer <token>'"
    status, body, headers = await _post(app, CHAT, {"messages": [USER]}, token="session-nope")
    assert status == 401
    assert body["error"] == {"message": "Unknown or discarded agentic session 'session-nope'.",
                             "type": "authentication_error", "param": None, "code": "session_discarded"}
    assert headers["x-should-retry"] == "false"


async def test_a_huge_unknown_token_is_not_echoed_whole(registry: SessionRegistry, handler: ScriptedHandler,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    app = create_app(registry, handler)
    token = "x" * 10_000
    status, body, _ = await _post(app, CHAT, {"messages": [USER]}, token=token)
    assert status == 401 and body["error"]["code"] == "session_discarded"
    assert body["error"]["message"] == f"Unknown or discarded agentic session '{'x' * 64}...(10000 chars)'."
    assert "(10000 chars)" in caplog.text and "x" * 65 not in caplog.text


async def test_validation_errors_name_the_field(registry: SessionRegistry, handler: ScriptedHandler) -> None:
    app = create_app(registry, handler)
    async with open_session(registry) as session:
        token = session.session_id
        status, body, _ = await _post(app, CHAT, None, token=token, raw=b"{not json")
        assert status == 400 and body["error"]["param"] == "body"
        assert body["error"]["message"].startswith("Invalid request body")
        status, body, _ = await _post(app, CHAT, [1, 2], token=token)
        assert status == 400 and body["error"]["param"] == "body"
        status, body, _ = await _post(app, CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, token=token)
        assert status == 400 and body["error"]["param"] == "messages[0].role"
        status, body, _ = await _post(app, CHAT, {"messages": [USER], "max_tokens": True}, token=token)
        assert status == 400 and body["error"]["param"] == "max_tokens"
        status, body, _ = await _post(app, CHAT, {"messages": [USER], "logprobs": "true"}, token=token)
        assert status == 400 and body["error"]["message"] == "logprobs must be a boolean"
        status, body, _ = await _post(app, CHAT, {"messages": [USER], "stop": 5}, token=token)
        assert status == 400 and body["error"]["param"] == "stop"
        status, body, _ = await _post(
            app, CHAT, {"messages": [USER], "chat_template_kwargs": {"tokenize": True}}, token=token)
        assert status == 400 and body["error"]["param"] == "chat_template_kwargs"
        for part in ({"type": 5}, {"type": "bogus"}):  # the model would be shown an empty message
            status, body, _ = await _post(
                app, CHAT, {"messages": [{"role": "user", "content": [part]}]}, token=token)
            assert status == 400 and body["error"]["param"] == "messages[0].content[0].type"
    assert handler.requests == [], "no invalid request reached generation"


async def test_success_renders_chat_completion(registry: SessionRegistry, handler: ScriptedHandler) -> None:
    app = create_app(registry, handler)
    async with open_session(registry) as session:
        status, body, _ = await _post(
            app, "/agentic_api/chat/completions",
            {"model": "m", "messages": [USER], "max_completion_tokens": 9, "max_tokens": 50,
             "stop": "END", "seed": 3, "temperature": 0.1, "n": 1, "tool_choice": "auto"},
            token=session.session_id)
    assert status == 200
    assert body["object"] == "chat.completion" and body["model"] == "m"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "ok"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    turn = handler.requests[0]
    assert turn.max_new_tokens == 9 and turn.stop == ("END",) and turn.seed == 3


async def test_tool_call_message_has_null_content(registry: SessionRegistry) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    handler = ScriptedHandler(reply=lambda r: {"role": "assistant", "content": "", "tool_calls": [call]})
    app = create_app(registry, handler)
    async with open_session(registry) as session:
        status, body, _ = await _post(app, CHAT, {"messages": [USER]}, token=session.session_id)
    assert status == 200
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": None, "tool_calls": [call]}
    assert choice["finish_reason"] == "tool_calls"


async def test_unknown_route_and_method_are_json(registry: SessionRegistry, handler: ScriptedHandler) -> None:
    app = create_app(registry, handler)
    async with app.test_app() as test_app:
        client = test_app.test_client()
        response = await client.get("/agentic_api/nope")
        assert response.status_code == 404
        assert (await response.get_json())["error"]["type"] == "not_found_error"
        response = await client.get(CHAT)
        assert response.status_code == 405
        assert "error" in await response.get_json()


async def test_unexpected_error_is_generic_500(registry: SessionRegistry) -> None:
    handler = ScriptedHandler(error=RuntimeError("secret internal detail"))
    app = create_app(registry, handler)
    async with open_session(registry) as session:
        status, body, headers = await _post(app, CHAT, {"messages": [USER]}, token=session.session_id)
    assert status == 500
    assert body["error"]["type"] == "internal_error"
    assert "secret" not in json.dumps(body)
    assert headers["x-should-retry"] == "false"


async def test_client_disconnect_does_not_cancel_the_turn(registry: SessionRegistry) -> None:
    gate = trio.Event()
    handler = ScriptedHandler(gate=gate)
    app = create_app(registry, handler)
    with trio.fail_after(20):
        async with serve_app(app) as base_url, open_session(registry) as session:
            async with httpx.AsyncClient(timeout=30) as client, trio.open_nursery() as client_tasks:
                client_tasks.start_soon(functools.partial(
                    client.post, base_url + "v1/chat/completions", json={"messages": [USER]},
                    headers={"Authorization": f"Bearer {session.session_id}"}))
                await handler.first_request.wait()
                client_tasks.cancel_scope.cancel()  # the client hangs up while the turn waits
            assert handler.requests and not handler.completed
            gate.set()
            await handler.first_completion.wait()
            assert handler.completed == [session.session_id]


async def test_session_end_answers_waiting_request_with_404(registry: SessionRegistry) -> None:
    handler = ScriptedHandler(gate=trio.Event())
    app = create_app(registry, handler)
    results = []
    answered = trio.Event()
    with trio.fail_after(20):
        async with serve_app(app) as base_url, trio.open_nursery() as nursery:

            async def call(token: str) -> None:
                async with httpx.AsyncClient(timeout=30) as client:
                    results.append(await client.post(
                        base_url + "chat/completions", json={"messages": [USER]},
                        headers={"Authorization": f"Bearer {token}"}))
                answered.set()

            async with open_session(registry) as session:
                nursery.start_soon(call, session.session_id)
                await handler.first_request.wait()
            await answered.wait()
    assert results[0].status_code == 404
    assert results[0].json()["error"]["code"] == "session_discarded"
