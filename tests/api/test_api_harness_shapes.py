"""Request shapes that real harnesses send, replayed as sent (issue: real harnesses, unmodified).

Each test reproduces what one CLI puts on the wire (Claude Code over Anthropic Messages, Codex
over Responses, opencode, mini-swe-agent) and checks the projection relaxtrio gives it
(docs/agent-contract.md). They go through the app (``create_app(...).test_client()``) with a
scripted turn handler, so the HTTP status, the error envelope and the canonical request the turn
sees are all checked.
"""

from __future__ import annotations

import json
import logging

import pytest
from tests.api.api_helpers import (
    MESSAGES,
    RESPONSES,
    ScriptedHandler,
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

PNG_URL = "data:image/png;base64,iVBORw0KGgo="


async def _turn(registry: SessionRegistry, path: str, body: dict) -> tuple[int, dict, ScriptedHandler]:
    handler = ScriptedHandler()
    app = create_app(registry, handler)
    async with open_session(registry) as session:
        status, answer, _ = await post(app, path, body, token=session.session_id)
    return status, answer, handler


# --- images inside tool results -------------------------------------------------------------

CLAUDE_CODE_READ_IMAGE = {
    "model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": False,
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is in shot.png?"}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"file_path": "/w/shot.png"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": "iVBORw0KGgo="}}]}]},
    ],
    "tools": [{"name": "Read", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}}],
}

CODEX_VIEW_IMAGE = {
    "model": "gpt-5-codex", "stream": False, "instructions": "You are Codex.",
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look at shot.png"}]},
        {"type": "function_call", "call_id": "call_1", "name": "view_image", "arguments": '{"path":"shot.png"}'},
        {"type": "function_call_output", "call_id": "call_1",
         "output": [{"type": "input_image", "image_url": PNG_URL}]},
    ],
    "tools": [{"type": "function", "name": "view_image", "parameters": {"type": "object"}}],
}


@pytest.mark.parametrize(("path", "body", "call_id"), [
    (MESSAGES, CLAUDE_CODE_READ_IMAGE, "toolu_01"),
    (RESPONSES, CODEX_VIEW_IMAGE, "call_1"),
])
async def test_image_in_tool_result_reaches_the_model(path: str, body: dict, call_id: str,
                                                      registry: SessionRegistry) -> None:
    status, answer, handler = await _turn(registry, path, body)
    assert status == 200, answer
    tool = handler.requests[0].conversation.messages[-1]
    assert tool == {"role": "tool", "tool_call_id": call_id,
                    "content": [{"type": "image_url", "image_url": {"url": PNG_URL}}]}


async def test_tool_result_text_and_image_keep_their_order(registry: SessionRegistry) -> None:
    body = {**CODEX_VIEW_IMAGE, "input": [*CODEX_VIEW_IMAGE["input"][:2], {
        "type": "function_call_output", "call_id": "call_1",
        "output": [{"type": "input_text", "text": "shot.png:"}, {"type": "input_image", "image_url": PNG_URL}]}]}
    status, _, handler = await _turn(registry, RESPONSES, body)
    assert status == 200
    assert handler.requests[0].conversation.messages[-1]["content"] == [
        {"type": "text", "text": "shot.png:"}, {"type": "image_url", "image_url": {"url": PNG_URL}}]


async def test_every_4xx_is_logged(registry: SessionRegistry, caplog: pytest.LogCaptureFixture) -> None:
    body = {**CODEX_VIEW_IMAGE, "input": [*CODEX_VIEW_IMAGE["input"][:2], {
        "type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_file"}]}]}
    with caplog.at_level(logging.WARNING, logger="relaxtrio.api"):
        status, answer, _ = await _turn(registry, RESPONSES, body)
    assert status == 400 and answer["error"]["param"] == "input[2].output"
    [line] = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert line.startswith("responses request rejected (HTTP 400, POST /agentic_api/v1/responses, session ")
    assert "param input[2].output" in line


# --- system text inside the conversation ------------------------------------------------------

CLAUDE_CODE_SYSTEM_ENTRY = {
    "model": "claude-sonnet-4-5", "max_tokens": 32000,
    "system": [{"type": "text", "text": "You are Claude Code."}],
    "messages": [
        {"role": "system", "content": "Available agent types: general-purpose, Explore. Skills: pdf."},
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                                     {"type": "text", "text": "fix the bug"}]},
    ],
}


async def test_messages_system_entry_reaches_the_model(registry: SessionRegistry) -> None:
    status, _, handler = await _turn(registry, MESSAGES, CLAUDE_CODE_SYSTEM_ENTRY)
    assert status == 200
    assert handler.requests[0].conversation.messages[0] == {
        "role": "system",
        "content": "You are Claude Code.\n\nAvailable agent types: general-purpose, Explore. Skills: pdf."}


