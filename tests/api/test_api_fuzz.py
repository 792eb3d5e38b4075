"""Hypothesis: malformed and odd bodies on all three endpoints never cause a 5xx or a crash.

Bodies come from five sources: a rich valid request of each protocol with one field (any depth)
replaced by an odd value or deleted, random JSON documents (objects and non-objects), random
bytes and invalid UTF-8, very deep nesting, and valid requests with random extra keys. One app
serves every example; after each one a valid request must still get a 200.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import pytest
from tests.api.api_helpers import ENDPOINTS, ScriptedHandler, events, parse_sse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support.sessions import open_session

from relaxtrio.api.app import create_app
from relaxtrio.config import ApiConfig
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.nursery.turns import TurnRequest

NUM_BODIES = int(os.environ.get("RELAXTRIO_FUZZ_BODIES", "2200"))
QUICK_BODIES = min(NUM_BODIES, 200)
"""Examples in the quick run (``-m "not slow"``); the slow test draws all ``NUM_BODIES``."""

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
TEMPLATES: dict[str, dict[str, Any]] = {
    "chat": {
        "model": "m", "stream": False, "temperature": 0.5, "n": 1, "seed": 1, "logprobs": True, "stop": ["x"],
        "max_completion_tokens": 10, "max_tokens": 20, "chat_template_kwargs": {"enable_thinking": True},
        "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": SCHEMA}}],
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "hi"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]},
            {"role": "assistant", "content": None, "reasoning_content": "r", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "out"},
            {"role": "user", "content": "next"}],
    },
    "responses": {
        "model": "m", "stream": False, "instructions": "sys", "max_output_tokens": 10,
        "reasoning": {"effort": "high"}, "previous_response_id": None,
        "tools": [{"type": "function", "name": "f", "description": "d", "parameters": SCHEMA, "strict": True}],
        "input": [
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": "https://x/y.png"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "r"}], "content": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
            {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "out"}]},
            {"role": "developer", "content": "dev"}],
    },
    "messages": {
        "model": "m", "stream": False, "max_tokens": 10, "stop_sequences": ["x"],
        "thinking": {"type": "enabled", "budget_tokens": 5},
        "system": [{"type": "text", "text": "sys"}],
        "tools": [{"name": "f", "description": "d", "input_schema": SCHEMA}],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "hi"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
                {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "r", "signature": "s"}, {"type": "text", "text": "ok"},
                {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": [{"type": "text", "text": "out"}]},
                {"type": "text", "text": "next"}]}],
    },
}


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, prefix + (index,))
    return out


PATHS = {protocol: _paths(body) for protocol, body in TEMPLATES.items()}

json_leaf = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
             | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
odd_value = st.one_of(
    json_value,
    st.sampled_from([None, True, False, 0, -1, 1, 2**63, 2**64, -(2**63) - 1, 1.5, -0.0, 1e308, "", " ", "\x00",
                     "\ud800", "\udfff x", "null", "[]", "{}", "{\"a\": 1}", [], {}, [None], [""], [[]], [{}],
                     {"type": None}, {"type": "text"}, {"type": "text", "text": ""}, {"type": "input_text"},
                     {"type": "function", "name": ""}, {"role": "user"}, {"role": "assistant", "content": None}]),
    st.sampled_from(["x" * 200_000, ["y"] * 5_000, {"k" * 20_000: 1}, [{"type": "text", "text": "z"}] * 2_000]),
)


@st.composite
def mutated_template(draw: st.DrawFn) -> tuple[str, bytes]:
    protocol = draw(st.sampled_from(sorted(TEMPLATES)))
    body = copy.deepcopy(TEMPLATES[protocol])
    body["stream"] = draw(st.booleans())
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS[protocol]))
        parent: Any = body
        try:
            for key in path[:-1]:
                parent = parent[key]
            if draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = copy.deepcopy(draw(odd_value))  # sampled values are shared objects
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or replaced this path
    return protocol, json.dumps(body).encode()


@st.composite
def extra_keys(draw: st.DrawFn) -> tuple[str, bytes]:
    protocol = draw(st.sampled_from(sorted(TEMPLATES)))
    body = {**TEMPLATES[protocol], **draw(st.dictionaries(st.text(max_size=10), json_value, max_size=4))}
    return protocol, json.dumps(body).encode()


protocols = st.sampled_from(sorted(ENDPOINTS))
raw_bodies = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"", b"\xff", b"\xc3\x28", b'{"messages": "\xff"}', b"\xef\xbb\xbf{}", b'{"a": NaN}',
                     b'{"input": Infinity}', json.dumps({"input": "hi"}).encode("utf-16"), b"{" * 50_000]),
    json_value.map(lambda v: json.dumps(v).encode()),
    st.integers(1, 5_000).map(lambda n: ("[" * n + "]" * n).encode()),
    st.integers(1, 3_000).map(lambda n: ('{"messages":' * n + "1" + "}" * n).encode()),
)
bodies = st.one_of(
    mutated_template(), mutated_template(), mutated_template(),
    extra_keys(),
    st.tuples(protocols, raw_bodies),
)


def _reply(request: TurnRequest) -> dict[str, Any]:
    """Varied replies so rendering is fuzzed too: tool calls to the request's odd tool names."""
    tools = request.conversation.tools
    if tools and isinstance(tools[0]["function"].get("name"), str) and tools[0]["function"]["name"]:
        call = {"id": "call_x", "type": "function", "function": {"name": tools[0]["function"]["name"],
                                                                 "arguments": '{"a":1}'}}
        return {"role": "assistant", "content": "", "reasoning_content": "why", "tool_calls": [call]}
    last = request.conversation.messages[-1]["content"]
    text = last if isinstance(last, str) and last else "ok"
    return {"role": "assistant", "content": text[:50] or "ok"}


