"""Rendering a committed turn in each protocol (docs/agent-contract.md#usage-and-finish-reasons)."""

from __future__ import annotations

import json

import pytest

from tests.api.api_helpers import events, parse_sse
from relaxtrio.api.chat import CHAT
from relaxtrio.api.messages import MESSAGES
from relaxtrio.api.responses import RESPONSES
from relaxtrio.forest import Conversation
from relaxtrio.nursery.turns import TokenLogprob, TurnRequest, TurnResult
from relaxtrio.api.wire import ParsedRequest, dumps, encode_json

CALLS = [{"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}},
         {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]
FULL = {"role": "assistant", "content": "Hi ü", "reasoning_content": "think", "tool_calls": CALLS}
REQUEST = ParsedRequest(turn=TurnRequest(conversation=Conversation.from_wire([{"role": "user", "content": "x"}])),
                        model="m-1")


def result(message: dict, finish: str = "stop", logprobs: tuple[TokenLogprob, ...] | None = None) -> TurnResult:
    return TurnResult(message=message, finish_reason=finish, prompt_tokens=11, completion_tokens=4,
                      request_id="r", state_hash="h", logprobs=logprobs)


@pytest.mark.parametrize(("finish", "chat", "responses", "anthropic"), [
    ("stop", "stop", ("completed", None), "end_turn"),
    ("length", "length", ("incomplete", {"reason": "max_output_tokens"}), "max_tokens"),
    ("tool_calls", "tool_calls", ("completed", None), "tool_use"),
])
def test_finish_reason_mapping(finish: str, chat: str, responses: tuple, anthropic: str) -> None:
    turn = result({"role": "assistant", "content": "x"}, finish)
    assert CHAT.render_json(turn, REQUEST)["choices"][0]["finish_reason"] == chat
    rendered = RESPONSES.render_json(turn, REQUEST)
    assert (rendered["status"], rendered["incomplete_details"]) == responses
    message = MESSAGES.render_json(turn, REQUEST)
    assert (message["stop_reason"], message["stop_sequence"]) == (anthropic, None)


def test_chat_json_and_chunk() -> None:
    logprobs = (TokenLogprob(token="Hi", logprob=-0.5), TokenLogprob(token=" ü", logprob=-1.0))
    body = CHAT.render_json(result(FULL, "tool_calls", logprobs), REQUEST)
    assert body["id"].startswith("chatcmpl_") and body["object"] == "chat.completion" and body["model"] == "m-1"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hi ü", "reasoning_content": "think",
                                             "tool_calls": CALLS}
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}
    assert body["choices"][0]["logprobs"]["content"][1] == {
        "token": " ü", "logprob": -1.0, "bytes": [32, 195, 188], "top_logprobs": []}
    assert CHAT.render_json(result(FULL), REQUEST)["choices"][0]["logprobs"] is None
    stream = CHAT.render_sse(result(FULL, "tool_calls", logprobs), REQUEST)
    assert "Hi ü".encode() in stream  # compact JSON, non-ASCII kept
    frames = events(parse_sse(stream))
    assert [f.data for f in frames][-1] == "[DONE]" and len(frames) == 2
    chunk = frames[0].json()
    assert chunk["object"] == "chat.completion.chunk" and chunk["usage"]["total_tokens"] == 15
    assert [c["index"] for c in chunk["choices"][0]["delta"]["tool_calls"]] == [0, 1]
    assert chunk["choices"][0]["logprobs"] == body["choices"][0]["logprobs"]


