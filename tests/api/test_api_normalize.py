"""Golden canonicalization: one conversation in three protocols → one canonical triple and hash.

Also: normalizers never mutate or alias the request body, and each protocol's own projection
rules (docs/agent-contract.md#chat-completions and the sections after it) with their 400s naming
the request path.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest

from relaxtrio import InvalidRequestError
from relaxtrio.api.chat import parse_chat_request
from relaxtrio.api.messages import parse_messages_request
from relaxtrio.api.responses import parse_responses_request
from relaxtrio.api.body_memo import BodyMemo
from relaxtrio.api.session_memo import SessionMemo
from relaxtrio.forest import Conversation, state_hash

PARSERS = {"chat": parse_chat_request, "responses": parse_responses_request, "messages": parse_messages_request}

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
CANONICAL_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather by city",
                                                   "parameters": WEATHER_SCHEMA}}
PNG = "iVBORw0KGgo="


def _anthropic(messages: list, **extra: Any) -> dict:
    return {"model": "claude", "max_tokens": 64, "messages": messages, **extra}


# case → (expected canonical triple, {protocol: request body})
GOLDEN: dict[str, tuple[dict, dict[str, dict]]] = {
    "text_only": (
        {"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}],
         "tools": [], "template_kwargs": {}},
        {
            "chat": {"model": "m", "messages": [{"role": "system", "content": "Be terse."},
                                                {"role": "user", "content": "Hi"}]},
            "responses": {"model": "m", "instructions": "Be terse.", "input": "Hi"},
            "messages": _anthropic([{"role": "user", "content": "Hi"}], system="Be terse."),
        },
    ),
    "text_blocks": (
        {"messages": [{"role": "system", "content": "Be terse.\n\nAnswer in French."},
                      {"role": "user", "content": "Hello there"},
                      {"role": "assistant", "content": "Bonjour"},
                      {"role": "user", "content": "Bye"}],
         "tools": [], "template_kwargs": {}},
        {
            "chat": {"messages": [{"role": "system", "content": "Be terse."},
                                  {"role": "system", "content": "Answer in French."},
                                  {"role": "user", "content": "Hello there"},
                                  {"role": "assistant", "content": "Bonjour"},
                                  {"role": "user", "content": "Bye"}]},
            "responses": {"input": [
                {"type": "message", "role": "system", "content": "Be terse."},
                {"role": "developer", "content": [{"type": "input_text", "text": "Answer in French."}]},
                {"type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": "Hello"}, {"type": "input_text", "text": " there"}]},
                {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                 "content": [{"type": "output_text", "text": "Bonjour", "annotations": []}]},
                {"role": "user", "content": "Bye"}]},
            "messages": _anthropic(
                [{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": " there"}]},
                 {"role": "assistant", "content": [{"type": "text", "text": "Bonjour"}]},
                 {"role": "user", "content": "Bye"}],
                system=[{"type": "text", "text": "Be terse."},
                        {"type": "text", "text": "Answer in French.", "cache_control": {"type": "ephemeral"}}]),
        },
    ),
    # A system/developer message after the first turn stays in place (docs/canonical-contract.md#system-messages).
    "late_system": (
        {"messages": [{"role": "system", "content": "Be terse."},
                      {"role": "user", "content": "Hello there"},
                      {"role": "system", "content": "Answer in French."},
                      {"role": "assistant", "content": "Bonjour"},
                      {"role": "user", "content": "Bye"}],
         "tools": [], "template_kwargs": {}},
        {
            "chat": {"messages": [{"role": "system", "content": "Be terse."},
                                  {"role": "user", "content": "Hello there"},
                                  {"role": "system", "content": "Answer in French."},
                                  {"role": "assistant", "content": "Bonjour"},
                                  {"role": "user", "content": "Bye"}]},
            "responses": {"instructions": "Be terse.", "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello there"}]},
                {"type": "message", "role": "developer",
                 "content": [{"type": "input_text", "text": "Answer in French."}]},
                {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Bonjour", "annotations": []}]},
                {"role": "user", "content": "Bye"}]},
            "messages": _anthropic(
                [{"role": "user", "content": "Hello there"},
                 {"role": "system", "content": [{"type": "text", "text": "Answer in French."}]},
                 {"role": "assistant", "content": [{"type": "text", "text": "Bonjour"}]},
                 {"role": "user", "content": "Bye"}],
                system="Be terse."),
        },
    ),
    "tool_round_trip": (
        {"messages": [{"role": "user", "content": "Weather in Paris?"},
                      {"role": "assistant", "content": "", "tool_calls": [CALL]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
         "tools": [CANONICAL_TOOL], "template_kwargs": {}},
        {
            "chat": {"messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{ "city" : "Paris" }'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
                "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather by city",
                                                            "parameters": WEATHER_SCHEMA}}]},
            "responses": {"input": [
                {"role": "user", "content": "Weather in Paris?"},
                {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
                 "arguments": '{"city": "Paris"}', "status": "completed"},
                {"type": "function_call_output", "call_id": "call_1",
                 "output": [{"type": "input_text", "text": "sun"}, {"type": "input_text", "text": "ny"}]}],
                "tools": [{"type": "function", "name": "get_weather", "description": "Weather by city",
                           "parameters": WEATHER_SCHEMA, "strict": True},
                          {"type": "web_search"}]},
            "messages": _anthropic(
                [{"role": "user", "content": "Weather in Paris?"},
                 {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather",
                                                    "input": {"city": "Paris"}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                               "content": [{"type": "text", "text": "sunny"}]}]}],
                tools=[{"type": "custom", "name": "get_weather", "description": "Weather by city",
                        "input_schema": WEATHER_SCHEMA}]),
        },
    ),
    "reasoning_text_and_call": (
        {"messages": [{"role": "user", "content": "Weather?"},
                      {"role": "assistant", "content": "Checking.", "reasoning_content": "Need a tool.\n\nParis.",
                       "tool_calls": [CALL]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "(none)"},
                      {"role": "assistant", "content": "", "reasoning_content": "Done."}],
         "tools": [], "template_kwargs": {"enable_thinking": True}},
        {
            "chat": {"messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "Checking.", "reasoning_content": "Need a tool.\n\nParis.",
                 "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "(none)"},
                {"role": "assistant", "content": None, "reasoning_content": "Done."}],
                "chat_template_kwargs": {"enable_thinking": True}},
            "responses": {"input": [
                {"role": "user", "content": "Weather?"},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Need a tool."},
                                                                {"type": "summary_text", "text": "Paris."}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
                {"type": "function_call_output", "call_id": "call_1", "output": "(none)"},
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Done."}]}],
                "reasoning": {"effort": "high", "summary": "auto"}},
            "messages": _anthropic(
                [{"role": "user", "content": "Weather?"},
                 {"role": "assistant", "content": [
                     {"type": "thinking", "thinking": "Need a tool.", "signature": "sig_a"},
                     {"type": "thinking", "thinking": "Paris.", "signature": "sig_b"},
                     {"type": "text", "text": "Checking."},
                     {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "(none)"}]},
                 {"role": "assistant", "content": [{"type": "thinking", "thinking": "Done.", "signature": "s"}]}],
                thinking={"type": "enabled", "budget_tokens": 1024}),
        },
    ),
    "images": (
        {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}],
         "tools": [], "template_kwargs": {"enable_thinking": False}},
        {
            "chat": {"messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}],
                "chat_template_kwargs": {"enable_thinking": False}},
            "responses": {"input": [{"role": "user", "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "auto"},
                {"type": "input_image", "image_url": "https://example.com/cat.png"}]}],
                "reasoning": {"effort": "none"}},
            "messages": _anthropic([{"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}]}],
                thinking={"type": "disabled"}),
        },
    ),
}

EXPECTED_HASHES = {  # pinned: a change here changes every Session's state identity
    "images": "2fad0b2795afa0b1505841aea56bcee1ac823d92ec382d88e15e0d950ee923e1",
    "late_system": "74937e5ddf5d57cf81ebee745e7765154642b2bc915bff783a811f6e1d79a3b3",
    "reasoning_text_and_call": "3445e7afe12795ecfbc209978209a30f1fdcd1268e7ea66983c22f03c4a8ecd4",
    "text_blocks": "0238d165dc1182a0dc76302d5526316c244a5d6ad8eeaeb10810c6133e6c9265",
    "text_only": "2f5bbe21d67be9530f4af01a6773884a746c946f315ac159e510f74350128583",
    "tool_round_trip": "c35d8e27c60e956488a743425904581b713b58aaa81fd875b6523622ce4236f4",
}


def _reference_hash(triple: dict) -> str:
    """The state hash written out independently of relaxtrio.forest.

    See docs/canonical-contract.md#the-state-hash.
    """
    text = json.dumps(triple, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _triple(protocol: str, body: dict) -> dict:
    conv = PARSERS[protocol](body).turn.conversation
    return {"messages": list(conv.messages), "tools": list(conv.tools), "template_kwargs": conv.template_kwargs}


@pytest.mark.parametrize("case", sorted(GOLDEN))
@pytest.mark.parametrize("protocol", sorted(PARSERS))
def test_protocol_projects_to_the_golden_triple(case: str, protocol: str) -> None:
    expected, bodies = GOLDEN[case]
    assert _triple(protocol, bodies[protocol]) == expected
    conv = PARSERS[protocol](bodies[protocol]).turn.conversation
    assert state_hash(conv) == _reference_hash(expected) == EXPECTED_HASHES[case]


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_normalizers_neither_mutate_nor_alias_the_body(case: str) -> None:
    for protocol, body in GOLDEN[case][1].items():
        before = copy.deepcopy(body)
        conv = PARSERS[protocol](body).turn.conversation
        assert body == before, f"{protocol} mutated its request body"
        body_ids = _container_ids(body)
        out_ids = _container_ids([list(conv.messages), list(conv.tools), conv.template_kwargs])
        assert not body_ids & out_ids, f"{protocol} canonical output shares objects with the body"
        # mutating the canonical output must not reach the body either
        for message in conv.messages:
            for value in message.values():
                if isinstance(value, list):
                    value.append({"type": "text", "text": "x"})
        assert body == before


def _container_ids(value: Any) -> set[int]:
    ids: set[int] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ids.add(id(item))
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            ids.add(id(item))
            stack.extend(item)
    return ids


def test_turn_limits_stops_and_sampling_fields() -> None:
    base = GOLDEN["text_only"][1]
    chat = parse_chat_request({**base["chat"], "max_tokens": 50, "max_completion_tokens": 9, "stop": ["A", ""],
                               "seed": 3, "logprobs": True, "temperature": 0.1, "top_p": 0.2, "n": 1})
    assert (chat.turn.max_new_tokens, chat.turn.stop, chat.turn.seed, chat.turn.logprobs) == (9, ("A",), 3, True)
    assert parse_chat_request({**base["chat"], "max_tokens": 50}).turn.max_new_tokens == 50
    responses = parse_responses_request({**base["responses"], "max_output_tokens": 12, "temperature": 2.0,
                                         "previous_response_id": "resp_x", "stop": "ignored", "seed": 1})
    assert (responses.turn.max_new_tokens, responses.turn.stop, responses.turn.seed) == (12, (), None)
    assert not responses.turn.logprobs
    messages = parse_messages_request({**base["messages"], "stop_sequences": ["END", "STOP"], "top_k": 5})
    assert (messages.turn.max_new_tokens, messages.turn.stop) == (64, ("END", "STOP"))
    assert {chat.turn.protocol, responses.turn.protocol, messages.turn.protocol} == {"chat", "responses", "messages"}


@pytest.mark.parametrize(("protocol", "patch"), [
    ("chat", {"n": 1, "tool_choice": "auto", "parallel_tool_calls": False, "top_logprobs": 0,
              "stream_options": {"include_usage": True}, "response_format": {"type": "text"},
              "presence_penalty": 0.5, "tools": [{"type": "function", "function": {"name": "f"}}]}),
    ("chat", {"tool_choice": "none", "tools": []}),
    ("responses", {"tool_choice": "auto", "parallel_tool_calls": True, "include": ["reasoning.encrypted_content"],
                   "text": {"verbosity": "medium"}, "top_logprobs": 0, "store": False,
                   "prompt_cache_key": "k"}),
    ("responses", {"tool_choice": "none"}),
    ("messages", {"tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
                  "thinking": {"type": "enabled", "budget_tokens": 1024}, "metadata": {"user_id": "u"},
                  "tools": [{"name": "f", "input_schema": {"type": "object"}}], "mcp_servers": []}),
    ("messages", {"tool_choice": {"type": "none"}}),
    # what Claude Code 2.1.332, Codex 0.169.0 and opencode 1.18.33 sent in the example CLI test
    ("messages", {"thinking": {"type": "adaptive", "display": "omitted"}, "output_config": {"effort": "high"},
                  "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                  "metadata": {"user_id": "{}"}, "max_tokens": 32000, "stream": True}),
    ("responses", {"tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"},
                   "store": False, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
                   "client_metadata": {"x-codex-window-id": "w"}, "stream": True}),
    ("chat", {"max_tokens": 1024, "tool_choice": "auto", "stream": True, "stream_options": {"include_usage": True},
              "tools": [{"type": "function", "function": {"name": "bash"}}]}),
])
def test_options_the_harnesses_send_are_accepted(protocol: str, patch: dict) -> None:
    body = {**GOLDEN["text_only"][1][protocol], **patch}
    assert PARSERS[protocol](body).turn.conversation.messages


@pytest.mark.parametrize(("protocol", "patch", "kwargs"), [
    ("responses", {"reasoning": {"effort": "minimal"}}, {"enable_thinking": True}),
    ("responses", {"reasoning": {"effort": "max"}}, {"enable_thinking": True}),
    ("responses", {"reasoning": {"effort": "turbo"}}, {}),
    ("responses", {"reasoning": {"summary": "auto"}}, {}),
    ("responses", {"reasoning": None}, {}),
    ("messages", {"thinking": {"type": "adaptive"}}, {"enable_thinking": True}),
    ("messages", {"thinking": {"type": "sometimes"}}, {}),
])
def test_thinking_switches(protocol: str, patch: dict, kwargs: dict) -> None:
    body = {**GOLDEN["text_only"][1][protocol], **patch}
    assert PARSERS[protocol](body).turn.conversation.template_kwargs == kwargs


def test_unsupported_content_parts_are_tolerated() -> None:
    responses = parse_responses_request({"input": [
        {"role": "user", "content": "Hi"}, {"type": "message", "role": "user",
                                            "content": [{"type": "input_file", "file_id": "f"},
                                                        {"type": "input_text", "text": "!"}]}]})
    assert list(responses.turn.conversation.messages) == [{"role": "user", "content": "Hi"},
                                                          {"role": "user", "content": "!"}]
    messages = parse_messages_request(_anthropic([{"role": "user", "content": [{"type": "document"},
                                                                               {"type": "text", "text": "Hi"}]}]))
    assert list(messages.turn.conversation.messages) == [{"role": "user", "content": "Hi"}]


def test_reasoning_items_without_readable_text_are_ignored() -> None:
    # Codex replays its reasoning items with only encrypted content when the server sent no text.
    body = {"input": [
        {"role": "user", "content": "Hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "ok"}],
        "include": ["reasoning.encrypted_content"], "tool_choice": "auto", "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"}, "store": False,
        "text": {"format": {"type": "text"}, "verbosity": "low"},
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}
    messages = parse_responses_request(body).turn.conversation.messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["content"] == "Hello" and messages[1]["reasoning_content"] == "think"


_TOOL_TURN = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [CALL]}]

REJECTED = [
    ("chat", {"messages": [{"role": "developer", "content": "x"}]}, "messages[0].role", "must be one of"),
    # Required by the Chat Completions API (the openai SDK's ChatCompletionToolMessageParam).
    ("chat", {"messages": [*_TOOL_TURN, {"role": "tool", "content": "18C"}]}, "messages[2].tool_call_id",
     "messages[2].tool_call_id is required (the id of the assistant tool call it answers)"),
    # A tool result must answer a call of an earlier assistant message (OpenAI and Anthropic refuse it too).
    ("chat", {"messages": [*_TOOL_TURN, {"role": "tool", "tool_call_id": "call_9", "content": "18C"}]},
     "messages[2].tool_call_id",
     "messages[2].tool_call_id 'call_9' answers no tool call of an earlier assistant message"),
    ("chat", {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "Weather?"},
                           {"role": "tool", "tool_call_id": "call_1", "content": "18C"}, _TOOL_TURN[1]]},
     "messages[2].tool_call_id", "'call_1' answers no tool call"),  # the call comes after it
    ("messages", _anthropic([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                             "content": "ok"}]}],
                            system="s"),
     "messages[0].content[0].tool_use_id", "'t' answers no tool call of an earlier assistant message"),
    ("messages", _anthropic([{"role": "user", "content": "x"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": "a"}, {"type": "text", "text": "and"},
        {"type": "tool_result", "tool_use_id": "u", "content": "b"}]}]),
     "messages[2].content[2].tool_use_id", "'u' answers no tool call"),
    # A part type the API does not have reaches the template, which shows the model nothing for it.
    *[("chat", {"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": [
        {"type": "text", "text": "see"}, part]}]}, "messages[1].content[1].type", text)
      for part, text in (({"type": 5}, "must be one of: file, image_url, input_audio, refusal, text, got integer"),
                         ({"type": "bogus"}, "got 'bogus'"), ({"type": None}, "got null"),
                         ({"text": "x"}, "messages[1].content[1].type is required"))],
    ("chat", {"messages": [{"role": "system", "content": [{"type": "input_text", "text": "s"}]}]},
     "messages[0].content[0].type", "got 'input_text'"),
    # a text part without a string text would reach the template as nothing
    *[("chat", {"messages": [{"role": "user", "content": [part]}]}, "messages[0].content[0].text", text)
      for part, text in (({"type": "text"}, "must be a string, got null"),
                         ({"type": "text", "text": 5}, "must be a string, got integer"),
                         ({"type": "text", "text": {"a": 1}}, "must be a string, got object"))],
    ("chat", {"messages": []}, "messages", "messages projected to zero supported messages"),
    ("chat", {}, "messages", "messages is required and must be a list"),
    ("chat", {"messages": None}, "messages", "messages is required and must be a list"),
    ("responses", {"input": []}, "input", "input projected to zero supported messages"),
    ("responses", {"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "got 'tool'"),
    ("messages", _anthropic([{"role": "developer", "content": "x"}]), "messages[0].role", "got 'developer'"),
    ("messages", _anthropic([{"role": "system", "content": []}]), "messages[0].content", "projected to no supported"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "stop": [1]}, "stop", "stop must be a string or list"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "seed": 2**70}, "seed", "seed must be between"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, "max_completion_tokens",
     "max_completion_tokens must be a positive integer"),
    ("responses", {}, "input", "input is required and must be a string or list"),
    # unknown roles and item types next to valid items: a 400 naming them, never dropped
    ("responses", {"input": [{"role": "user", "content": "Hi"}, {"role": "tool", "content": "x"}]},
     "input[1].role", "must be one of: assistant, developer, system, user, got 'tool'"),
    ("responses", {"input": [{"role": "user", "content": "Hi"}, {"type": "message", "content": "x"}]},
     "input[1].role", "got None"),
    ("responses", {"input": [{"role": "user", "content": "Hi"}, {"type": "frobnicate"}]},
     "input[1].type", "'frobnicate' is not supported: it is not a Responses input item type"),
    ("responses", {"input": [{"role": "user", "content": "Hi"}, {"type": 7}]}, "input[1].type", "must be a string"),
    *[("responses", {"input": [{"role": "user", "content": "Hi"}, item]}, "input[1].type",
       f"input[1].type {item['type']!r} is not supported: {why}")
      for item, why in (
          ({"type": "item_reference", "id": "msg_1"}, "it refers to server-side state"),
          ({"type": "compaction", "encrypted_content": "x"}, "remote compaction is not served"),
          ({"type": "web_search_call", "id": "ws", "status": "completed", "action": {"type": "search"}},
           "built-in tool items cannot be replayed"),
          ({"type": "local_shell_call", "id": "ls", "call_id": "c", "status": "completed",
            "action": {"type": "exec", "command": ["ls"], "env": {}}}, "built-in tool items cannot be replayed"),
          ({"type": "mcp_call", "id": "m", "name": "f", "server_label": "s", "arguments": "{}"},
           "built-in tool items cannot be replayed"))],
    ("messages", _anthropic([{"role": "user", "content": "Hi"}, {"role": "tool", "content": "x"},
                             {"role": "user", "content": "more"}]),
     "messages[1].role", "must be one of: assistant, system, user, got 'tool'"),
    ("messages", _anthropic([{"role": "user", "content": "Hi"}, {"content": "x"}]), "messages[1].role", "got None"),
    # malformed options: a 400 naming the field in either mode (test_unhonoured_options_... below)
    ("chat", {"messages": [{"role": "user", "content": "x"}], "n": 0}, "n", "n must be a positive integer"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "n": True}, "n", "n must be a positive integer"),
    # a Chat tool the model cannot be shown would vanish from the prompt: refused, not dropped
    ("chat", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "custom", "custom": {"name": "g"}}]},
     "tools[0].type", "tools[0].type 'custom' is not supported: only function tools"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "flat", "parameters": {}}]},
     "tools[0].type", "tools[0].type None is not supported"),
    ("chat", {"messages": [{"role": "user", "content": "x"}],
              "tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": "f"}]},
     "tools[1].function", "tools[1].function must be an object"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {}}]},
     "tools[0].function.name", "must be a non-empty string"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "tools": ["f"]}, "tools[0]", "must be an object"),
    ("chat", {"messages": [{"role": "user", "content": "x"}],
              "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools[0].function.parameters", "tools[0].function.parameters must be a JSON object"),
    ("chat", {"messages": [{"role": "user", "content": "x"}],
              "tools": [{"type": "function", "function": {"name": "f", "description": 3}}]},
     "tools[0].function.description", "tools[0].function.description must be a string"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": "2"}, "top_logprobs",
     "must be a non-negative integer"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "response_format": "json"}, "response_format",
     "must be an object"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "parallel_tool_calls": "yes"}, "parallel_tool_calls",
     "must be a boolean"),
    ("messages", _anthropic([{"role": "user", "content": "x"}], tool_choice="auto"), "tool_choice",
     "must be an object"),
    ("messages", _anthropic([{"role": "user", "content": "x"}], tool_choice={}), "tool_choice.type", "is required"),
    ("responses", {"input": "x", "text": "plain"}, "text", "must be an object"),
    ("messages", _anthropic([{"role": "user", "content": "x"}], output_config="high"), "output_config", None),
    ("responses", {"input": ""}, "input", "input must not be empty"),
    ("responses", {"input": "x", "instructions": ""}, "instructions", "instructions must be a non-empty string"),
    ("responses", {"input": [3]}, "input[0]", "input[0] must be an object"),
    ("responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text": ""}]}]},
     "input[0].content[0].text", "must be a non-empty string"),
    ("responses", {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
     "input[0].content[0].image_url", "must be a non-empty string"),
    ("responses", {"input": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]},
     "input[1].content", "input[1].content projected to no supported content"),
    ("responses", {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}]},
     "input[0].arguments", "must be a JSON string"),
    ("responses", {"input": [{"role": "user", "content": "x"},
                             {"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]},
     "input[1].arguments", None),
    ("responses", {"input": [{"role": "user", "content": "x"},
                             {"type": "function_call", "call_id": "c", "name": "f", "arguments": '{"a":1,"a":2}'}]},
     "input[1].arguments", "duplicate key"),
    ("responses", {"input": [{"type": "function_call_output", "call_id": "", "output": "x"}]},
     "input[0].call_id", "must be a non-empty string"),
    ("responses", {"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]},
     "input[0].output", None),
    ("responses", {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": []}]},
     "tools[0].parameters", "must be a JSON object"),
    ("responses", {"input": "x", "tools": [{"type": "function", "name": ""}]}, "tools[0].name", None),
    ("responses", {"input": "x", "reasoning": "high"}, "reasoning", "reasoning must be an object"),
    ("responses", {"input": "x", "reasoning": {"effort": 1}}, "reasoning.effort", None),
    ("responses", {"input": "x", "max_output_tokens": "9"}, "max_output_tokens", None),
    ("responses", {"input": [{"role": "user", "content": "x\ud800"}]}, "input[0]", "valid UTF-8"),
    ("messages", {"max_tokens": 5}, "messages", "messages is required and must be a list"),
    ("messages", {"messages": [{"role": "user", "content": "x"}]}, "max_tokens", "max_tokens is required"),
    ("messages", {"max_tokens": True, "messages": [{"role": "user", "content": "x"}]}, "max_tokens", None),
    ("messages", _anthropic([{"role": "user", "content": ""}]), "messages[0].content", "must not be empty"),
    ("messages", _anthropic([{"role": "user", "content": []}]), "messages[0].content",
     "messages[0].content projected to no supported content"),
    ("messages", _anthropic([{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}]),
     "messages[0].content[0].source.type", "is not supported"),
    ("messages", _anthropic([{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "text/plain", "data": "x"}}]}]),
     "messages[0].content[0].source.media_type", None),
    ("messages", _anthropic([{"role": "user", "content": "x"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}]), "messages[1].content[0].input", None),
    ("messages", _anthropic([{"role": "user", "content": "x"}, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": 5}]}]), "messages[1].content[0].thinking", None),
    ("messages", _anthropic([{"role": "user", "content": "x"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {"x": [1, {"y": float("nan")}]}}]}]),
     "messages[1].content[0].input", None),
    ("messages", _anthropic([{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document"}]}]}]),
     "messages[0].content[0].content", "projected to no supported content"),
    ("messages", _anthropic([{"role": "user", "content": "x"}], system=""), "system", None),
    ("messages", _anthropic([{"role": "user", "content": "x"}], stop_sequences="END"), "stop_sequences", None),
    ("messages", _anthropic([{"role": "user", "content": "x"}], thinking={"type": 3}), "thinking.type", None),
    ("messages", _anthropic([{"role": "user", "content": "x"}], tools=[{"name": "f"}]),
     "tools[0].input_schema", None),
    # Anthropic-defined client tools are refused, not dropped (api/messages.py OTHER_TOOL_TYPES_HINT);
    # server tools are left out (UNHONOURED below).
    *[("messages", _anthropic([{"role": "user", "content": "x"}],
                              tools=[{"name": "f", "input_schema": {"type": "object"}}, tool]),
       "tools[1].type", f"tools[1].type {tool['type']!r} is not supported: only custom tools are served")
      for tool in ({"type": "bash_20250124", "name": "bash"},
                   {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
                   {"type": "computer_20250124", "name": "computer", "display_width_px": 1024,
                    "display_height_px": 768},
                   {"type": "function", "name": "f", "input_schema": {"type": "object"}})],
]

# Options asking for what relaxtrio does not do: reported on the parsed request (ignored, or a 400
# under --agentic-strict-request-fields with this message). (protocol, body, param, text)
UNHONOURED = [
    ("chat", {"messages": [{"role": "user", "content": "x"}], "n": 2}, "n", "n must be 1"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 2},
     "top_logprobs", "top_logprobs must be 0"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tool_choice",
     "tool_choice 'required' is not supported"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "none",
              "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice", "'none' is not supported"),
    ("chat", {"messages": [{"role": "user", "content": "x"}],
              "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice", "is not supported"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}},
     "response_format.type", "'json_object' is not supported"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "functions": [{"name": "f"}]}, "functions",
     "send the functions as tools"),
    ("responses", {"input": "x", "tool_choice": "required"}, "tool_choice", "is not supported"),
    ("responses", {"input": "x", "tool_choice": {"type": "function", "name": "f"}}, "tool_choice", None),
    ("responses", {"input": "x", "top_logprobs": 3}, "top_logprobs", "top_logprobs must be 0"),
    ("responses", {"input": "x", "include": ["reasoning.encrypted_content", "message.output_text.logprobs"]},
     "include[1]", "carry no logprobs"),
    ("responses", {"input": "x", "text": {"format": {"type": "json_schema", "name": "a", "schema": {}}}},
     "text.format.type", "'json_schema' is not supported"),
    ("messages", _anthropic([{"role": "user", "content": "x"}], tool_choice={"type": "any"}), "tool_choice.type",
     "tool_choice.type 'any' is not supported"),
    ("messages", _anthropic([{"role": "user", "content": "x"}], tool_choice={"type": "tool", "name": "f"}),
     "tool_choice.type", None),
    ("messages", _anthropic([{"role": "user", "content": "x"}], tool_choice={"type": "none"},
                            tools=[{"name": "f", "input_schema": {"type": "object"}}]), "tool_choice.type",
     "'none' is not supported"),
    ("messages", _anthropic([{"role": "user", "content": "x"}],
                            mcp_servers=[{"type": "url", "url": "https://x", "name": "x"}]), "mcp_servers", None),
    ("messages", _anthropic([{"role": "user", "content": "x"}],
                            output_config={"effort": "low", "format": {"type": "json_schema", "schema": {}}}),
     "output_config.format", "not constrained to a schema"),
    ("messages", _anthropic([{"role": "user", "content": "x"}], output_format={"type": "json_schema", "schema": {}}),
     "output_format", None),
    ("messages", _anthropic([{"role": "user", "content": "x"}],
                            tools=[{"name": "f", "input_schema": {"type": "object"}},
                                   {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]),
     "tools[1].type", "tools[1].type 'web_search_20250305' is not supported: it is a server tool"),
]


@pytest.mark.parametrize(("protocol", "body", "param", "text"), REJECTED)
def test_rejections_name_the_request_path(protocol: str, body: dict, param: str, text: str | None) -> None:
    with pytest.raises(InvalidRequestError) as info:
        PARSERS[protocol](body)
    assert info.value.param == param
    assert info.value.message.startswith(param)
    if text is not None:
        assert text in info.value.message


@pytest.mark.parametrize(("protocol", "body", "param", "text"), UNHONOURED)
def test_unhonoured_options_are_reported_with_the_strict_message(protocol: str, body: dict, param: str,
                                                                 text: str | None) -> None:
    [field] = PARSERS[protocol](body).ignored
    assert field.param == param and field.error().param == param
    assert field.message.startswith(param)
    if text is not None:
        assert text in field.message


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _session_memo() -> SessionMemo:
    return SessionMemo(BodyMemo(_reject_constant))

def test_a_chat_tool_message_needs_its_tool_call_id_through_the_session_memo_too() -> None:
    """A refused request leaves the memo where it was, so resending it is refused again; the id
    stays optional where no protocol requires it (export records, dataset rows)."""
    memo = _session_memo()
    parse_chat_request({"messages": _TOOL_TURN}, memo)
    unnamed = {"messages": [*_TOOL_TURN, {"role": "tool", "content": "18C"}]}
    for _ in range(2):
        with pytest.raises(InvalidRequestError, match=r"^messages\[2\]\.tool_call_id is required") as info:
            parse_chat_request(unnamed, memo)
        assert info.value.param == "messages[2].tool_call_id"
    named = {"messages": [*_TOOL_TURN, {"role": "tool", "content": "18C", "tool_call_id": "call_1"}]}
    assert parse_chat_request(named, memo).turn.conversation.messages[2]["tool_call_id"] == "call_1"
    assert Conversation.from_wire(unnamed["messages"]).messages[2] == {"role": "tool", "content": "18C"}


def test_a_chat_content_part_of_unknown_type_is_refused_through_the_session_memo_too() -> None:
    """Also when only the request's new messages are canonicalized; other sources of messages
    (export records, dataset rows with internal ``image`` parts) keep any part type."""
    memo = _session_memo()
    history = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}, {"role": "assistant", "content": "Hello"}]
    parse_chat_request({"messages": history}, memo)
    bogus = {"messages": [*history, {"role": "user", "content": [{"type": "bogus"}]}]}
    for _ in range(2):
        with pytest.raises(InvalidRequestError) as info:
            parse_chat_request(bogus, memo)
        assert info.value.param == "messages[2].content[0].type"
    assert memo.canonical.num_extended == 0, "the refused request left the memo as it was"
    image = {"type": "image", "image": "a.png"}
    assert Conversation.from_wire([{"role": "user", "content": [image]}]).messages[0]["content"] == [image]


def test_a_tool_result_answering_no_call_is_refused_through_the_session_memo_too() -> None:
    """The check covers the whole history, also when the Session's memo skips its repeated
    messages; a result answering a call made any number of messages earlier is accepted."""
    memo = _session_memo()
    answered = [*_TOOL_TURN, {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
                {"role": "assistant", "content": "18C in Paris"}, {"role": "user", "content": "Again?"}]
    parse_chat_request({"messages": answered}, memo)
    for _ in range(2):
        orphan = {"messages": [*answered, {"role": "tool", "tool_call_id": "call_2", "content": "19C"}]}
        with pytest.raises(InvalidRequestError) as info:
            parse_chat_request(orphan, memo)
        assert info.value.param == "messages[5].tool_call_id"
    late = {"messages": [*answered, {"role": "tool", "tool_call_id": "call_1", "content": "19C"}]}
    assert parse_chat_request(late, memo).turn.conversation.messages[-1]["tool_call_id"] == "call_1"
    anthropic_memo = _session_memo()
    history = [{"role": "user", "content": "x"},
               {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}]
    parse_messages_request(_anthropic(history), anthropic_memo)
    with pytest.raises(InvalidRequestError) as info:
        parse_messages_request(_anthropic([*history, {"role": "assistant", "content": "done"}, {
            "role": "user", "content": [{"type": "tool_result", "tool_use_id": "v", "content": "ok"}]}]),
            anthropic_memo)
    assert info.value.param == "messages[4].content[0].tool_use_id"


def test_the_tool_result_check_scans_only_an_extension_and_never_a_replaced_history() -> None:
    """An extending request's call ids come from the memo's scan (only its new messages are
    read); a request that replaces the history is scanned whole, so a call id that only the
    replaced history made does not count."""
    memo = _session_memo()
    answered = [*_TOOL_TURN, {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
                {"role": "assistant", "content": "18C in Paris"}, {"role": "user", "content": "Again?"}]
    parse_chat_request({"messages": answered}, memo)
    assert memo.tool_scan.num_messages == len(answered) and memo.tool_scan.call_ids == {"call_1"}
    second = [*answered, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_2", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "19C"}]
    parse_chat_request({"messages": second}, memo)
    assert memo.canonical.extended_from == len(answered)
    assert memo.tool_scan.num_messages == len(second) and memo.tool_scan.call_ids == {"call_1", "call_2"}
    # A history that replaces the remembered one (another first user message): call_1 and call_2
    # are not calls of this request, whatever the memo scanned before.
    replaced = [{"role": "system", "content": "s"}, {"role": "user", "content": "Other city?"},
                {"role": "tool", "tool_call_id": "call_2", "content": "19C"}]
    with pytest.raises(InvalidRequestError) as info:
        parse_chat_request({"messages": replaced}, memo)
    assert info.value.param == "messages[2].tool_call_id" and memo.tool_scan is None
    parse_chat_request({"messages": replaced[:2]}, memo)
    assert memo.canonical.extended_from is None and memo.tool_scan.call_ids == set()
    # Another protocol's request (no check) replacing the history drops the scan with it.
    parse_chat_request({"messages": answered}, memo)
    memo.conversation([*replaced[:2], {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"},
                       {"role": "assistant", "content": "c"}])
    assert memo.tool_scan is None


def test_a_responses_function_call_output_must_answer_a_call_of_the_input() -> None:
    """Without previous_response_id the input is the whole history: an output whose call_id
    no function_call made is a 400 naming it; with previous_response_id (only new items may be
    sent) it is accepted as before."""
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    answered = [{"role": "user", "content": "hi"}, call,
                {"type": "function_call_output", "call_id": "c1", "output": "ok"}]
    assert parse_responses_request({"input": answered}).turn.conversation.messages[-1]["tool_call_id"] == "c1"
    orphan = [{"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": "nope", "output": "x"}]
    with pytest.raises(InvalidRequestError) as info:
        parse_responses_request({"input": orphan})
    assert info.value.param == "input[1].call_id" and "'nope' answers no tool call" in info.value.message
    memo = _session_memo()
    parse_responses_request({"input": answered}, memo)
    with pytest.raises(InvalidRequestError) as info:
        parse_responses_request({"input": [*answered, {"type": "function_call_output", "call_id": "c2",
                                                       "output": "y"}]}, memo)
    assert info.value.param == "input[3].call_id"
    assert parse_responses_request({"input": orphan, "previous_response_id": "resp_1"}).turn is not None
