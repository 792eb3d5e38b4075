"""parse_session_output: the agent's output file rules (docs/export-and-credit.md#the-output-file)."""

from __future__ import annotations

import json
import logging

import pytest

from relaxtrio import ExportError
from relaxtrio.forest import ExportRecord, SessionOutput, parse_session_output

MSGS = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def _record(**fields) -> str:
    return json.dumps({"name": "main", "messages": MSGS, **fields})


@pytest.mark.parametrize("text", [None, "", "  \n\t \n"])
def test_missing_or_blank_output_is_implicit(text) -> None:
    output = parse_session_output(text)
    assert output == SessionOutput() and output.is_implicit
    assert output.metadata == {} and output.reward is None


def test_object_without_messages_carries_metadata_and_reward(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        output = parse_session_output('{"metadata": {"task_success": 1.0}, "reward": 1, "extra": 2}')
    assert output.is_implicit and output.metadata == {"task_success": 1.0} and output.reward == 1.0
    assert isinstance(output.reward, float)
    assert "extra" in caplog.text
    assert parse_session_output('{"reward": {"score": 0.5, "format": 1}}').reward == {
        "score": 0.5,
        "format": 1,
    }
    assert parse_session_output('{"reward": null}').reward is None
    assert parse_session_output("{}").metadata == {}


def test_object_with_messages_is_one_explicit_record() -> None:
    output = parse_session_output(
        _record(metadata={"role": "main"}, reward=0.5, chat_template_kwargs={"enable_thinking": False})
    )
    (record,) = output.records
    assert not output.is_implicit
    assert isinstance(record, ExportRecord)
    assert record.name == "main" and record.messages == tuple(MSGS)
    assert record.tools == () and record.template_kwargs == {"enable_thinking": False}
    assert record.metadata == {"role": "main"} and record.reward == 0.5


def test_jsonl_records_are_canonicalized(caplog: pytest.LogCaptureFixture) -> None:
    second = {
        "name": "searcher_0",
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "q", "name": "x"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"b": 1, "a": 2.0}'},
                    }
                ],
            },
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}, "strict": True}}],
        "unknown": 1,
    }
    with caplog.at_level(logging.WARNING):
        output = parse_session_output(_record() + "\n\n" + json.dumps(second) + "\n")
    assert [r.name for r in output.records] == ["main", "searcher_0"]
    record = output.records[1]
    assert record.messages[2]["tool_calls"][0]["function"]["arguments"] == '{"a":2,"b":1}'
    assert record.messages[1] == {"role": "user", "content": "q"}
    assert record.tools == ({"type": "function", "function": {"name": "f", "parameters": {}}},)
    assert record.reward is None and record.metadata == {}
    assert "unknown" in caplog.text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            json.dumps([json.loads(_record())]),
            "Session output explicit records must be written as JSONL, not a JSON array",
        ),
        ("[]", "Session output explicit records must be written as JSONL, not a JSON array"),
        ('"just a string"', "Session output must be a JSON object or JSONL records, got string"),
        ("42", "Session output must be a JSON object or JSONL records, got integer"),
        (_record() + "\nnot json", "Session output line 2 is not valid JSON: Expecting value"),
        (_record() + "\n[1]", "Session output record (line 2) must be a JSON object, got array"),
        ('{"metadata": []}', "Session output 'metadata' must be a JSON object"),
        ('{"reward": "high"}', "Session output 'reward' must be null, number, or JSON object, got string"),
        ('{"reward": true}', "Session output 'reward' must be null, number, or JSON object, got boolean"),
        ('{"reward": NaN}', "Session output 'reward' must be a finite number, got nan"),
        ('{"reward": Infinity}', "Session output 'reward' must be a finite number, got inf"),
        ('{"reward": 1e999}', "Session output 'reward' must be a finite number, got inf"),
        ('{"reward": {"score": NaN}}', "Session output 'reward': reward.score numbers must be finite"),
        (_record() + '\n{"name": "x"}', "Session output record (line 2) must include 'messages'"),
        (json.dumps({"messages": MSGS}), "Session output record must include non-empty string 'name'"),
        (
            json.dumps({"name": "", "messages": MSGS}),
            "Session output record must include non-empty string 'name'",
        ),
        (
            json.dumps({"name": 3, "messages": MSGS}),
            "Session output record must include non-empty string 'name'",
        ),
        (
            _record() + "\n" + _record(),
            "Session output record name must be unique within one explicit export: 'main'",
        ),
        (_record(metadata=[1]), "Session output record 'main': 'metadata' must be a JSON object"),
        (
            _record(reward=False),
            "Session output record 'main': 'reward' must be null, number, or JSON object, got boolean",
        ),
        (
            _record(reward=[1]),
            "Session output record 'main': 'reward' must be null, number, or JSON object, got array",
        ),
        (
            _record() + "\n" + json.dumps({"name": "b", "messages": MSGS, "reward": float("inf")}),
            "Session output record (line 2) 'b': 'reward' must be a finite number, got inf",
        ),
    ],
)
def test_rejections(text: str, message: str) -> None:
    with pytest.raises(ExportError) as caught:
        parse_session_output(text)
    assert caught.value.message == message


@pytest.mark.parametrize(
    ("record", "message", "param"),
    [
        (
            {"messages": [{"role": "user", "content": ""}]},
            "Session output record 'main': messages[0].content must not be empty",
            "messages[0].content",
        ),
        (
            {
                "messages": [
                    {"type": "message", "role": "user", "content": "hi"},
                    {"type": "function_call", "name": "f"},
                ]
            },
            "Session output record 'main': messages[1] must include role",
            "messages[1].role",
        ),
        (
            {"messages": MSGS, "tools": {"x": 1}},
            "Session output record 'main': tools must be a list, got object",
            "tools",
        ),
        (
            {"messages": MSGS, "chat_template_kwargs": {"tools": []}},
            "Session output record 'main': chat_template_kwargs cannot set reserved keys: tools",
            "chat_template_kwargs",
        ),
    ],
)
def test_record_canonicalization_errors_name_the_field(record: dict, message: str, param: str) -> None:
    with pytest.raises(ExportError) as caught:
        parse_session_output(json.dumps({"name": "main", **record}))
    assert caught.value.message == message
    assert caught.value.param == param