async def test_late_developer_message_keeps_the_first_turn_trained(registry: SessionRegistry,
                                                                    compiler: ChatCompiler) -> None:
    # Codex resumes a thread with another sandbox setting: a developer message after turn 1.
    handler, engine = scripted_pipeline(compiler, [Reply(text="Done."), Reply(text="Done again.")])
    app = create_app(registry, handler)
    first = {"model": "gpt-5-codex", "instructions": "You are Codex.",
             "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]}]}
    async with open_session(registry) as session:
        status, answer, _ = await post(app, RESPONSES, first, token=session.session_id)
        assert status == 200
        second = {**first, "input": [
            *first["input"], *answer["output"],
            {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": "<permissions>sandbox: workspace-write</permissions>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and the tests"}]}]}
        status, _, _ = await post(app, RESPONSES, second, token=session.session_id)
        assert status == 200
        assert_one_lineage(session, responses=2)
        assert "sandbox: workspace-write" in compiler.tokenizer.decode(engine.calls[1][0][len(engine.calls[0][0]):])


# --- small things the CLIs trip over -------------------------------------------------------------

@pytest.mark.parametrize("path", ["/agentic_api/", "/agentic_api", "/agentic_api/v1"])
async def test_head_on_the_base_url_answers_200(path: str, registry: SessionRegistry) -> None:
    # Claude Code probes its base URL with HEAD and reports a 404 as an unreachable API.
    app = create_app(registry, ScriptedHandler())
    async with app.test_app() as test_app:
        response = await test_app.test_client().head(path)
    assert response.status_code == 200


@pytest.mark.parametrize(("path", "body", "kind"), [
    (MESSAGES, CLAUDE_CODE_SYSTEM_ENTRY, "authentication_error"),
    (RESPONSES, CODEX_VIEW_IMAGE, "authentication_error"),
])
async def test_unknown_session_is_an_auth_failure(path: str, body: dict, kind: str,
                                                  registry: SessionRegistry) -> None:
    status, answer, headers = await post(create_app(registry, ScriptedHandler()), path, body,
                                         headers={"x-api-key": "relax-session-gone"} if path == MESSAGES else None,
                                         token=None if path == MESSAGES else "relax-session-gone")
    assert status == 401 and headers["x-should-retry"] == "false"
    assert (answer["error"]["type"]) == kind


@pytest.mark.parametrize("path", [MESSAGES, RESPONSES])
async def test_context_length_known_before_generation_is_answered_before_the_stream(
        path: str, registry: SessionRegistry, compiler: ChatCompiler) -> None:
    # Claude Code: a stream that starts and then fails is retried without streaming.
    handler, engine = scripted_pipeline(compiler, [Reply(text="never")])
    app = create_app(registry, handler)
    long_text = "word " * 400
    body = ({"model": "c", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": long_text}]}
            if path == MESSAGES else {"model": "m", "stream": True, "input": long_text})
    async with open_session(registry, max_context_tokens=64) as session:
        status, answer, headers = await post(app, path, body, token=session.session_id)
    assert status == 400 and headers["content-type"] == "application/json", answer
    kind = answer["error"]["type"] if path == MESSAGES else answer["error"]["code"]
    assert kind == ("invalid_request_error" if path == MESSAGES else "context_length_exceeded")
    assert engine.calls == []


# --- Responses tools that are not functions -------------------------------------------------------

APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
               "format": {"type": "grammar", "syntax": "lark",
                          "definition": 'start: "*** Begin Patch" LF hunk+ "*** End Patch"'}}
SHELL = {"type": "function", "name": "shell", "parameters": {"type": "object"}, "strict": False}
PATCH = "*** Begin Patch\n*** Update File: a.py\n-x = 1\n+x = 2\n*** End Patch"


async def test_custom_tool_round_trips_as_custom_tool_call(registry: SessionRegistry, compiler: ChatCompiler) -> None:
    handler, engine = scripted_pipeline(compiler, [
        Reply(text=tool_call_text("apply_patch", {"input": PATCH})), Reply(text="Patched.")])
    app = create_app(registry, handler)
    first = {"model": "gpt-5-codex", "instructions": "You are Codex.", "tools": [SHELL, APPLY_PATCH],
             "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x = 2"}]}]}
    async with open_session(registry) as session:
        status, answer, _ = await post(app, RESPONSES, first, token=session.session_id)
        assert status == 200, answer
        [call] = answer["output"]
        assert (call["type"], call["name"], call["input"]) == ("custom_tool_call", "apply_patch", PATCH)
        tool = handler_tools(engine, compiler)
        assert "apply_patch" in tool and "*** Begin Patch" in tool  # the grammar reaches the model
        second = {**first, "input": [*first["input"], call,
                                     {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "Done!"}]}
        status, answer, _ = await post(app, RESPONSES, second, token=session.session_id)
        assert status == 200 and answer["output"][0]["content"][0]["text"] == "Patched."
        assert_one_lineage(session, responses=2)


def handler_tools(engine, compiler: ChatCompiler) -> str:
    """The system turn the model saw first (it lists the tools)."""
    return compiler.tokenizer.decode(engine.calls[0][0])


MULTI_AGENT = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
    {"type": "function", "name": "spawn_agent", "description": "Spawn a sub-agent.",
     "parameters": {"type": "object", "properties": {"message": {"type": "string"}}}, "strict": False},
    {"type": "function", "name": "wait_agent", "parameters": {"type": "object", "properties": {}}},
]}


