"""The official anthropic SDK against the real server, as an agent uses it (base URL unchanged,
``x-api-key`` credential): JSON, streaming, tool_use → tool_result, and thinking blocks."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anthropic
import pytest
import trio
from tests.api.api_helpers import ScriptedHandler, assert_one_lineage, scripted_pipeline, tool_call_text
from tests.support.apps import serve_app
from tests.support.sessions import open_session

from relaxtrio import BackendError
from relaxtrio.api.app import create_app
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.nursery.session import Session, SessionRegistry
from relaxtrio.testing.scripted_engine import Reply

pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(anthropic|httpx2|httpcore2)\.:ResourceWarning")

TOOLS = [{"name": "get_weather", "description": "Weather",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]


@asynccontextmanager
async def served(registry: SessionRegistry, handler: Any) -> AsyncIterator[tuple[anthropic.AsyncAnthropic, Session]]:
    app = create_app(registry, handler)
    with trio.fail_after(30):
        async with serve_app(app) as base_url, open_session(registry) as session:
            client = anthropic.AsyncAnthropic(base_url=base_url, api_key=session.session_id, max_retries=0)
            try:
                yield client, session
            finally:
                await client.close()


def _echo(content: list[Any]) -> list[dict[str, Any]]:
    """What an agent sends back: the SDK blocks as plain dicts."""
    return [block.model_dump(exclude_none=True) for block in content]


async def test_messages_json_tool_use_thinking_round_trip(registry: SessionRegistry, compiler: ChatCompiler) -> None:
    handler, engine = scripted_pipeline(compiler, [
        Reply(text="<think>Need data.</think>Checking." + tool_call_text("get_weather", {"city": "Bern", "days": 2.0})),
        Reply(text="<think>Got it.</think>Cold in Bern."),
    ])
    async with served(registry, handler) as (client, session):
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Bern?"}]
        first = await client.messages.create(model="claude-x", max_tokens=200, system="Be brief.",
                                             messages=messages, tools=TOOLS,
                                             thinking={"type": "enabled", "budget_tokens": 100},
                                             extra_body={"temperature": 0.5, "top_k": 3})
        assert first.stop_reason == "tool_use" and first.model == "claude-x"
        assert [block.type for block in first.content] == ["thinking", "text", "tool_use"]
        thinking, text, tool_use = first.content
        assert thinking.thinking == "Need data." and thinking.signature.startswith("sig_")
        assert text.text == "Checking."
        assert tool_use.input == {"city": "Bern", "days": 2}  # canonical arguments: integral float → int
        assert tool_use.id == session.forest.leaves()[0].message["tool_calls"][0]["id"]
        assert first.usage.input_tokens == len(engine.calls[0][0])
        assert first.usage.output_tokens == len(session.forest.leaves()[0].token_ids)
        messages.append({"role": "assistant", "content": _echo(first.content)})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_use.id, "content": [{"type": "text", "text": "-5 C"}]}]})
        second = await client.messages.create(model="claude-x", max_tokens=200, system="Be brief.",
                                              messages=messages, tools=TOOLS,
                                              thinking={"type": "enabled", "budget_tokens": 100})
        assert second.stop_reason == "end_turn"
        assert [(b.type, getattr(b, "text", None)) for b in second.content] == [("thinking", None),
                                                                               ("text", "Cold in Bern.")]
        assert_one_lineage(session, responses=2)
        root = session.forest.subtree_root(session.forest.leaves()[0])
        assert root.template_kwargs == {"enable_thinking": True}


async def test_messages_stream_tool_use_then_text(registry: SessionRegistry, compiler: ChatCompiler) -> None:
    handler, _ = scripted_pipeline(compiler, [
        Reply(text="<think>Plan.</think>" + tool_call_text("get_weather", {"city": "Kyiv"})),
        Reply(text="Warm.", finish="length"),
    ])
    async with served(registry, handler) as (client, session):
        messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Kyiv?"}]}]
        async with client.messages.stream(model="c", max_tokens=200, messages=messages, tools=TOOLS) as stream:
            events = [event.type async for event in stream]
            first = await stream.get_final_message()
        assert events[0] == "message_start" and events[-1] == "message_stop"
        assert first.stop_reason == "tool_use"
        assert [block.type for block in first.content] == ["thinking", "tool_use"]
        assert first.content[1].input == {"city": "Kyiv"}
        assert first.content[0].signature.startswith("sig_")
        assert first.usage.output_tokens > 0
        messages.append({"role": "assistant", "content": _echo(first.content)})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[1].id,
                                                      "content": "20 C"}]})
        async with client.messages.stream(model="c", max_tokens=2, messages=messages, tools=TOOLS) as stream:
            second = await stream.get_final_message()
        assert second.stop_reason == "max_tokens" and second.usage.output_tokens == 2
        assert_one_lineage(session, responses=2)


async def test_the_sdk_retries_an_empty_reply_into_one_lineage(registry: SessionRegistry,
                                                               compiler: ChatCompiler) -> None:
    """Anthropic's SDK retries a 500 unless told not to; an empty reply allows it."""
    handler, engine = scripted_pipeline(compiler, [Reply(text=""), Reply(text="Bern.")])
    async with served(registry, handler) as (client, session):
        reply = await client.with_options(max_retries=1).messages.create(
            model="claude-x", max_tokens=50, messages=[{"role": "user", "content": "Capital?"}])
        assert [block.text for block in reply.content] == ["Bern."]
        assert len(engine.calls) == 2
        assert_one_lineage(session, responses=1)


