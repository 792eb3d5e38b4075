"""Canonical messages, tools and template kwargs (docs/canonical-contract.md)."""

from __future__ import annotations

import copy
import math

import pytest
from tests.forest.forest_testlib import SEARCH_TOOL, assistant, tool_call, tool_result, user

from relaxtrio import InvalidRequestError
from relaxtrio.forest import (
    Conversation,
    canonical_arguments,
    canonical_message,
    canonical_messages,
    canonical_template_kwargs,
    canonical_tools,
)


def _reject(fn, *args, message: str, param: str, **kwargs) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        fn(*args, **kwargs)
    assert caught.value.message == message
    assert caught.value.param == param
    assert caught.value.http_status == 400


# -- accepted shapes --------------------------------------------------------------------------


def test_roles_content_and_kept_keys() -> None:
    wire = [
        {"role": "user", "content": "hi", "name": "bob", "extra": {"x": 1}},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "think",
            "refusal": None,
            "annotations": [],
            "tool_calls": [tool_call("c1", "search", '{"q": "x"}')],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "(no output)", "name": "search"},
        {"role": "assistant", "content": "done", "reasoning_content": ""},
        {
            "role": "user",
            "content": "thanks",
            "tool_call_id": "zz",
            "tool_calls": [{"bad": 1}],
            "reasoning_content": "r",
        },
    ]
    assert canonical_messages(wire) == (
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "think",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q":"x"}'}}
            ],
        },
        {"role": "tool", "content": "(no output)", "tool_call_id": "c1"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "thanks", "reasoning_content": "r"},
    )


def test_assistant_may_omit_content_only_with_tool_calls_or_reasoning() -> None:
    assert canonical_messages([{"role": "assistant", "reasoning_content": "r"}]) == (
        {"role": "assistant", "content": "", "reasoning_content": "r"},
    )
    assert (
        canonical_messages([{"role": "assistant", "content": "", "tool_calls": [tool_call("a", "f", "{}")]}])[
            0
        ]["content"]
        == ""
    )
    _reject(
        canonical_messages,
        [{"role": "assistant", "content": ""}],
        message="messages[0].content must not be empty",
        param="messages[0].content",
    )
    _reject(
        canonical_messages,
        [{"role": "assistant", "tool_calls": []}],
        message="messages[0] must include content",
        param="messages[0].content",
    )
    _reject(
        canonical_messages,
        [{"role": "assistant", "content": None, "reasoning_content": ""}],
        message="messages[0].content must not be empty",
        param="messages[0].content",
    )


def test_list_content_is_kept_verbatim() -> None:
    parts = [
        {"type": "text", "text": "Compare "},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}},
        {"type": "input_audio", "input_audio": {"data": "AAA", "format": "wav"}},
    ]
    (message,) = canonical_messages([{"role": "user", "content": parts}])
    assert message == {"role": "user", "content": parts}


def test_leading_system_messages_merge_and_late_ones_stay_in_place() -> None:
    late_parts = [
        {"type": "text", "text": "second"},
        {"type": "image_url", "image_url": {}},
        {"type": "text", "text": "third"},
    ]
    wire = [
        {"role": "system", "content": "zero"},
        {"role": "system", "content": "first"},
        user("u1"),
        assistant("a1"),
        {"role": "system", "content": late_parts},
        {"role": "system", "content": "fourth"},
        user("u2"),
        {"role": "system", "content": [{"type": "image_url", "image_url": {}}]},
    ]
    assert canonical_messages(wire) == (
        {"role": "system", "content": "zero\n\nfirst"},
        user("u1"),
        assistant("a1"),
        {"role": "system", "content": "second\n\nthird\n\nfourth"},
        user("u2"),
    )


def test_a_late_system_message_keeps_the_earlier_canonical_form() -> None:
    # Codex adds a developer (→ system) message when a resumed thread changes its sandbox.
    turn_1 = [{"role": "system", "content": "codex"}, user("u1"), assistant("a1")]
    turn_2 = [*turn_1, {"role": "system", "content": "sandbox: workspace-write"}, user("u2")]
    assert canonical_messages(turn_2)[:3] == canonical_messages(turn_1)


