"""A tool call cut by the token limit (docs/client-quirks.md#a-tool-call-cut-by-the-token-limit):
every protocol, JSON and stream, answers finish ``length`` with the raw text as plain text and no
call, and the agent's echo of that text extends the committed node (no new branch)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.api.api_helpers import (
    ENDPOINTS,
    assert_one_lineage,
    events,
    parse_sse,
    post,
    scripted_pipeline,
    tool_call_text,
)
from tests.support.sessions import open_session

from relaxtrio.api.app import create_app
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.testing.scripted_engine import Reply

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
# One complete call, then a second one cut inside its arguments: neither may reach the agent as a call.
CUT = ("Checking both." + tool_call_text("lookup", {"city": "Paris"})
       + '\n<tool_call>\n{"name": "lookup", "arguments": {"city": "Be')
FINISH = {"chat": "length", "responses": "incomplete", "messages": "max_tokens"}


def _first_body(protocol: str, stream: bool) -> dict[str, Any]:
    history = [{"role": "user", "content": "Weather in Paris and Bern?"}]
    if protocol == "chat":
        tools: list[dict[str, Any]] = [{"type": "function", "function": {"name": "lookup", "parameters": SCHEMA}}]
        return {"model": "m", "messages": history, "tools": tools, "max_tokens": 200, "stream": stream}
    if protocol == "responses":
        tools = [{"type": "function", "name": "lookup", "parameters": SCHEMA}]
        return {"model": "m", "input": history, "tools": tools, "max_output_tokens": 200, "stream": stream}
    tools = [{"name": "lookup", "input_schema": SCHEMA}]
    return {"model": "m", "messages": history, "tools": tools, "max_tokens": 200, "stream": stream}


def _answer(protocol: str, payload: Any) -> tuple[Any, str]:
    """The reply in the protocol's own shape (what an agent echoes) and its finish, JSON or SSE."""
    if isinstance(payload, str):
        frames = [frame.json() for frame in events(parse_sse(payload)) if frame.data != "[DONE]"]
        if protocol == "chat":
            choice = frames[0]["choices"][0]
            return choice["delta"], choice["finish_reason"]
        if protocol == "responses":
            response = frames[-1]["response"]
            return response["output"], response["status"]
        blocks = [dict(f["content_block"]) for f in frames if f["type"] == "content_block_start"]
        for frame in frames:
            if frame["type"] == "content_block_delta":
                delta = dict(frame["delta"])
                field = {"text_delta": "text", "thinking_delta": "thinking",
                         "signature_delta": "signature"}[delta.pop("type")]
                blocks[frame["index"]][field] += delta[field]
        [delta] = [f["delta"] for f in frames if f["type"] == "message_delta"]
        return blocks, delta["stop_reason"]
    if protocol == "chat":
        return payload["choices"][0]["message"], payload["choices"][0]["finish_reason"]
    if protocol == "responses":
        return payload["output"], payload["status"]
    return payload["content"], payload["stop_reason"]


def _texts(protocol: str, reply: Any) -> list[str]:
    """The reply's text and the kinds of everything else it holds."""
    if protocol == "chat":
        return [reply["content"], *(["tool_calls"] if reply.get("tool_calls") else [])]
    if protocol == "responses":
        return [part["text"] if item["type"] == "message" else item["type"]
                for item in reply if item["type"] != "reasoning" for part in item.get("content") or [{}]]
    return [block["text"] if block["type"] == "text" else block["type"] for block in reply
            if block["type"] != "thinking"]


def _echo(protocol: str, body: dict[str, Any], reply: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(body))
    if protocol == "chat":
        body["messages"] += [reply, {"role": "user", "content": "Go on."}]
    elif protocol == "responses":
        body["input"] += [*reply, {"role": "user", "content": "Go on."}]
    else:
        body["messages"] += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Go on."}]
    return body


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("protocol", sorted(ENDPOINTS))
async def test_a_tool_call_cut_by_the_limit_is_length_text_on_every_protocol(
        protocol: str, stream: bool, registry: SessionRegistry, compiler: ChatCompiler) -> None:
    handler, engine = scripted_pipeline(compiler, [Reply(text="<think>Both cities.</think>\n\n" + CUT, finish="length"),
                                                   Reply(text="Done.")])
    app = create_app(registry, handler)
    async with open_session(registry) as session:
        body = _first_body(protocol, stream)
        status, payload, _ = await post(app, ENDPOINTS[protocol], body, token=session.session_id)
        assert status == 200, payload
        reply, finish = _answer(protocol, payload)
        assert finish == FINISH[protocol]
        assert _texts(protocol, reply) == [CUT]  # the raw text, kept whole; no call to run
        [leaf] = session.forest.leaves()
        assert leaf.message == {"role": "assistant", "content": CUT, "reasoning_content": "Both cities."}
        status, payload, _ = await post(app, ENDPOINTS[protocol], _echo(protocol, body, reply),
                                        token=session.session_id)
        assert status == 200, payload
        assert _texts(protocol, _answer(protocol, payload)[0]) == ["Done."]
        assert_one_lineage(session, responses=2)
        assert len(engine.calls) == 2
