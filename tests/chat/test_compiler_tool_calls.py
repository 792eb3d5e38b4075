"""Tool-call parsers: hermes/qwen25, qwen3_coder, llama3 goldens.

Malformed blocks and the finish-reason rule: docs/client-quirks.md#malformed-tool-call-blocks,
docs/client-quirks.md#tool-call-finish-reason.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relaxtrio.chat.parsers import (
    TOOL_CALL_PARSERS,
    ParsedToolCall,
    RejectedToolCall,
    parse_tool_calls,
    parse_tool_calls_detailed,
    tool_call_id,
)


def function_tool(name: str, properties: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": properties}}}


TOOLS = [
    function_tool("read", {"path": {"type": "string"}}),
    function_tool("get_weather", {"city": {"type": "string"}}),
    function_tool(
        "search",
        {
            "query": {"type": "string"},
            "limit": {"type": "integer"},
            "score": {"type": "number"},
            "exact": {"type": "boolean"},
            "filters": {"type": "object"},
            "tags": {"type": "array"},
            "note": {"type": ["string", "null"]},
        },
    ),
    function_tool("get_time", {}),
]
READ_A = ParsedToolCall("read", '{"path":"a.py"}')
READ_B = ParsedToolCall("read", '{"path":"b.py"}')


def test_registered_names() -> None:
    assert TOOL_CALL_PARSERS == (
        "deepseekv3", "deepseekv31", "glm45", "gpt-oss", "hermes", "kimi_k2", "llama3", "mistral", "qwen", "qwen25",
        "qwen3_coder", "auto",
    )


# ------------------------------------------------------------------------------------------ hermes

HERMES_GOLDENS = [
    (
        "single",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "",
        [ParsedToolCall("get_weather", '{"city":"Paris"}')],
    ),
    (
        "parallel with text before",
        'Reading both.\n<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read", "arguments": {"path": "b.py"}}\n</tool_call>',
        "Reading both.",
        [READ_A, READ_B],
    ),
    (
        "text after the call is kept",
        '<tool_call>{"name": "read", "arguments": {"path": "a.py"}}</tool_call>\nThen I will summarize.',
        "Then I will summarize.",
        [READ_A],
    ),
    (
        "canonical arguments: sorted, compact, integral floats as ints, unicode kept",
        '<tool_call>\n{"name": "search", "arguments": {"query": "café", "limit": 3.0, "score": 0.5}}\n</tool_call>',
        "",
        [ParsedToolCall("search", '{"limit":3,"query":"café","score":0.5}')],
    ),
    (
        "arguments given as a JSON string, and 'parameters' for 'arguments'",
        '<tool_call>{"name": "read", "arguments": "{\\"path\\": \\"a.py\\"}"}</tool_call>'
        '<tool_call>{"name": "read", "parameters": {"path": "b.py"}}</tool_call>',
        "",
        [READ_A, READ_B],
    ),
    (
        "missing arguments are an empty object (zero-argument tool)",
        '<tool_call>\n{"name": "get_time"}\n</tool_call>',
        "",
        [ParsedToolCall("get_time", "{}")],
    ),
    (
        "a JSON list in one block",
        '<tool_call>[{"name": "read", "arguments": {"path": "a.py"}}, {"name": "read", "arguments": {"path": "b.py"}}]'
        "</tool_call>",
        "",
        [READ_A, READ_B],
    ),
]


@pytest.mark.parametrize("parser", ["hermes", "qwen25", "qwen"])
@pytest.mark.parametrize(("label", "text", "content", "calls"), HERMES_GOLDENS, ids=[g[0] for g in HERMES_GOLDENS])
def test_hermes_goldens(parser: str, label: str, text: str, content: str, calls: list) -> None:
    assert parse_tool_calls(text, parser, TOOLS) == (content, calls)


MALFORMED_BRACE = '<tool_call>\n{"name":"read","arguments":{"path":"a.py"}}}\n</tool_call>'


def test_hermes_malformed_block_stays_in_content_verbatim() -> None:
    """The extra brace makes the only block invalid: nothing is dropped, no call returned."""
    text = MALFORMED_BRACE + "<|im_end|>"
    result = parse_tool_calls_detailed(text, "hermes", TOOLS)
    assert result.content == text
    assert result.calls == ()
    assert result.rejected[0].text == MALFORMED_BRACE
    assert result.rejected[0].reason.startswith("malformed")


def test_hermes_valid_blocks_survive_a_malformed_neighbour() -> None:
    valid = '<tool_call>\n{"name": "read", "arguments": {"path": "b.py"}}\n</tool_call>'
    result = parse_tool_calls_detailed(f"{MALFORMED_BRACE}\n{valid}", "hermes", TOOLS)
    assert result.calls == (READ_B,)
    assert result.content == MALFORMED_BRACE
    assert len(result.rejected) == 1


@pytest.mark.parametrize(
    ("label", "block", "reason"),
    [
        ("duplicate key", '<tool_call>{"name": "read", "arguments": {"path": "a", "path": "b"}}</tool_call>', "dup"),
        ("NaN", '<tool_call>{"name": "search", "arguments": {"score": NaN}}</tool_call>', "NaN"),
        ("arguments not an object", '<tool_call>{"name": "read", "arguments": [1]}</tool_call>', "object"),
        ("no name", '<tool_call>{"arguments": {}}</tool_call>', "name"),
        ("both spellings", '<tool_call>{"name": "read", "arguments": {}, "parameters": {"p": 1}}</tool_call>', "both"),
    ],
)
def test_hermes_malformed_kinds(label: str, block: str, reason: str) -> None:
    good = '<tool_call>{"name": "read", "arguments": {"path": "a.py"}}</tool_call>'
    result = parse_tool_calls_detailed(block + good, "hermes", TOOLS)
    assert result.calls == (READ_A,)
    assert result.content == block
    assert reason in result.rejected[0].reason


def test_unclosed_block_stays_and_does_not_swallow_the_next_one() -> None:
    unclosed = '<tool_call>\n{"name": "read", "arguments": {"path": "x"'
    text = unclosed + '\n<tool_call>{"name": "read", "arguments": {"path": "a.py"}}</tool_call>'
    content, calls = parse_tool_calls(text, "hermes", TOOLS)
    assert calls == [READ_A]
    assert content == unclosed


def test_undeclared_tool_is_left_as_text_everywhere() -> None:
    """The unknown-tool policy: the call-shaped text stays in the content, no call, finish stop."""
    hermes = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    coder = "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>"
    llama = '{"name": "rm_rf", "parameters": {}}'
    for parser, text in (("hermes", hermes), ("qwen3_coder", coder), ("llama3", llama)):
        result = parse_tool_calls_detailed(text, parser, TOOLS)
        assert (result.content, result.calls) == (text, ())
        assert result.rejected == (RejectedToolCall(text, "undeclared tool: rm_rf"),)
    # next to a declared call, only the declared one is taken
    declared = '<tool_call>{"name": "read", "arguments": {"path": "a.py"}}</tool_call>'
    result = parse_tool_calls_detailed(hermes + declared, "hermes", TOOLS)
    assert result.calls == (READ_A,)
    assert result.content == hermes


def test_a_reply_whose_only_call_is_undeclared_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """The agent gets plain text and finish stop; the log says why (no silent downgrade)."""
    import logging

    text = '<tool_call>\n{"name": "apply_patch", "arguments": {"input": "*** Begin Patch"}}\n</tool_call>'
    with caplog.at_level(logging.WARNING, logger="relaxtrio.chat.parsers.tool_calls"):
        result = parse_tool_calls_detailed(text, "hermes", TOOLS)
    assert result.calls == () and result.content == text
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("tool call left in content as text (undeclared tool: apply_patch; declared tools: ")


@pytest.mark.parametrize("parser", TOOL_CALL_PARSERS)
def test_no_tools_or_no_parser_means_no_parsing(parser: str) -> None:
    text = '<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call>'
    assert parse_tool_calls(text, parser, []) == (text, [])
    assert parse_tool_calls(text, None, TOOLS) == (text, [])


def test_unknown_parser_name() -> None:
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        parse_tool_calls("x", "pythonic", TOOLS)


# ------------------------------------------------------------------------------------ qwen3_coder


def coder_block(name: str, **params: str) -> str:
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_qwen3_coder_converts_values_by_schema() -> None:
    text = coder_block(
        "search",
        query="cats  and dogs\nsecond line",
        limit="5",
        score="2",
        exact="True",
        filters='{"lang": "en"}',
        tags="['a', 'b']",
        note="null",
        extra="42",
    )
    content, calls = parse_tool_calls(text, "qwen3_coder", TOOLS)
    assert content == ""
    assert json.loads(calls[0].arguments) == {
        "query": "cats  and dogs\nsecond line",
        "limit": 5,
        "score": 2,
        "exact": True,
        "filters": {"lang": "en"},
        "tags": ["a", "b"],
        "note": None,
        "extra": "42",  # not in the schema: kept as a string
    }


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"limit": "five"}, {"limit": "five"}),  # not an integer: stays a string
        ({"score": "1.50"}, {"score": 1.5}),
        ({"score": "1e3"}, {"score": 1000}),  # a float that is integral is canonicalized to an int
        ({"score": "inf"}, {"score": "inf"}),  # non-finite numbers are not JSON
        ({"exact": "maybe"}, {"exact": "maybe"}),
        ({"filters": "{not json"}, {"filters": "{not json"}),
    ],
)
def test_qwen3_coder_values_that_do_not_fit_stay_strings(params: dict, expected: dict) -> None:
    _, calls = parse_tool_calls(coder_block("search", **params), "qwen3_coder", TOOLS)
    assert json.loads(calls[0].arguments) == expected


def test_qwen3_coder_parallel_and_malformed() -> None:
    good_a = coder_block("read", path="a.py")
    good_b = coder_block("read", path="b.py")
    no_function_end = "<tool_call>\n<function=read>\n<parameter=path>\nc.py\n</parameter>\n</tool_call>"
    stray_text = "<tool_call>\nplease\n<function=read>\n<parameter=path>\nd.py\n</parameter>\n</function>\n</tool_call>"
    text = f"I'll read them.\n{good_a}\n{no_function_end}\n{stray_text}\n{good_b}"
    result = parse_tool_calls_detailed(text, "qwen3_coder", TOOLS)
    assert result.calls == (READ_A, READ_B)
    assert result.content == f"I'll read them.\n\n{no_function_end}\n{stray_text}"
    assert [r.text for r in result.rejected] == [no_function_end, stray_text]


def test_qwen3_coder_tolerates_a_missing_parameter_close() -> None:
    text = "<tool_call>\n<function=search>\n<parameter=query>\nx\n<parameter=limit>\n2\n</function>\n</tool_call>"
    _, calls = parse_tool_calls(text, "qwen3_coder", TOOLS)
    assert calls == [ParsedToolCall("search", '{"limit":2,"query":"x"}')]


# ------------------------------------------------------------------------------------------ llama3


@pytest.mark.parametrize(
    ("label", "text", "content", "calls"),
    [
        ("bare JSON", '{"name": "read", "parameters": {"path": "a.py"}}', "", [READ_A]),
        ("python tag", '<|python_tag|>{"name": "read", "parameters": {"path": "a.py"}}', "", [READ_A]),
        (
            "several separated by ;",
            '<|python_tag|>{"name": "read", "parameters": {"path": "a.py"}};'
            ' {"name": "read", "parameters": {"path": "b.py"}}',
            "",
            [READ_A, READ_B],
        ),
        (
            "text before the tag",
            'Let me check.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}',
            "Let me check.",
            [ParsedToolCall("get_weather", '{"city":"Rome"}')],
        ),
        ("prose is not parsed", "The answer is {probably} 42.", "The answer is {probably} 42.", []),
        ("a JSON answer is not a call", '{"answer": 42}', '{"answer": 42}', []),
        (
            "a bad second call stays as content",
            '{"name": "read", "parameters": {"path": "a.py"}}; {"name": "read", "parameters": {"path": }',
            '{"name": "read", "parameters": {"path": }',
            [READ_A],
        ),
        (
            "text after the calls stays",
            '{"name": "read", "parameters": {"path": "a.py"}} and then I will answer.',
            "and then I will answer.",
            [READ_A],
        ),
    ],
)
def test_llama3_goldens(label: str, text: str, content: str, calls: list) -> None:
    assert parse_tool_calls(text, "llama3", TOOLS) == (content, calls)


# ---------------------------------------------------------------------------------------- call ids


def test_tool_call_id_formula_and_golden() -> None:
    payload = json.dumps(
        {"call_index": 1, "parent_state_hash": "ab" * 32, "token_ids": [5, 6, 7]}, sort_keys=True, separators=(",", ":")
    )
    assert payload == '{"call_index":1,"parent_state_hash":"' + "ab" * 32 + '","token_ids":[5,6,7]}'
    expected = "call_" + hashlib.sha256(payload.encode()).hexdigest()[:24]
    assert tool_call_id("ab" * 32, (5, 6, 7), 1) == expected
    assert tool_call_id("ab" * 32, [5, 6, 7], 1) == "call_9c61c59d6475d0fb05c9e60c"
    assert tool_call_id("ab" * 32, (5, 6, 7), 0) != expected
    assert tool_call_id("cd" * 32, (5, 6, 7), 1) != expected
    assert tool_call_id("ab" * 32, (5, 6, 8), 1) != expected


# -------------------------------------------------------------------------------------- properties

JSON_LEAVES = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=8)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
ARGUMENTS = st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=4)


@settings(max_examples=60, deadline=None)
@given(calls=st.lists(st.tuples(st.sampled_from(["read", "get_weather", "search"]), ARGUMENTS), min_size=1, max_size=3))
def test_hermes_round_trip(calls: list) -> None:
    blocks = [json.dumps({"name": name, "arguments": args}, ensure_ascii=False) for name, args in calls]
    text = "\n".join(f"<tool_call>\n{block}\n</tool_call>" for block in blocks)
    content, parsed = parse_tool_calls(text, "hermes", TOOLS)
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in parsed] == calls
    for c in parsed:
        assert c.arguments == json.dumps(json.loads(c.arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@settings(max_examples=60, deadline=None)
@given(
    values=st.dictionaries(
        st.sampled_from(["query", "note", "free"]),
        st.text(alphabet=st.characters(blacklist_characters="<"), max_size=20).filter(lambda v: v.lower() != "null"),
        min_size=1,
    )
)
def test_qwen3_coder_string_round_trip(values: dict) -> None:
    _, parsed = parse_tool_calls(coder_block("search", **values), "qwen3_coder", TOOLS)
    assert json.loads(parsed[0].arguments) == values


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=60))
def test_text_without_call_markup_is_untouched(text: str) -> None:
    for parser in ("hermes", "qwen3_coder"):
        if "<tool_call>" not in text:
            assert parse_tool_calls(text, parser, TOOLS) == (text, [])
    if not text.lstrip().startswith(("{", "[")) and "<|python_tag|>" not in text:
        assert parse_tool_calls(text, "llama3", TOOLS) == (text, [])