def test_tool_call_arguments_become_compact_sorted_json() -> None:
    spellings = [
        '{"c": "d", "a": 1.0, "n": {"y": [1.0, 2.5, true], "x": null}}',
        '{"a":1,"c":"d","n":{"x":null,"y":[1,2.5,true]}}',
        {"n": {"x": None, "y": [1, 2.5, True]}, "c": "d", "a": 1.0},
    ]
    canonical = {canonical_arguments(s, param="p") for s in spellings}
    assert canonical == {'{"a":1,"c":"d","n":{"x":null,"y":[1,2.5,true]}}'}
    assert canonical_arguments('{"city": "北京"}', param="p") == '{"city":"北京"}'
    assert canonical_arguments('{"big": 9007199254740993.0}', param="p") == '{"big":9007199254740992.0}'
    assert canonical_arguments('{"neg": -9007199254740991.0}', param="p") == '{"neg":-9007199254740991}'
    assert canonical_arguments("{}", param="p") == "{}"


def test_tool_call_is_rebuilt_in_the_nested_function_shape() -> None:
    (message,) = canonical_messages(
        [
            {
                "role": "assistant",
                "content": "x",
                "tool_calls": [
                    {"index": 0, "function": {"arguments": "{}", "name": "f", "extra": 1}},
                    {"id": "c", "type": "function", "function": {"arguments": {"k": 2.0}}},
                ],
            }
        ]
    )
    assert message["tool_calls"] == [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "c", "type": "function", "function": {"arguments": '{"k":2}'}},
    ]


def test_tools_are_normalized_to_the_nested_function_shape() -> None:
    tools = [
        {
            "type": "function",
            "function": {"name": "a", "parameters": {"type": "object"}, "description": None, "strict": True},
        },
        {"type": "function", "function": {"name": "b", "description": "B", "parameters": {"type": "object"}}},
        {"type": "custom", "name": "c"},
        {"name": "flat", "parameters": {}},
        {"type": "function", "function": "not a dict"},
        {"type": "function", "function": {"name": "no_params"}},
    ]
    assert canonical_tools(tools) == (
        {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "b", "parameters": {"type": "object"}, "description": "B"}},
        {"type": "function", "function": {"name": "no_params", "parameters": None}},
    )
    assert canonical_tools(None) == ()


def test_template_kwargs_are_sorted_recursively_and_merged_over_base() -> None:
    kwargs = canonical_template_kwargs(
        {"z": [{"b": 1, "a": 2}], "enable_thinking": True}, base={"enable_thinking": False, "m": 1}
    )
    assert kwargs == {"enable_thinking": True, "m": 1, "z": [{"a": 2, "b": 1}]}
    assert list(kwargs) == ["enable_thinking", "m", "z"]
    assert list(kwargs["z"][0]) == ["a", "b"]
    assert canonical_template_kwargs(None) == {}


def test_from_wire_is_idempotent_and_equal_means_same_state() -> None:
    conv = Conversation.from_wire(
        [
            {"role": "system", "content": "s"},
            user("u"),
            assistant("", tool_calls=[tool_call("c", "search", '{"q": 1.0}')]),
            tool_result("c", "r"),
        ],
        [SEARCH_TOOL],
        {"b": {"y": 1, "x": 2}},
    )
    again = Conversation.from_wire(list(conv.messages), list(conv.tools), conv.template_kwargs)
    assert again == conv and hash(again) == hash(conv)
    assert again.messages == conv.messages
    other = Conversation.from_wire([user("u")])
    assert other != conv
    assert Conversation.from_wire([user("u")], None, None) == Conversation(
        ({"role": "user", "content": "u"},)
    )


def test_normalization_never_mutates_or_aliases_its_input() -> None:
    wire_messages = [
        {"role": "system", "content": [{"type": "text", "text": "sys"}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "u"}}],
        },
        {"role": "assistant", "content": None, "tool_calls": [tool_call("c", "search", {"q": [1, 2]})]},
        tool_result("c", "r"),
    ]
    wire_tools = [copy.deepcopy(SEARCH_TOOL)]
    wire_kwargs = {"nested": {"b": [1], "a": {"x": 1}}}
    snapshot = copy.deepcopy((wire_messages, wire_tools, wire_kwargs))
    conv = Conversation.from_wire(wire_messages, wire_tools, wire_kwargs)
    assert (wire_messages, wire_tools, wire_kwargs) == snapshot
    # Mutating the input afterwards must not reach the canonical values, and vice versa.
    wire_messages[1]["content"][1]["image_url"]["url"] = "changed"
    wire_tools[0]["function"]["parameters"]["properties"]["query"]["type"] = "integer"
    wire_kwargs["nested"]["b"].append(2)
    assert conv.messages[1]["content"][1]["image_url"]["url"] == "u"
    assert conv.tools[0]["function"]["parameters"]["properties"]["query"]["type"] == "string"
    assert conv.template_kwargs["nested"]["b"] == [1]
    conv.messages[1]["content"].append({"type": "text", "text": "x"})
    assert len(wire_messages[1]["content"]) == 2