@pytest.mark.parametrize("stream", [False, True])
async def test_namespace_tools_are_served_and_calls_carry_the_namespace(
        registry: SessionRegistry, compiler: ChatCompiler, stream: bool) -> None:
    """Codex's default sub-agent tools (docs/agent-contract.md#responses-tools): the model sees
    the namespace's function tools, its call comes back with ``name`` and ``namespace`` as Codex
    expects, ``web_search`` is left out, and Codex's replay continues the lineage."""
    handler, engine = scripted_pipeline(compiler, [
        Reply(text=tool_call_text("spawn_agent", {"message": "Check the tests."})), Reply(text="Spawned.")])
    app = create_app(registry, handler)
    first = {"model": "gpt-5-codex", "instructions": "You are Codex.", "stream": stream,
             "tools": [SHELL, MULTI_AGENT, {"type": "web_search", "external_web_access": False}],
             "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go."}]}]}
    async with open_session(registry) as session:
        status, answer, _ = await post(app, RESPONSES, first, token=session.session_id)
        assert status == 200, answer
        response = json.loads(events(parse_sse(answer))[-1].data)["response"] if stream else answer
        output = response["output"]
        [call] = output
        assert (call["type"], call["name"], call["namespace"]) == ("function_call", "spawn_agent", "multi_agent_v1")
        assert json.loads(call["arguments"]) == {"message": "Check the tests."}
        prompt = handler_tools(engine, compiler)
        assert all(f'"name": "{name}"' in prompt for name in ("shell", "spawn_agent", "wait_agent"))
        assert "web_search" not in prompt and "multi_agent_v1" not in prompt
        assert session.ignored_request_fields == {"tools:web_search": 1}
        output_item = {"type": "function_call_output", "call_id": call["call_id"], "name": "spawn_agent",
                       "namespace": "multi_agent_v1", "output": "agent_1 started"}
        second = {**first, "input": [*first["input"], call, output_item]}
        status, answer, _ = await post(app, RESPONSES, second, token=session.session_id)
        assert status == 200, answer
        assert_one_lineage(session, responses=2)


@pytest.mark.parametrize(("tools", "param"), [
    ([SHELL, {**MULTI_AGENT, "tools": [{"type": "function", "name": "shell"}]}], "tools[1].tools[0].name"),
    ([{**MULTI_AGENT, "tools": [{"type": "custom", "name": "x"}]}], "tools[0].tools[0].type"),
    ([{**MULTI_AGENT, "tools": "spawn_agent"}], "tools[0].tools"),
])
async def test_a_namespace_that_cannot_be_served_is_a_400_naming_it(registry: SessionRegistry, tools: list,
                                                                    param: str) -> None:
    status, answer, _ = await _turn(registry, RESPONSES, {"model": "gpt-5-codex", "input": "hi", "tools": tools})
    assert status == 400 and answer["error"]["param"] == param, answer


async def test_hosted_tools_are_left_out_with_a_log_line(registry: SessionRegistry,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    body = {"model": "gpt-5-codex", "input": "hi", "tools": [SHELL, {"type": "web_search"}]}
    with caplog.at_level(logging.WARNING, logger="relaxtrio.api"):
        status, _, handler = await _turn(registry, RESPONSES, body)
    assert status == 200 and [t["function"]["name"] for t in handler.requests[0].conversation.tools] == ["shell"]
    assert "tools[1] (web_search) is a hosted tool: the model cannot call it here; left out" in caplog.text


@pytest.mark.parametrize("path", ["/agentic_api/v1/responses/compact", "/agentic_api/responses/compact"])
async def test_codex_remote_compaction_is_a_400_naming_the_setting(registry: SessionRegistry, path: str) -> None:
    """docs/client-quirks.md#codex-compaction: a clear answer, not a bare 404."""
    app = create_app(registry, ScriptedHandler())
    body = {"model": "m", "input": [{"role": "user", "content": "hi"}], "instructions": "x"}
    async with open_session(registry) as session:
        status, payload, _ = await post(app, path, body, token=session.session_id)
        assert status == 400 and payload["error"]["type"] == "invalid_request_error"
        assert payload["error"]["message"].startswith(f"POST {path} is not supported: remote compaction")
        assert "model_provider = \"relaxtrio\"" in payload["error"]["message"]
        assert "examples/codex" in payload["error"]["message"]
        for kind in ("compaction_trigger", "compaction"):
            items = [{"role": "user", "content": "hi"}, {"type": kind, "encrypted_content": "x"}]
            status, payload, _ = await post(app, RESPONSES, {"model": "m", "input": items}, token=session.session_id)
            assert status == 400 and payload["error"]["param"] == "input[1].type"
            assert "[model_providers.relaxtrio]" in payload["error"]["message"]


async def test_plain_function_tools_sharing_a_name_are_still_served(registry: SessionRegistry) -> None:
    """Only a namespace's tools must be unique (their name alone finds their namespace)."""
    status, answer, _ = await _turn(registry, RESPONSES, {"model": "m", "input": "hi", "tools": [SHELL, SHELL]})
    assert status == 200, answer