REGISTRY = SessionRegistry()
HANDLER = ScriptedHandler(reply=_reply)
APP = create_app(REGISTRY, HANDLER, config=ApiConfig(max_body_bytes=4 * 1024 * 1024))
STATS: dict[str, int] = {}


def _check_envelope(protocol: str, status: int, content_type: str, data: bytes) -> None:
    assert status < 500, (status, data[:300])
    if content_type.startswith("text/event-stream"):
        assert status == 200
        frames = events(parse_sse(data))
        assert frames, data[:300]
        return
    assert content_type == "application/json", content_type
    body = json.loads(data)
    if status == 200:
        key = {"chat": "choices", "responses": "output", "messages": "content"}[protocol]
        assert key in body
    elif protocol == "messages":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}


_FUZZ = {"deadline": None, "database": None, "derandomize": True,
         "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]}


@settings(max_examples=QUICK_BODIES, **_FUZZ)
@given(case=bodies)
async def test_odd_bodies_never_cause_a_5xx(case: tuple[str, bytes]) -> None:
    await _never_a_5xx(case)


@pytest.mark.slow  # about a minute on a loaded 2-core machine
@settings(max_examples=NUM_BODIES, **_FUZZ)
@given(case=bodies)
async def test_many_odd_bodies_never_cause_a_5xx(case: tuple[str, bytes]) -> None:
    await _never_a_5xx(case)


async def _never_a_5xx(case: tuple[str, bytes]) -> None:
    protocol, raw = case
    async with APP.test_app() as test_app, open_session(REGISTRY) as session:
        client = test_app.test_client()
        headers = {"content-type": "application/json", "Authorization": f"Bearer {session.session_id}"}
        response = await client.post(ENDPOINTS[protocol], data=raw, headers=headers)
        data = await response.get_data()
        _check_envelope(protocol, response.status_code, response.headers.get("Content-Type", ""), data)
        STATS[str(response.status_code)] = STATS.get(str(response.status_code), 0) + 1
        valid = TEMPLATES[protocol]
        response = await client.post(ENDPOINTS[protocol], data=json.dumps(valid).encode(), headers=headers)
        assert response.status_code == 200, await response.get_data()


@pytest.mark.parametrize("protocol", sorted(TEMPLATES))
async def test_templates_are_valid_requests(protocol: str) -> None:
    for stream in (False, True):
        async with APP.test_app() as test_app, open_session(REGISTRY) as session:
            response = await test_app.test_client().post(
                ENDPOINTS[protocol], data=json.dumps({**TEMPLATES[protocol], "stream": stream}).encode(),
                headers={"content-type": "application/json", "Authorization": f"Bearer {session.session_id}"})
            data = await response.get_data()
            assert response.status_code == 200, data
            _check_envelope(protocol, 200, response.headers["Content-Type"], data)