def test_param_prefix_for_other_protocols() -> None:
    _reject(
        Conversation.from_wire,
        [{"role": "developer", "content": "x"}],
        messages_param="input",
        message="input[0].role must be one of: assistant, system, tool, user",
        param="input[0].role",
    )
    _reject(
        Conversation.from_wire,
        [user("x")],
        "nope",
        tools_param="body.tools",
        message="body.tools must be a list, got string",
        param="body.tools",
    )


def test_canonical_message_rejects_system() -> None:
    _reject(
        canonical_message,
        {"role": "system", "content": "s"},
        message="message.role must not be system here",
        param="message.role",
    )


# -- every rejection: exact message and field path ---------------------------------------------

MESSAGE_ERRORS = [
    ("x", "messages must be a list, got string", "messages"),
    (["x"], "messages[0] must be an object, got string", "messages[0]"),
    ([{"content": "x"}], "messages[0] must include role", "messages[0].role"),
    ([{"role": 1, "content": "x"}], "messages[0].role must be a string, got integer", "messages[0].role"),
    (
        [{"role": "developer", "content": "x"}],
        "messages[0].role must be one of: assistant, system, tool, user",
        "messages[0].role",
    ),
    ([user("a"), {"role": "user"}], "messages[1] must include content", "messages[1].content"),
    ([{"role": "user", "content": None}], "messages[0].content must not be empty", "messages[0].content"),
    ([{"role": "user", "content": ""}], "messages[0].content must not be empty", "messages[0].content"),
    ([{"role": "system", "content": ""}], "messages[0].content must not be empty", "messages[0].content"),
    ([{"role": "user", "content": []}], "messages[0].content must not be empty", "messages[0].content"),
    (
        [{"role": "user", "content": 3}],
        "messages[0].content must be a list, string, or None, got integer",
        "messages[0].content",
    ),
    (
        [{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}],
        "messages[0].content[1] must be an object, got string",
        "messages[0].content[1]",
    ),
    (
        [{"role": "user", "content": [{"type": "text", "text": ""}]}],
        "messages[0].content[0].text must not be empty",
        "messages[0].content[0].text",
    ),
    (
        [{"role": "user", "content": [{"type": "x", "score": math.nan}]}],
        "messages[0].content[0].score numbers must be finite",
        "messages[0].content[0].score",
    ),
    (
        [{"role": "user", "content": [{"type": "x", "v": {1, 2}}]}],
        "messages[0].content[0].v must contain only JSON values, got set",
        "messages[0].content[0].v",
    ),
    (
        [{"role": "assistant", "content": "x", "reasoning_content": 5}],
        "messages[0].reasoning_content must be a string, got integer",
        "messages[0].reasoning_content",
    ),
    (
        [{"role": "tool", "content": "x", "tool_call_id": ""}],
        "messages[0].tool_call_id must be a non-empty string",
        "messages[0].tool_call_id",
    ),
    (
        [{"role": "tool", "content": "x", "tool_call_id": None}],
        "messages[0].tool_call_id must be a non-empty string",
        "messages[0].tool_call_id",
    ),
    ([{"role": "user", "content": "\ud800"}], "messages[0] must be valid UTF-8 text", "messages[0]"),
]