def test_responses_items() -> None:
    body = RESPONSES.render_json(result(FULL, "tool_calls"), REQUEST)
    assert body["id"].startswith("resp_") and body["object"] == "response" and body["model"] == "m-1"
    reasoning, message, call_a, call_b = body["output"]
    assert reasoning["id"].startswith("rs_") and reasoning["content"] == [{"type": "reasoning_text", "text": "think"}]
    assert reasoning["summary"] == []
    assert message["id"].startswith("msg_") and message["content"] == [
        {"type": "output_text", "text": "Hi ü", "annotations": []}]
    assert (call_a["type"], call_a["call_id"], call_a["name"], call_a["arguments"]) == (
        "function_call", "call_a", "f", '{"x":1}')
    assert call_a["id"].startswith("fc_") and call_b["call_id"] == "call_b"
    assert body["usage"]["input_tokens"] == 11 and body["usage"]["total_tokens"] == 15
    only_calls = RESPONSES.render_json(result({"role": "assistant", "content": "", "tool_calls": CALLS}), REQUEST)
    assert [item["type"] for item in only_calls["output"]] == ["function_call", "function_call"]
    frames = events(parse_sse(RESPONSES.render_sse(result(FULL, "length"), REQUEST)))
    assert [f.event for f in frames] == ["response.created"] + ["response.output_item.done"] * 4 + [
        "response.incomplete"]
    assert [f.json()["sequence_number"] for f in frames] == list(range(6))
    assert [f.json()["output_index"] for f in frames[1:-1]] == [0, 1, 2, 3]
    assert frames[-1].json()["response"]["output"] == [f.json()["item"] for f in frames[1:-1]]


def test_anthropic_blocks_and_stream() -> None:
    body = MESSAGES.render_json(result(FULL, "tool_calls"), REQUEST)
    assert body["id"].startswith("msg_") and body["type"] == "message" and body["role"] == "assistant"
    thinking, text, tool_a, tool_b = body["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "think"
    assert thinking["signature"].startswith("sig_")
    assert text == {"type": "text", "text": "Hi ü"}
    assert tool_a == {"type": "tool_use", "id": "call_a", "name": "f", "input": {"x": 1}}
    assert body["usage"] == {"input_tokens": 11, "output_tokens": 4}
    frames = events(parse_sse(MESSAGES.render_sse(result(FULL, "tool_calls"), REQUEST)))
    names = [f.event for f in frames]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    start = frames[0].json()["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"] == {
        "input_tokens": 11, "output_tokens": 0}
    assert names[1:-2] == ["content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
                           *["content_block_start", "content_block_delta", "content_block_stop"] * 3]
    assert frames[1].json()["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert frames[3].json()["delta"]["type"] == "signature_delta"
    tool_start = frames[8].json()
    assert tool_start["index"] == 2 and tool_start["content_block"] == {
        "type": "tool_use", "id": "call_a", "name": "f", "input": {}}
    assert frames[9].json()["delta"] == {"type": "input_json_delta", "partial_json": '{"x":1}'}
    assert frames[-2].json() == {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                                 "usage": {"output_tokens": 4}}


def test_reasoning_only_turn_renders_everywhere() -> None:
    turn = result({"role": "assistant", "content": "", "reasoning_content": "only thoughts"})
    assert CHAT.render_json(turn, REQUEST)["choices"][0]["message"] == {
        "role": "assistant", "content": "", "reasoning_content": "only thoughts"}
    assert [i["type"] for i in RESPONSES.render_json(turn, REQUEST)["output"]] == ["reasoning"]
    assert [b["type"] for b in MESSAGES.render_json(turn, REQUEST)["content"]] == ["thinking"]


def test_lone_surrogate_in_an_echoed_model_still_encodes() -> None:
    request = ParsedRequest(turn=REQUEST.turn, model="bad\ud800")
    frames = events(parse_sse(CHAT.render_sse(result({"role": "assistant", "content": "x"}), request)))
    assert json.loads(frames[0].data)["model"] == "bad\ud800"


def test_encode_json_writes_what_json_writes_and_never_fails() -> None:
    payload = {"id": "chatcmpl_1", "content": "é \u2028 \x00 / \\ \"", "n": [1, 2**63 - 1, -3],
               "p": [0.5, -1.25e-05], "ok": True, "none": None, "nested": [{"a": []}]}
    assert json.loads(encode_json(payload)) == payload
    assert encode_json({"a": "é"}) == dumps({"a": "é"}).encode()
    # What orjson refuses goes through json: a lone surrogate, an int past 64 bits, an int key.
    assert json.loads(encode_json({"model": "bad\ud800"})) == {"model": "bad\ud800"}
    assert json.loads(encode_json({"seed": 2**70})) == {"seed": 2**70}
    assert json.loads(encode_json({1: "x"})) == {"1": "x"}
    assert encode_json({"logprob": float("nan")}) == b'{"logprob":null}'  # valid JSON, not NaN
