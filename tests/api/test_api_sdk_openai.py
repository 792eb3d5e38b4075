"""The official openai SDK against the real server (hypercorn on 127.0.0.1:0), as an agent uses it.

The real turn pipeline (match → render → generate → parse → commit) runs on a scripted engine so
the model "chooses" tool calls and reasoning; every follow-up request replays the SDK's own
objects, and the forest must show one linear lineage (each echo matched the committed state).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import openai
import pytest
import trio
from tests.api.api_helpers import ScriptedHandler, assert_one_lineage, scripted_pipeline, tool_call_text
from tests.support.apps import serve_app
from tests.support.sessions import open_session

from relaxtrio import ContextLengthExceededError
from relaxtrio.api.app import create_app
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.nursery.session import Session, SessionRegistry
from relaxtrio.testing.scripted_engine import Reply

# The SDK stops reading its SSE event generator at [DONE] without closing it; under trio the
# garbage-collected generator triggers trio's ResourceWarning (an SDK/trio interaction, not ours).
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|httpx2|httpcore2)\.:ResourceWarning")

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather", "parameters": WEATHER,
                    "strict": True}]


@asynccontextmanager
async def served(registry: SessionRegistry, handler: Any) -> AsyncIterator[tuple[openai.AsyncOpenAI, Session]]:
    app = create_app(registry, handler)
    with trio.fail_after(30):
        async with serve_app(app) as base_url, open_session(registry) as session:
            client = openai.AsyncOpenAI(base_url=base_url, api_key=session.session_id, max_retries=0)
            try:
                yield client, session
            finally:
                await client.close()


async def test_chat_json_tools_multi_turn(registry: SessionRegistry, compiler: ChatCompiler) -> None:
    handler, engine = scripted_pipeline(compiler, [
        Reply(text="<think>Need the weather.</think>" + tool_call_text("get_weather", {"city": "Paris"})),
        Reply(text="It is sunny in Paris."),
        Reply(text="Bye!"),
    ])
    async with served(registry, handler) as (client, session):
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You help."},
                                          {"role": "user", "content": "Weather in Paris?"}]
        first = await client.chat.completions.create(model="policy", messages=messages, tools=CHAT_TOOLS,
                                                     temperature=0.3, max_completion_tokens=200)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and first.model == "policy"
        assert choice.message.content is None
        assert choice.message.model_extra["reasoning_content"] == "Need the weather."
        [call] = choice.message.tool_calls
        assert call.function.name == "get_weather" and call.function.arguments == '{"city":"Paris"}'
        committed = session.forest.leaves()[0].message
        assert call.id == committed["tool_calls"][0]["id"] and call.id.startswith("call_")
        assert first.usage.completion_tokens == len(session.forest.leaves()[0].token_ids)
        assert first.usage.prompt_tokens == len(engine.calls[0][0])
        sampling = engine.calls[0][1]  # request temperature/top_p never reach the engine
        assert (sampling.temperature, sampling.top_p, sampling.max_new_tokens) == (1.0, 1.0, 200)
        messages.append(choice.message.model_dump())
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny"})
        second = await client.chat.completions.create(model="policy", messages=messages, tools=CHAT_TOOLS)
        assert second.choices[0].message.content == "It is sunny in Paris."
        assert second.choices[0].finish_reason == "stop"
        messages += [second.choices[0].message.model_dump(), {"role": "user", "content": "Thanks"}]
        third = await client.chat.completions.create(model="policy", messages=messages, tools=CHAT_TOOLS,
                                                     logprobs=True)
        # Client logprobs cover the content tokens only: the sampled EOS is not in content
        # (docs/client-quirks.md#logprobs-of-the-content-only).
        entries = third.choices[0].logprobs.content
        assert [entry.logprob for entry in entries] == [-0.25] * (third.usage.completion_tokens - 1)
        assert "".join(entry.token for entry in entries) == third.choices[0].message.content
        assert_one_lineage(session, responses=3)
        # generation input of turn 2 = turn-1 lineage ids + the new observation, never re-tokenized
        assert engine.calls[1][0][: len(engine.calls[0][0])] == engine.calls[0][0]


async def test_chat_stream_tools_multi_turn(registry: SessionRegistry, compiler: ChatCompiler) -> None:
    handler, _ = scripted_pipeline(compiler, [
        Reply(text="Let me check." + tool_call_text("get_weather", {"city": "Oslo"})),
        Reply(text="Snow."),
    ])
    async with served(registry, handler) as (client, session):
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Oslo?"}]
        for expected_finish in ("tool_calls", "stop"):
            chunks = []
            async with await client.chat.completions.create(
                model="policy", messages=messages, tools=CHAT_TOOLS, stream=True,
                stream_options={"include_usage": False},
            ) as stream:
                async for chunk in stream:
                    chunks.append(chunk)
            [chunk] = chunks  # Buffered SSE: one complete chunk
            assert chunk.usage is not None and chunk.usage.total_tokens > 0
            assert chunk.choices[0].finish_reason == expected_finish
            delta = chunk.choices[0].delta
            message: dict[str, Any] = {"role": "assistant", "content": delta.content}
            if delta.tool_calls:
                assert [c.index for c in delta.tool_calls] == [0]
                message["tool_calls"] = [c.model_dump(exclude={"index"}) for c in delta.tool_calls]
            messages.append(message)
            if delta.tool_calls:
                assert delta.content == "Let me check."
                messages.append({"role": "tool", "tool_call_id": delta.tool_calls[0].id, "content": "-3 C"})
        assert messages[-1]["content"] == "Snow."
        assert_one_lineage(session, responses=2)


async def test_responses_json_function_call_loop(registry: SessionRegistry, compiler: ChatCompiler) -> None:
    handler, _ = scripted_pipeline(compiler, [
        Reply(text="<think>Use the tool.</think>" + tool_call_text("get_weather", {"city": "Rome"})),
        Reply(text="Rome is warm."),
        Reply(text="Ciao", finish="length"),
    ])
    async with served(registry, handler) as (client, session):
        items: list[Any] = [{"role": "user", "content": "Weather in Rome?"}]
        first = await client.responses.create(model="policy", instructions="You help.", input=items,
                                              tools=RESPONSES_TOOLS, reasoning={"effort": "low"})
        assert first.status == "completed"
        assert [item.type for item in first.output] == ["reasoning", "function_call"]
        call = first.output[1]
        assert call.call_id == session.forest.leaves()[0].message["tool_calls"][0]["id"]
        assert call.arguments == '{"city":"Rome"}'
        assert first.output[0].content[0].text == "Use the tool."
        assert [tool.model_dump(exclude_none=True) for tool in first.tools] == RESPONSES_TOOLS
        items += [item.model_dump() for item in first.output]
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "25 C"})
        second = await client.responses.create(model="policy", instructions="You help.", input=items,
                                               tools=RESPONSES_TOOLS, reasoning={"effort": "low"})
        assert second.output_text == "Rome is warm." and second.status == "completed"
        assert second.usage.input_tokens > first.usage.input_tokens
        items += [item.model_dump() for item in second.output]
        items.append({"role": "user", "content": [{"type": "input_text", "text": "Say bye"}]})
        third = await client.responses.create(model="policy", instructions="You help.", input=items,
                                              tools=RESPONSES_TOOLS, reasoning={"effort": "low"},
                                              max_output_tokens=2)
        assert third.status == "incomplete" and third.incomplete_details.reason == "max_output_tokens"
        assert third.usage.output_tokens == 2
        assert_one_lineage(session, responses=3)
        root = session.forest.subtree_root(session.forest.leaves()[0])
        assert root.template_kwargs == {"enable_thinking": True}


async def test_responses_stream_function_call_loop(registry: SessionRegistry, compiler: ChatCompiler) -> None:
    handler, _ = scripted_pipeline(compiler, [
        Reply(text=tool_call_text("get_weather", {"city": "Lima"}) + tool_call_text("get_weather", {"city": "Quito"})),
        Reply(text="Both mild."),
    ])
    async with served(registry, handler) as (client, session):
        items: list[Any] = [{"role": "user", "content": "Weather in Lima and Quito?"}]
        for expected in (["function_call", "function_call"], ["message"]):
            events = []
            async with await client.responses.create(model="policy", input=items, tools=RESPONSES_TOOLS,
                                                     stream=True) as stream:
                async for event in stream:
                    events.append(event)
            assert [e.type for e in events] == ["response.created", *["response.output_item.done"] * len(expected),
                                                "response.completed"]
            assert [e.sequence_number for e in events] == list(range(len(events)))
            final = events[-1].response
            assert [item.type for item in final.output] == expected
            for response in (events[0].response, final):
                assert [tool.model_dump(exclude_none=True) for tool in response.tools] == RESPONSES_TOOLS
            assert [e.item.id for e in events[1:-1]] == [item.id for item in final.output]
            items += [item.model_dump() for item in final.output]
            items += [{"type": "function_call_output", "call_id": item.call_id, "output": "mild"}
                      for item in final.output if item.type == "function_call"]
        assert final.output_text == "Both mild."
        assert_one_lineage(session, responses=2)


async def test_responses_echo_the_tools_as_sent(registry: SessionRegistry, compiler: ChatCompiler) -> None:
    """Hosted tools (left out of the prompt) are echoed too, as OpenAI echoes every entry."""
    handler, _ = scripted_pipeline(compiler, [Reply(text="Hi"), Reply(text="Hi again")])
    sent = [*RESPONSES_TOOLS, {"type": "web_search"},
            {"type": "custom", "name": "apply_patch", "description": "Patch files"}]
    async with served(registry, handler) as (client, _session):
        response = await client.responses.create(model="policy", input="Hi", tools=sent)
        assert [tool.type for tool in response.tools] == ["function", "web_search", "custom"]
        assert [tool.model_dump(exclude_none=True) for tool in response.tools] == sent
        bare = await client.responses.create(model="policy", input="Hi")
        assert bare.tools == []


async def test_the_sdk_retries_an_empty_reply_into_one_lineage(registry: SessionRegistry,
                                                               compiler: ChatCompiler) -> None:
    """The first sample is only a stop token: the SDK's own retry samples again, and the Session
    goes on with one committed answer (docs/agent-contract.md#errors)."""
    handler, engine = scripted_pipeline(compiler, [Reply(text=""), Reply(text="Paris.")])
    async with served(registry, handler) as (client, session):
        reply = await client.with_options(max_retries=1).chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "Capital of France?"}],
            temperature=1.0)
        assert reply.choices[0].message.content == "Paris."
        assert len(engine.calls) == 2
        assert_one_lineage(session, responses=1)


async def test_errors_reach_the_sdk_in_openai_form(registry: SessionRegistry) -> None:
    error = ContextLengthExceededError("This model's maximum context length is 8 tokens.", param="messages")
    async with served(registry, ScriptedHandler(error=error)) as (client, _):
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert bad.value.code == "context_length_exceeded" and bad.value.param == "messages"
        with pytest.raises(openai.BadRequestError) as bad:
            await client.responses.create(model="m", input=[{"type": "function_call", "call_id": "c", "name": "f",
                                                             "arguments": "[]"}])
        assert bad.value.param == "input[0].arguments"
        with pytest.raises(openai.APIError, match="maximum context length"):
            async with await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "x"}], stream=True) as stream:
                async for _ in stream:
                    pass
        async with await client.responses.create(model="m", input="x", stream=True) as stream:
            kinds = [(event.type, getattr(event, "response", None)) async for event in stream]
        assert [kind for kind, _ in kinds] == ["response.created", "response.failed"]
        assert kinds[-1][1].status == "failed" and "maximum context length" in kinds[-1][1].error.message