CALL = "messages[1].tool_calls[0]"
TOOL_CALL_ERRORS = [
    ({"id": "c"}, f"{CALL}.function must be an object, got null", f"{CALL}.function"),
    ("call", f"{CALL} must be an object, got string", CALL),
    ({"id": "", "function": {"arguments": "{}"}}, f"{CALL}.id must be a non-empty string", f"{CALL}.id"),
    ({"type": "custom", "function": {"arguments": "{}"}}, f'{CALL}.type must be "function"', f"{CALL}.type"),
    (
        {"function": {"name": 3, "arguments": "{}"}},
        f"{CALL}.function.name must be a string, got integer",
        f"{CALL}.function.name",
    ),
    (
        {"function": {"arguments": "{bad"}},
        f"{CALL}.function.arguments must be valid JSON",
        f"{CALL}.function.arguments",
    ),
    (
        {"function": {"arguments": '{"a": 1, "a": 2}'}},
        f"{CALL}.function.arguments contains duplicate key: a",
        f"{CALL}.function.arguments",
    ),
    (
        {"function": {"arguments": '{"a": {"b": 1, "b": 1}}'}},
        f"{CALL}.function.arguments contains duplicate key: b",
        f"{CALL}.function.arguments",
    ),
    (
        {"function": {"arguments": '{"a": NaN}'}},
        f"{CALL}.function.arguments contains non-finite number: NaN",
        f"{CALL}.function.arguments",
    ),
    (
        {"function": {"arguments": '{"a": -Infinity}'}},
        f"{CALL}.function.arguments contains non-finite number: -Infinity",
        f"{CALL}.function.arguments",
    ),
    (
        {"function": {"arguments": '{"a": 1e999}'}},
        f"{CALL}.function.arguments.a numbers must be finite",
        f"{CALL}.function.arguments",
    ),
    (
        {"function": {"arguments": "[1, 2]"}},
        f"{CALL}.function.arguments must be a JSON object or a JSON string encoding an object, got array",
        f"{CALL}.function.arguments",
    ),
    (
        {"function": {"arguments": None}},
        f"{CALL}.function.arguments must be a JSON object or a JSON string encoding an object, got null",
        f"{CALL}.function.arguments",
    ),
    (
        {"function": {"arguments": {1: "x"}}},
        f"{CALL}.function.arguments object keys must be strings",
        f"{CALL}.function.arguments",
    ),
]


@pytest.mark.parametrize(("messages", "message", "param"), MESSAGE_ERRORS)
def test_message_rejections(messages, message: str, param: str) -> None:
    _reject(Conversation.from_wire, messages, message=message, param=param)


@pytest.mark.parametrize(("call", "message", "param"), TOOL_CALL_ERRORS)
def test_tool_call_rejections(call, message: str, param: str) -> None:
    messages = [user("q"), {"role": "assistant", "content": "", "tool_calls": [call]}]
    _reject(Conversation.from_wire, messages, message=message, param=param)


def test_tool_calls_must_be_a_list() -> None:
    _reject(
        Conversation.from_wire,
        [{"role": "assistant", "content": "x", "tool_calls": {"id": "c"}}],
        message="messages[0].tool_calls must be a list, got object",
        param="messages[0].tool_calls",
    )


@pytest.mark.parametrize(
    ("tools", "message", "param"),
    [
        ({"type": "function"}, "tools must be a list, got object", "tools"),
        (["search"], "tools[0] must be an object, got string", "tools[0]"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"maximum": math.inf}}}],
            "tools[0].function.parameters.maximum numbers must be finite",
            "tools[0].function.parameters.maximum",
        ),
    ],
)
def test_tool_rejections(tools, message: str, param: str) -> None:
    _reject(Conversation.from_wire, [user("x")], tools, message=message, param=param)


@pytest.mark.parametrize(
    ("kwargs", "message", "param"),
    [
        ([], "chat_template_kwargs must be an object, got array", "chat_template_kwargs"),
        ("", "chat_template_kwargs must be an object, got string", "chat_template_kwargs"),
        (
            {"tools": [], "add_generation_prompt": True, "ok": 1},
            "chat_template_kwargs cannot set reserved keys: add_generation_prompt, tools",
            "chat_template_kwargs",
        ),
        (
            {"tokenize": False},
            "chat_template_kwargs cannot set reserved keys: tokenize",
            "chat_template_kwargs",
        ),
        ({"x": math.nan}, "chat_template_kwargs.x numbers must be finite", "chat_template_kwargs.x"),
        ({"x": {1: 2}}, "chat_template_kwargs.x object keys must be strings", "chat_template_kwargs.x"),
        (
            {"x": {1, 2}},
            "chat_template_kwargs.x must contain only JSON values, got set",
            "chat_template_kwargs.x",
        ),
    ],
)
def test_template_kwargs_rejections(kwargs, message: str, param: str) -> None:
    _reject(Conversation.from_wire, [user("x")], None, kwargs, message=message, param=param)


def test_reserved_keys_are_rejected_in_base_kwargs_too() -> None:
    _reject(
        Conversation.from_wire,
        [user("x")],
        None,
        {},
        base_template_kwargs={"tools": []},
        message="chat_template_kwargs cannot set reserved keys: tools",
        param="chat_template_kwargs",
    )


def test_errors_are_value_errors_with_param() -> None:
    with pytest.raises(ValueError, match=r"messages\[0\] must include role"):
        Conversation.from_wire([{}])