async def test_messages_errors_reach_the_sdk_as_typed_exceptions(registry: SessionRegistry,
                                                                 compiler: ChatCompiler) -> None:
    handler, _ = scripted_pipeline(compiler, [])
    async with served(registry, handler) as (client, session):
        with pytest.raises(anthropic.BadRequestError) as bad:
            await client.messages.create(model="c", max_tokens=5, messages=[{"role": "user", "content": ""}])
        assert bad.value.body == {"type": "error", "error": {
            "type": "invalid_request_error", "message": "messages[0].content must not be empty"}}
        wrong = anthropic.AsyncAnthropic(base_url=str(client.base_url), api_key="session-unknown", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError):  # Claude Code stops on it, no "bad model"
            await wrong.messages.create(model="c", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        await wrong.close()


@pytest.mark.parametrize("tool", [
    {"type": "bash_20250124", "name": "bash"},
    {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
])
async def test_anthropic_defined_tools_are_a_400_naming_their_type(registry: SessionRegistry, compiler: ChatCompiler,
                                                                   tool: dict[str, Any]) -> None:
    handler, engine = scripted_pipeline(compiler, [Reply(text="unused")])
    async with served(registry, handler) as (client, session):
        messages = [{"role": "user", "content": "List the files."}]
        expected = {"type": "error", "error": {"type": "invalid_request_error", "message": (
            f"tools[1].type {tool['type']!r} is not supported: only custom tools are served (no type, or type "
            '"custom", with name and input_schema); declare the tool as a custom tool with its own '
            "input_schema, or switch off the harness feature that adds it")}}
        with pytest.raises(anthropic.BadRequestError) as bad:
            await client.messages.create(model="c", max_tokens=5, messages=messages, tools=[*TOOLS, tool])
        assert bad.value.body == expected
        with pytest.raises(anthropic.BadRequestError) as streamed:  # refused before the stream opens
            async with client.messages.stream(model="c", max_tokens=5, messages=messages,
                                              tools=[*TOOLS, tool]) as stream:
                await stream.get_final_message()
        assert streamed.value.body == expected
        assert engine.calls == [] and list(session.forest.nodes()) == []  # nothing generated or committed
        # The same request with custom tools only is served.
        reply = await client.messages.create(model="c", max_tokens=5, messages=messages, tools=TOOLS)
        assert reply.content[0].text == "unused"


async def test_server_tools_beside_custom_tools_are_left_out(registry: SessionRegistry, compiler: ChatCompiler) -> None:
    """A harness that adds Anthropic's web search (and MCP servers) to its own tools is served:
    those run on Anthropic's side, so the model is shown the custom tools only, and the Session
    counts what was left out (docs/agent-contract.md#ignored-request-fields)."""
    handler, engine = scripted_pipeline(compiler, [Reply(text="plain"), Reply(text="plain")])
    async with served(registry, handler) as (client, session):
        messages = [{"role": "user", "content": "Find it."}]
        reply = await client.messages.create(model="c", max_tokens=5, messages=messages, tools=TOOLS)
        plain_prompt = engine.calls[0][0]
        reply = await client.messages.create(
            model="c", max_tokens=5, messages=messages, tool_choice={"type": "any"},
            tools=[*TOOLS, {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}],
            extra_body={"mcp_servers": [{"type": "url", "url": "https://example.invalid", "name": "x"}]})
        assert reply.content[0].text == "plain"
        assert engine.calls[1][0] == plain_prompt  # the same prompt: same tools, same history
        assert session.ignored_request_fields == {"tool_choice": 1, "mcp_servers": 1, "tools:web_search_20250305": 1}


async def test_stream_failure_is_an_error_event_the_sdk_raises(registry: SessionRegistry) -> None:
    error = BackendError("engine at 10.0.0.7 died")
    async with served(registry, ScriptedHandler(error=error)) as (client, _):
        with pytest.raises(anthropic.APIStatusError) as info:
            async with client.messages.stream(model="c", max_tokens=5,
                                              messages=[{"role": "user", "content": "x"}]) as stream:
                await stream.get_final_message()
        assert "10.0.0.7" not in str(info.value.body)
        assert info.value.body["error"] == {"type": "api_error",
                                            "message": "Internal error while handling agentic request."}


async def test_a_stop_sequence_hit_is_reported_in_json_and_stream(registry: SessionRegistry,
                                                                 compiler: ChatCompiler) -> None:
    """A turn ended by one of ``stop_sequences`` answers ``stop_reason: "stop_sequence"`` naming
    the string (Anthropic's contract), while an EOS end stays ``end_turn``; the stop text is not
    in the content, so the echo matches the committed node."""
    handler, engine = scripted_pipeline(compiler, [
        Reply(text="Count: 1 2 STOP", stop_string="STOP"),
        Reply(text="3 4 STOP", stop_string="STOP"),
        Reply(text="done"),
    ], reasoning_parser=None)
    async with served(registry, handler) as (client, session):
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Count."}]
        first = await client.messages.create(model="c", max_tokens=50, messages=messages,
                                             stop_sequences=["END", "STOP"])
        assert (first.stop_reason, first.stop_sequence) == ("stop_sequence", "STOP")
        assert [block.text for block in first.content] == ["Count: 1 2 "]
        assert engine.calls[0][1].stop == ["END", "STOP"]
        messages += [{"role": "assistant", "content": _echo(first.content)}, {"role": "user", "content": "More."}]
        async with client.messages.stream(model="c", max_tokens=50, messages=messages,
                                          stop_sequences=["STOP"]) as stream:
            deltas = [event.delta for event in [e async for e in stream] if event.type == "message_delta"]
            second = await stream.get_final_message()
        assert [(d.stop_reason, d.stop_sequence) for d in deltas] == [("stop_sequence", "STOP")]
        assert (second.stop_reason, second.stop_sequence) == ("stop_sequence", "STOP")
        messages += [{"role": "assistant", "content": _echo(second.content)}, {"role": "user", "content": "Again."}]
        third = await client.messages.create(model="c", max_tokens=50, messages=messages, stop_sequences=["STOP"])
        assert (third.stop_reason, third.stop_sequence) == ("end_turn", None)
        assert_one_lineage(session, responses=3)


async def test_a_context_overflow_reads_as_anthropics_prompt_too_long(registry: SessionRegistry,
                                                                      compiler: ChatCompiler) -> None:
    """Harnesses start compaction on Anthropic's own overflow text, so a request past the window
    answers it (JSON and stream alike); the Session counts the overflow until a turn succeeds."""
    handler, engine = scripted_pipeline(compiler, [Reply(text="Short.")], reasoning_parser=None)
    app = create_app(registry, handler)
    long_task = [{"role": "user", "content": "Summarize: " + "the weather in Bern is cold " * 20}]
    with trio.fail_after(30):
        async with serve_app(app) as base_url, open_session(registry, max_context_tokens=64) as session:
            client = anthropic.AsyncAnthropic(base_url=base_url, api_key=session.session_id, max_retries=0)
            bodies = []
            with pytest.raises(anthropic.BadRequestError) as plain:
                await client.messages.create(model="c", max_tokens=50, messages=long_task)
            bodies.append(plain.value.body)
            with pytest.raises(anthropic.BadRequestError) as streamed:
                async with client.messages.stream(model="c", max_tokens=50, messages=long_task) as stream:
                    await stream.get_final_message()
            bodies.append(streamed.value.body)
            for body in bodies:
                assert body["error"]["type"] == "invalid_request_error"
                match = re.fullmatch(r"prompt is too long: (\d+) tokens > (\d+) maximum", body["error"]["message"])
                assert match is not None, body
                assert int(match.group(1)) >= int(match.group(2)) == 64
            assert (session.context_overflows, session.overflowed_last) == (2, True)
            reply = await client.messages.create(model="c", max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
            assert reply.content[0].text == "Short."
            assert (session.context_overflows, session.overflowed_last) == (2, False)
            await client.close()
        assert len(engine.calls) == 1


@pytest.mark.parametrize(("tool", "param"), [
    ({**TOOLS[0], "name": "NotebookEdit", "defer_loading": True}, "tools[1].defer_loading"),
    ({"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"}, "tools[1].type"),
])
async def test_tool_search_is_a_400_naming_enable_tool_search(registry: SessionRegistry, compiler: ChatCompiler,
                                                              tool: dict[str, Any], param: str) -> None:
    """Deferred tools are never rendered (nor dropped) silently (docs/client-quirks.md#claude-code-tool-search)."""
    handler, engine = scripted_pipeline(compiler, [Reply(text="unused")])
    async with served(registry, handler) as (client, _):
        with pytest.raises(anthropic.BadRequestError) as bad:
            await client.messages.create(model="c", max_tokens=5, messages=[{"role": "user", "content": "x"}],
                                         tools=[*TOOLS, tool])
        assert "ENABLE_TOOL_SEARCH=false" in bad.value.body["error"]["message"]
        assert bad.value.body["error"]["message"].startswith(param)
        assert engine.calls == []
