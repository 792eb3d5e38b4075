"""The state hash: goldens, key-order independence, array-order sensitivity, determinism."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from tests.forest.forest_testlib import forest_settings, reference_hash
from hypothesis import given
from hypothesis import strategies as st

from relaxtrio.forest import Conversation, state_hash

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {
            "properties": {
                "city": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"], "type": "string"},
            },
            "required": ["city"],
            "type": "object",
        },
        "description": "Get weather",
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "clock",
        "parameters": {"properties": {"city": {"type": "string"}}, "required": ["city"], "type": "object"},
    },
}
NO_THINKING = {"enable_thinking": False}

# Four canonical cases with pinned hashes (docs/canonical-contract.md#the-state-hash): text, text
# blocks, a tool round trip and images; recomputed by the definition and verified here.
GOLDEN_CASES: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]] = {
    "text": (
        [
            {"role": "system", "content": "You are concise."},
            {"role": "user", "content": "你好"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Use tools when needed."},
        ],
        [
            {
                "type": "function",
                "function": {
                    "name": "search",
                    "parameters": {
                        "properties": {"query": {"type": "string"}},
                        "required": ["query"],
                        "type": "object",
                    },
                },
            }
        ],
        NO_THINKING,
    ),
    "text_blocks": ([{"role": "user", "content": "What is 2 + 3?"}], [], NO_THINKING),
    "tool_round_trip": (
        [
            {"role": "user", "content": "Weather and time in 北京?"},
            {
                "role": "assistant",
                "content": "I'll check both.",
                "tool_calls": [
                    {
                        "id": "call_weather",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city":"北京","unit":"celsius"}'},
                    },
                    {
                        "id": "call_time",
                        "type": "function",
                        "function": {"name": "clock", "arguments": '{"city":"北京"}'},
                    },
                ],
            },
            {"role": "tool", "content": "18°C", "tool_call_id": "call_weather"},
            {"role": "tool", "content": "09:30", "tool_call_id": "call_time"},
            {"role": "assistant", "content": "It is 18°C at 09:30."},
        ],
        [WEATHER, CLOCK],
        NO_THINKING,
    ),
    "images": (
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Compare "},
                    {"type": "image_url", "image_url": {"url": "https://example.com/one.png"}},
                    {"type": "text", "text": " with "},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}},
                    {"type": "text", "text": "."},
                ],
            }
        ],
        [],
        NO_THINKING,
    ),
}
GOLDEN_HASHES = {
    "text": "a00bb147c18e3f4adb70a741b72796b5badc929c0593b5066d42ff06c21bcd16",
    "text_blocks": "ec281e76b19fd0ec4ce8c0b295977c5d477bc3de77402d5d02169c99767e00eb",
    "tool_round_trip": "bb620c5313c10d474bc1c9611dd26a622534df79b931c70bf0c42b3ff2499bd2",
    "images": "391f1785a3bc84574ae4ab5b8b241e3e4d06414a888bb636ba7be896011bccd3",
}


def _golden(name: str) -> Conversation:
    return Conversation.from_wire(*copy.deepcopy(GOLDEN_CASES[name]))


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_hashes(name: str) -> None:
    conv = _golden(name)
    assert state_hash(conv) == GOLDEN_HASHES[name]
    assert reference_hash(conv.messages, conv.tools, conv.template_kwargs) == GOLDEN_HASHES[name]


def test_wire_spellings_collapse_to_the_golden_state() -> None:
    messages, tools, kwargs = copy.deepcopy(GOLDEN_CASES["tool_round_trip"])
    messages.insert(0, {"role": "system", "content": "ignored"})
    messages.pop(0)
    messages[1]["tool_calls"][0]["function"]["arguments"] = '{"unit": "celsius", "city": "北京"}'
    messages[1]["tool_calls"][1]["function"]["arguments"] = {"city": "北京"}
    messages[1]["refusal"] = None
    messages[2]["name"] = "weather"
    tools[1]["function"]["description"] = None
    assert state_hash(Conversation.from_wire(messages, tools, kwargs)) == GOLDEN_HASHES["tool_round_trip"]


def _reverse_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reverse_keys(v) for k, v in reversed(list(value.items()))}
    if isinstance(value, list):
        return [_reverse_keys(v) for v in value]
    return value


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_key_order_never_matters(name: str) -> None:
    reordered = Conversation.from_wire(*_reverse_keys(copy.deepcopy(list(GOLDEN_CASES[name]))))
    assert state_hash(reordered) == GOLDEN_HASHES[name]
    assert reordered == _golden(name)


def test_array_order_always_matters() -> None:
    base = GOLDEN_HASHES["tool_round_trip"]
    messages, tools, kwargs = copy.deepcopy(GOLDEN_CASES["tool_round_trip"])

    swapped = copy.deepcopy(messages)
    swapped[2:4] = reversed(swapped[2:4])
    assert state_hash(Conversation.from_wire(swapped, tools, kwargs)) != base
    assert state_hash(Conversation.from_wire(messages, list(reversed(tools)), kwargs)) != base
    calls = copy.deepcopy(messages)
    calls[1]["tool_calls"].reverse()
    assert state_hash(Conversation.from_wire(calls, tools, kwargs)) != base
    enum = copy.deepcopy(tools)
    enum[0]["function"]["parameters"]["properties"]["unit"]["enum"].reverse()
    assert state_hash(Conversation.from_wire(messages, enum, kwargs)) != base

    parts, no_tools, kw = copy.deepcopy(GOLDEN_CASES["images"])
    parts[0]["content"].reverse()
    assert state_hash(Conversation.from_wire(parts, no_tools, kw)) != GOLDEN_HASHES["images"]


def test_tools_and_kwargs_are_part_of_the_hash() -> None:
    messages, tools, kwargs = copy.deepcopy(GOLDEN_CASES["text_blocks"])
    hashes = {
        state_hash(Conversation.from_wire(messages, tools, kwargs)),
        state_hash(Conversation.from_wire(messages, [WEATHER], kwargs)),
        state_hash(Conversation.from_wire(messages, tools, {"enable_thinking": True})),
        state_hash(Conversation.from_wire(messages, tools, {})),
    }
    assert len(hashes) == 4


_SUBPROCESS = """
import json, sys
from relaxtrio.forest import Conversation, state_hash
cases = json.loads(sys.stdin.read())
print(json.dumps({name: state_hash(Conversation.from_wire(*case)) for name, case in cases.items()}))
"""


@pytest.mark.slow
def test_hash_is_independent_of_pythonhashseed() -> None:
    cases = dict(GOLDEN_CASES)
    cases["many_keys"] = (
        [{"role": "user", "content": "x"}],
        [],
        {f"k{i}": {f"n{j}": [j, str(i)] for j in range(12)} for i in range(40)},
    )
    expected = {name: state_hash(Conversation.from_wire(*case)) for name, case in cases.items()}
    for seed in ("0", "1", "4242", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", _SUBPROCESS],
            input=json.dumps(cases),
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=True,
        )
        assert json.loads(done.stdout) == expected


_text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
_json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text
)
_json = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)
_wire_message = st.one_of(
    st.builds(
        lambda r, c: {"role": r, "content": c}, st.sampled_from(["user", "system", "assistant"]), _text
    ),
    st.builds(
        lambda c, a: {
            "role": "assistant",
            "content": c,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": json.dumps(a)}}
            ],
        },
        st.just("") | _text,
        st.dictionaries(_text, _json, max_size=3),
    ),
    st.builds(lambda c: {"role": "tool", "tool_call_id": "c1", "content": c}, _text),
    st.builds(
        lambda parts: {"role": "user", "content": [{"type": "text", "text": t} for t in parts]},
        st.lists(_text, min_size=1, max_size=3),
    ),
)


@forest_settings()
@given(
    messages=st.lists(_wire_message, max_size=6),
    kwargs=st.dictionaries(st.sampled_from(["enable_thinking", "b", "a"]), _json, max_size=3),
    with_tools=st.booleans(),
)
def test_hash_equals_the_reference_definition(messages, kwargs, with_tools: bool) -> None:
    tools = [WEATHER] if with_tools else None
    snapshot = copy.deepcopy((messages, kwargs))
    conv = Conversation.from_wire(messages, tools, kwargs)
    assert (messages, kwargs) == snapshot
    assert state_hash(conv) == reference_hash(conv.messages, conv.tools, conv.template_kwargs)
    again = Conversation.from_wire(
        _reverse_keys(list(conv.messages)), list(conv.tools), _reverse_keys(conv.template_kwargs)
    )
    assert again == conv
    assert state_hash(again) == state_hash(conv)
