"""Buffered SSE: headers, connection frame, heartbeats at exact virtual times, terminal sequences,
in-stream failures, JSON/SSE equivalence of commits, and disconnects that do not lose a turn."""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing
from tests.api.api_helpers import (
    ENDPOINTS,
    ScriptedHandler,
    events,
    parse_sse,
    post,
    scripted_pipeline,
    tool_call_text,
)
from tests.support.apps import serve_app
from tests.support.sessions import open_session

from relaxtrio import BackendError, ContextLengthExceededError
from relaxtrio.api.app import create_app
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.config import ApiConfig
from relaxtrio.forest import ResponseNode, export_samples
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.rollout.turns import EngineTurnHandler
from relaxtrio.testing.scripted_engine import Reply

TOOLS = {"type": "object", "properties": {"city": {"type": "string"}}}


def body_for(protocol: str, history: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    """A minimal valid body of each protocol (``history`` in that protocol's own shape)."""
    if protocol == "chat":
        return {"model": "m", "messages": history or [{"role": "user", "content": "hi"}], **extra}
    if protocol == "responses":
        return {"model": "m", "input": history or "hi", **extra}
    return {"model": "m", "max_tokens": 100, "messages": history or [{"role": "user", "content": "hi"}], **extra}


CONNECTED = {"chat": b": connected\n\n", "responses": b": connected\n\n",
             "messages": b'event: ping\ndata: {"type":"ping"}\n\n'}
HEARTBEAT = {"chat": b": heartbeat\n\n", "responses": b": heartbeat\n\n",
             "messages": b'event: ping\ndata: {"type":"ping"}\n\n'}


async def _read_stream(app, path: str, body: dict, token: str) -> tuple[int, Any, list[tuple[float, bytes]]]:
    """Streams a request through the quart test client, timing each chunk on the trio clock."""
    chunks: list[tuple[float, bytes]] = []
    async with app.test_app() as test_app:
        client = test_app.test_client()
        async with client.request(path, method="POST", headers={
                "content-type": "application/json", "Authorization": f"Bearer {token}"}) as conn:
            start = trio.current_time()
            await conn.send(json.dumps(body).encode())
            await conn.send_complete()
            while True:
                try:
                    chunk = await conn.receive()
                except trio.EndOfChannel:
                    break
                if chunk:
                    chunks.append((trio.current_time() - start, chunk))
            return conn.status_code, conn.headers, chunks


@pytest.mark.parametrize("protocol", sorted(ENDPOINTS))
async def test_heartbeats_while_pending_then_terminal(protocol: str, registry: SessionRegistry,
                                                      autojump_clock: trio.testing.MockClock) -> None:
    gate = trio.Event()
    handler = ScriptedHandler(gate=gate)
    app = create_app(registry, handler, config=ApiConfig(heartbeat_s=15.0))

    async def open_gate() -> None:
        await trio.sleep(50)
        gate.set()

    async with open_session(registry) as session, trio.open_nursery() as nursery:
        nursery.start_soon(open_gate)
        status, headers, chunks = await _read_stream(app, ENDPOINTS[protocol], body_for(protocol, stream=True),
                                                     session.session_id)
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    assert headers["Cache-Control"] == "no-cache" and headers["X-Accel-Buffering"] == "no"
    assert [t for t, _ in chunks] == [0.0, 15.0, 30.0, 45.0, 50.0]
    assert [c for _, c in chunks[:4]] == [CONNECTED[protocol]] + [HEARTBEAT[protocol]] * 3
    frames = parse_sse(chunks[-1][1])  # the whole terminal sequence arrives in one chunk
    assert all(f.comment is None and f.event != "ping" for f in frames)
    if protocol == "chat":
        assert frames[-1].data == "[DONE]"
        chunk = frames[0].json()
        assert chunk["object"] == "chat.completion.chunk" and chunk["usage"]["total_tokens"] == 10
        assert chunk["choices"][0]["delta"] == {"role": "assistant", "content": "ok"}
    elif protocol == "responses":
        assert [f.event for f in frames] == ["response.created", "response.output_item.done", "response.completed"]
        assert frames[0].json()["response"]["status"] == "in_progress"
        assert frames[-1].json()["response"]["usage"]["output_tokens"] == 3
    else:
        assert [f.event for f in frames] == ["message_start", "content_block_start", "content_block_delta",
                                             "content_block_stop", "message_delta", "message_stop"]
        assert frames[4].json()["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}


async def test_heartbeat_interval_is_configurable(registry: SessionRegistry,
                                                  autojump_clock: trio.testing.MockClock) -> None:
    gate = trio.Event()
    app = create_app(registry, ScriptedHandler(gate=gate), config=ApiConfig(heartbeat_s=2.5))

    async def open_gate() -> None:
        await trio.sleep(6)
        gate.set()

    async with open_session(registry) as session, trio.open_nursery() as nursery:
        nursery.start_soon(open_gate)
        _, _, chunks = await _read_stream(app, ENDPOINTS["chat"], body_for("chat", stream=True), session.session_id)
    assert [t for t, _ in chunks] == [0.0, 2.5, 5.0, 6.0]


@pytest.mark.parametrize("protocol", sorted(ENDPOINTS))
@pytest.mark.parametrize("error", [BackendError("engine exploded at 10.0.0.7"),
                                   ContextLengthExceededError("too long", param="messages")])
async def test_failures_inside_the_stream_use_the_protocol_form(protocol: str, error: Exception,
                                                                 registry: SessionRegistry,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(registry, ScriptedHandler(error=error))
    with caplog.at_level(logging.WARNING, logger="relaxtrio.api"):
        async with open_session(registry) as session:
            status, body, _ = await post(app, ENDPOINTS[protocol], body_for(protocol, stream=True),
                                         token=session.session_id)
    assert status == 200  # headers were already sent when the turn failed
    frames = events(parse_sse(body))
    assert "10.0.0.7" not in body
    internal = isinstance(error, BackendError)
    # The log line names the route and the Session although the request context is gone.
    [line] = [r.getMessage() for r in caplog.records if r.name.startswith("relaxtrio.api")]
    where = f"POST {ENDPOINTS[protocol]}, session {session.session_id}"
    assert (f"(HTTP 500, {where})" if internal else f"(HTTP 400, {where}, param messages)") in line
    message = "Internal error while handling agentic request." if internal else "too long"
    if protocol == "chat":
        assert [f.data for f in frames][-1] == "[DONE]"
        assert frames[0].json()["error"]["message"] == message
        assert frames[0].json()["error"]["code"] == ("internal_error" if internal else "context_length_exceeded")
    elif protocol == "responses":
        assert [f.event for f in frames] == ["response.created", "response.failed"]
        created = frames[0].json()["response"]
        assert created["status"] == "in_progress" and created["error"] is None
        assert created["id"] == frames[1].json()["response"]["id"]
        failed = frames[1].json()
        assert failed["sequence_number"] == 1 and failed["response"]["status"] == "failed"
        assert failed["response"]["output"] == [] and "usage" not in failed["response"]
        assert failed["response"]["error"]["message"] == message
    else:
        assert [f.event for f in frames] == ["error"]
        assert frames[0].json() == {"type": "error", "error": {
            "type": "api_error" if internal else "invalid_request_error", "message": message}}


@pytest.mark.parametrize("protocol", sorted(ENDPOINTS))
async def test_render_failure_becomes_an_internal_error_terminal(protocol: str, registry: SessionRegistry) -> None:
    broken = {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function"}]}
    app = create_app(registry, ScriptedHandler(reply=lambda r: broken))
    async with open_session(registry) as session:
        status, body, headers = await post(app, ENDPOINTS[protocol], body_for(protocol), token=session.session_id)
        assert status == 500 and headers["x-should-retry"] == "false"
        assert "rendering" in json.dumps(body)
        status, body, _ = await post(app, ENDPOINTS[protocol], body_for(protocol, stream=True),
                                     token=session.session_id)
    assert status == 200 and "Internal error while rendering agentic response." in body


def test_sse_response_has_no_timeout() -> None:
    from relaxtrio.api.chat import CHAT
    from relaxtrio.api.sse import sse_response
    from relaxtrio.api.wire import ParsedRequest
    from relaxtrio.forest import Conversation
    from relaxtrio.nursery.turns import TurnRequest

    request = ParsedRequest(turn=TurnRequest(conversation=Conversation.from_wire([{"role": "user", "content": "x"}])))

    async def never() -> Any:
        raise AssertionError("not started")

    response = sse_response(CHAT, request, never, 15.0)
    assert response.timeout is None and response.status_code == 200


async def test_invalid_streamed_request_is_rejected_before_the_stream(registry: SessionRegistry) -> None:
    app = create_app(registry, ScriptedHandler())
    async with open_session(registry) as session:
        status, body, headers = await post(app, ENDPOINTS["messages"], {"messages": [], "stream": True},
                                           token=session.session_id)
    assert status == 400 and headers["Content-Type"] == "application/json"
    assert body["error"]["type"] == "invalid_request_error"


# --- JSON and SSE share normalization, commit, usage and finish reason ------------------------------

def _replies() -> list[Reply]:
    return [Reply(text="<think>Look it up.</think>" + tool_call_text("lookup", {"city": "Paris"})),
            Reply(text="Found it.")]


def _tools(protocol: str) -> list[dict[str, Any]]:
    if protocol == "chat":
        return [{"type": "function", "function": {"name": "lookup", "parameters": TOOLS}}]
    if protocol == "responses":
        return [{"type": "function", "name": "lookup", "parameters": TOOLS}]
    return [{"name": "lookup", "input_schema": TOOLS}]


def _reply_of(protocol: str, payload: Any) -> tuple[Any, str]:
    """The assistant reply (in the protocol's shape) and its finish reason, from JSON or SSE."""
    if isinstance(payload, dict):
        if protocol == "chat":
            return payload["choices"][0]["message"], payload["choices"][0]["finish_reason"]
        if protocol == "responses":
            return payload["output"], payload["status"]
        return payload["content"], payload["stop_reason"]
    frames = events(parse_sse(payload))
    if protocol == "chat":
        choice = frames[0].json()["choices"][0]
        delta = dict(choice["delta"])
        if "tool_calls" in delta:
            delta["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in delta["tool_calls"]]
        return delta, choice["finish_reason"]
    if protocol == "responses":
        response = frames[-1].json()["response"]
        return response["output"], response["status"]
    blocks: list[dict[str, Any]] = []
    stop_reason = None
    for frame in frames:
        data = frame.json()
        if frame.event == "content_block_start":
            blocks.append(dict(data["content_block"]))
        elif frame.event == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] += delta["signature"]
            else:
                block["input"] = json.loads(delta["partial_json"])
        elif frame.event == "message_delta":
            stop_reason = data["delta"]["stop_reason"]
    return blocks, stop_reason


def _extend(protocol: str, body: dict[str, Any], reply: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(body))
    if protocol == "chat":
        call_id = reply["tool_calls"][0]["id"]
        body["messages"] += [reply, {"role": "tool", "tool_call_id": call_id, "content": "sunny"}]
    elif protocol == "responses":
        call_id = next(item["call_id"] for item in reply if item["type"] == "function_call")
        body["input"] += [*reply, {"type": "function_call_output", "call_id": call_id, "output": "sunny"}]
    else:
        call_id = next(block["id"] for block in reply if block["type"] == "tool_use")
        body["messages"] += [{"role": "assistant", "content": reply}, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call_id, "content": "sunny"}]}]
    return body


@pytest.mark.parametrize("protocol", sorted(ENDPOINTS))
async def test_json_and_sse_commit_and_export_the_same_samples(protocol: str, registry: SessionRegistry,
                                                               compiler: ChatCompiler) -> None:
    history = [{"role": "user", "content": "Where is Paris?"}]
    first_body = body_for(protocol, history, tools=_tools(protocol))
    if protocol == "responses":
        first_body["input"] = history
    runs = {}
    for stream in (False, True):
        handler, _ = scripted_pipeline(compiler, _replies())
        app = create_app(registry, handler)
        async with open_session(registry) as session:
            body = dict(first_body, stream=stream)
            finishes = []
            for _ in range(2):
                status, payload, _ = await post(app, ENDPOINTS[protocol], body, token=session.session_id)
                assert status == 200, payload
                reply, finish = _reply_of(protocol, payload)
                finishes.append(finish)
                body = _extend(protocol, body, reply) if len(finishes) == 1 else body
            [sample] = export_samples(session.forest, None)
            runs[stream] = (finishes, sample, len(session.forest))
    (json_finishes, json_sample, json_nodes), (sse_finishes, sse_sample, sse_nodes) = runs[False], runs[True]
    assert json_finishes == sse_finishes and json_nodes == sse_nodes == 4  # 2 × (observation, response)
    for field in ("token_ids", "prompt_length", "loss_mask", "rollout_logprobs", "status", "weight_versions"):
        assert getattr(json_sample, field) == getattr(sse_sample, field), field
    volatile = ("session_id", "leaf_state_hash", "turns", "wall_s", "generation_s", "non_generation_s")
    json_trace, sse_trace = (
        {k: v for k, v in sample.metadata["agentic_trace"].items() if k not in volatile}
        for sample in (json_sample, sse_sample))
    assert json_trace == sse_trace and json_trace["turn_count"] == 2
    assert [t["finish_reason"] for t in json_sample.metadata["agentic_trace"]["turns"]] == \
        [t["finish_reason"] for t in sse_sample.metadata["agentic_trace"]["turns"]] == ["tool_calls", "stop"]
    assert json_sample.metadata["tools"] == sse_sample.metadata["tools"]


# --- a client disconnect never loses a generation (docs/agent-contract.md#client-disconnects) ------

@attrs.define(eq=False)
class CommitWatch:
    """Forwards turns to the real handler; ``committed`` is set once a turn has returned."""

    inner: EngineTurnHandler
    committed: trio.Event = attrs.field(factory=trio.Event)

    async def complete(self, *args: Any, **kwargs: Any) -> Any:
        result = await self.inner.complete(*args, **kwargs)
        self.committed.set()
        return result


@pytest.mark.parametrize("stream", [False, True])
async def test_disconnect_does_not_lose_the_generation(stream: bool, registry: SessionRegistry,
                                                       compiler: ChatCompiler) -> None:
    gate = trio.Event()
    generating = trio.Event()

    def reply(input_ids: tuple[int, ...]) -> Reply:
        generating.set()
        return Reply(text="Finished anyway.", gate=gate)

    handler, engine = scripted_pipeline(compiler, reply)
    watch = CommitWatch(handler)
    app = create_app(registry, watch)
    with trio.fail_after(20):
        async with serve_app(app) as base_url, open_session(registry) as session:
            if stream:  # a raw socket: read the connection frame, then hang up mid-stream
                url = httpx.URL(base_url)
                payload = json.dumps(body_for("messages", stream=True)).encode()
                async with await trio.open_tcp_stream(url.host, url.port) as sock:
                    await sock.send_all(
                        b"POST /agentic_api/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        + f"x-api-key: {session.session_id}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
                        + payload)
                    received = b""
                    while b"event: ping" not in received:
                        received += await sock.receive_some()
                    assert received.startswith(b"HTTP/1.1 200")
            else:
                async with httpx.AsyncClient(timeout=30) as client, trio.open_nursery() as client_tasks:
                    client_tasks.start_soon(functools.partial(
                        client.post, base_url + "v1/messages", json=body_for("messages"),
                        headers={"x-api-key": session.session_id}))
                    await generating.wait()
                    client_tasks.cancel_scope.cancel()  # hang up while the engine generates
            await generating.wait()
            assert engine.calls
            assert not any(isinstance(n, ResponseNode) for n in session.forest.leaves())
            gate.set()
            await watch.committed.wait()
            assert any(isinstance(n, ResponseNode) for n in session.forest.leaves())
            [leaf] = session.forest.leaves()
            assert leaf.message["content"] == "Finished anyway." and engine.aborted == []
