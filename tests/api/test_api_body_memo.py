"""BodyMemo: decoding only the new part of a repeated body gives exactly ``json.loads``' result."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relaxtrio.api.body_memo import BodyMemo


def _reject(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _same(memo: BodyMemo, raw: bytes) -> Any:
    """memo.loads(raw) equals json.loads(raw) with exact types, or raises the same error."""
    try:
        expected = json.loads(raw, parse_constant=_reject)
    except (ValueError, RecursionError) as exc:
        with pytest.raises(type(exc)) as info:
            memo.loads(raw)
        assert str(info.value) == str(exc)
        return None
    got = memo.loads(raw)
    assert json.dumps(got) == json.dumps(expected)  # key order and types (1 vs 1.0 vs true)
    assert got == expected
    return got


def _body(messages: list[Any], **extra: Any) -> bytes:
    return json.dumps({"model": "m", "messages": messages, **extra}).encode()


def test_a_growing_history_reuses_its_parsed_messages() -> None:
    memo = BodyMemo(_reject)
    messages: list[dict[str, str]] = [{"role": "system", "content": "s"}]
    previous: list[Any] = []
    for turn in range(5):
        messages = [*messages, {"role": "user", "content": f"u{turn}"}]
        got = _same(memo, _body(messages, stream=False))
        # The repeated messages are the previous body's objects, not copies.
        assert all(a is b for a, b in zip(got["messages"], previous, strict=False))
        previous = got["messages"]
        messages = [*messages, {"role": "assistant", "content": f"a{turn}"}]
    assert memo.num_reused == 2 + 4 + 6 + 8


def test_changed_bodies_decode_like_json_loads() -> None:
    memo = BodyMemo(_reject)
    base = [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}]
    _same(memo, _body(base))
    _same(memo, _body([base[0], {"role": "assistant", "content": "edited"}]))  # last one edited
    _same(memo, _body([{"role": "user", "content": "u0"}, *base]))  # first one changed
    _same(memo, json.dumps({"model": "other", "messages": base}).encode())  # head changed
    _same(memo, json.dumps({"messages": base, "model": "m", "tools": []}).encode())  # key order
    _same(memo, json.dumps({"messages": base}, indent=2).encode())  # whitespace
    _same(memo, b'{"messages": [1, 2]}')
    _same(memo, b'{"messages": [12, 2]}')  # a number element that goes on: not reused
    _same(memo, b'{"messages": [1.5, 2]}')
    _same(memo, b'{"messages": [1, 2], "messages": [3]}')  # a repeated key: the last wins
    _same(memo, b'{"messages": null, "messages": [3]}')
    _same(memo, b'{"messages": [1, 2], "model": NaN}')  # same error as json.loads
    _same(memo, b'{"messages": [1, 2,]}')
    _same(memo, b'{"messages": [1, 2]} x')
    _same(memo, b'{"messages": [1, 2]')
    _same(memo, b'{"input": [{"type": "message"}], "instructions": "i"}')
    _same(memo, b'{"input": [{"type": "message"}, {"type": "x"}], "instructions": "i"}')
    _same(memo, b'{"input": "text"}')
    _same(memo, b'{}')
    _same(memo, b'[]')
    _same(memo, b'{"messages": ["\xed\xa0\x80"]}')  # a lone surrogate passes, as in json.loads
    _same(memo, b'{"messages": ["\xff"]}')
    _same(memo, '{"messages": ["é"]}'.encode("utf-16"))
    _same(memo, b"\xef\xbb\xbf" + _body(base))
    _same(memo, _body(base))


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-3, 30), st.floats(allow_nan=False),
                  st.text(alphabet='ab"\\ \u00e9\n', max_size=3))
_value = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(["role", "content", "x"]), inner, max_size=3),
                      max_leaves=6)


@given(st.lists(st.tuples(st.lists(_value, max_size=4), st.integers(0, 8), st.booleans(),
                          st.sampled_from(["messages", "input", "other"])), min_size=1, max_size=6),
       st.data())
def test_any_body_sequence_decodes_like_json_loads(steps: list[tuple[list, int, bool, str]],
                                                   data: st.DataObject) -> None:
    memo = BodyMemo(_reject)
    previous: list[Any] = []
    for extra, keep, spaced, key in steps:
        history = [*previous[:keep], *extra]
        body = {"model": "m", key: history, "stream": spaced}
        raw = json.dumps(body, separators=(", ", ": ") if spaced else (",", ":")).encode()
        _same(memo, raw)
        previous = history
        # The same body broken at one place (usually invalid; then the same error).
        at = data.draw(st.integers(0, len(raw)))
        _same(memo, raw[:at] + data.draw(st.sampled_from([b",", b"]", b"}", b'"', b"1", b" ", b""]))
              + raw[at + data.draw(st.integers(0, 2)):])


def test_two_interleaved_conversations_each_resume_from_their_own_body() -> None:
    memo = BodyMemo(_reject)
    main = [{"role": "user", "content": f"m{i}"} for i in range(100)]
    title = [{"role": "system", "content": "title"}, {"role": "user", "content": "m0"}]
    for turn in range(3):
        main = [*main, {"role": "user", "content": f"next {turn}"}]
        before = memo.num_reused
        _same(memo, _body(main))
        if turn:
            assert memo.num_reused - before == len(main) - 1
        _same(memo, _body(title))


def test_bodies_that_never_repeat_fall_back_to_json_loads() -> None:
    memo = BodyMemo(_reject)
    for turn in range(12):
        history = [{"role": "user", "content": f"{turn} {i}"} for i in range(80)]
        _same(memo, json.dumps({"request": turn, "messages": history}).encode())
    assert memo.num_reused == 0


def _messages_body(messages: list[Any]) -> bytes:
    return json.dumps({"model": "claude", "max_tokens": 64, "messages": messages,
                       "system": [{"type": "text", "text": "be brief"}]}).encode()


def test_messages_requests_project_only_their_new_entries() -> None:
    from relaxtrio import InvalidRequestError
    from relaxtrio.api.messages import parse_messages_request
    from relaxtrio.api.session_memo import SessionMemo
    from relaxtrio.forest import state_hash

    memo = SessionMemo(BodyMemo(_reject))
    body_memo = memo.body

    def check(messages: list[Any]) -> None:
        raw = _messages_body(messages)
        try:
            expected = parse_messages_request(json.loads(raw))
        except InvalidRequestError as exc:
            with pytest.raises(InvalidRequestError) as info:
                parse_messages_request(body_memo.loads(raw), memo)
            assert (info.value.message, info.value.param) == (exc.message, exc.param)
            return
        got = parse_messages_request(body_memo.loads(raw), memo)
        assert got.turn.conversation.messages == expected.turn.conversation.messages
        assert state_hash(got.turn.conversation) == state_hash(expected.turn.conversation)

    cached = {"type": "text", "text": "q0", "cache_control": {"type": "ephemeral"}}
    history: list[Any] = [{"role": "user", "content": [cached]}]
    check(history)
    for turn in range(1, 4):
        tool_use = {"type": "tool_use", "id": f"c{turn}", "name": "f", "input": {"n": turn, "ok": True}}
        last = {**history[-1], "content": [{"type": "text", "text": b["text"]} if b is cached else b
                                           for b in history[-1]["content"]]}  # marker dropped
        history = [*history[:-1], last, {"role": "assistant", "content": [tool_use]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"c{turn}",
                                                 "content": "done"}, cached]}]
        reused, extended = body_memo.num_reused, memo.canonical.num_extended
        check(history)  # the cache marker moved to the new last message
        assert body_memo.num_reused - reused == len(history) - 3  # all but the changed last one
        assert memo.canonical.num_extended == extended + 1  # the projection of the rest is unchanged
    check([*history, {"role": "user", "content": []}])  # invalid: the same error
    check([*history, {"role": "system", "content": "late"}, {"role": "user", "content": "u"}])
    check([history[0], {"role": "assistant", "content": "changed"}, *history[2:]])
    assert isinstance(memo.elements.raw, list) and len(memo.elements.raw) == len(history)


def test_responses_requests_project_only_after_their_last_clean_item() -> None:
    from relaxtrio import InvalidRequestError
    from relaxtrio.api.responses import parse_responses_request
    from relaxtrio.api.session_memo import SessionMemo
    from relaxtrio.forest import state_hash

    memo = SessionMemo(BodyMemo(_reject))
    body_memo = memo.body

    def check(items: list[Any]) -> None:
        raw = json.dumps({"model": "codex", "instructions": "be brief", "input": items}).encode()
        try:
            expected = parse_responses_request(json.loads(raw))
        except InvalidRequestError as exc:
            with pytest.raises(InvalidRequestError) as info:
                parse_responses_request(body_memo.loads(raw), memo)
            assert (info.value.message, info.value.param) == (exc.message, exc.param)
            return
        got = parse_responses_request(body_memo.loads(raw), memo)
        assert got.turn.conversation.messages == expected.turn.conversation.messages
        assert state_hash(got.turn.conversation) == state_hash(expected.turn.conversation)

    items: list[Any] = [{"type": "message", "role": "user", "content": "fix it"}]
    check(items)
    for turn in range(3):
        call = {"type": "function_call", "call_id": f"c{turn}", "name": "sh", "arguments": "{}"}
        items = [*items, {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]}]
        check(items)  # ends inside an assistant turn: its accumulated state is not reused
        items = [*items, call]
        check(items)
        extended, projected = memo.canonical.num_extended, memo.elements.messages[0]
        items = [*items, {"type": "function_call_output", "call_id": f"c{turn}", "output": "ok"}]
        check(items)
        assert memo.canonical.num_extended == extended + 1
        assert memo.elements.messages[0] is projected  # taken from the memo, not projected again
    check([*items, {"type": "message", "role": "assistant", "content": []}])  # invalid: same error
    check([*items, {"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "done"}]}, {"type": "message", "role": "user", "content": "more"}])
    check(items[:3] + items[4:])  # an item removed
    assert len(memo.elements.raw) == len(items) - 1


def _utf8_body(messages: list[Any]) -> bytes:
    return json.dumps({"model": "m", "messages": messages}, ensure_ascii=False).encode()


def _history(num: int, text: str = "content") -> list[dict[str, str]]:
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": f"{text} {i}"} for i in range(num)]


@pytest.mark.parametrize("text", ["plain", "d\u00e9j\u00e0 \u4e2d\u6587 \U0001f600"])
def test_a_body_changed_by_one_byte_in_the_middle_reuses_only_what_precedes_it(text: str) -> None:
    memo = BodyMemo(_reject)
    history = _history(40, text)
    raw = _utf8_body(history)
    _same(memo, raw)
    at = raw.index(f"{text} 20".encode()) + len(f"{text} ".encode())  # message 20's "2"
    changed = raw[:at] + b"X" + raw[at + 1:]
    before = memo.num_reused
    got = _same(memo, changed)
    assert memo.num_reused - before == 20  # messages 0-19 only: the byte is in message 20
    assert got["messages"][20]["content"] != history[20]["content"]
    # The next body extends the changed one (not the first): all 40 reused.
    before = memo.num_reused
    _same(memo, changed[:-2] + b', {"role": "user", "content": "more"}]}')
    assert memo.num_reused - before == 40


def test_bytes_that_break_utf8_or_json_in_the_middle_fail_like_json_loads() -> None:
    memo = BodyMemo(_reject)
    raw = _utf8_body(_history(30, "caf\u00e9"))
    _same(memo, raw)
    at = raw.index("caf\u00e9 15".encode()) + 3  # the first byte of the two-byte é
    _same(memo, raw[:at] + b"\xff" + raw[at + 1:])  # invalid UTF-8 inside message 15
    _same(memo, raw[:at + 1] + raw[at + 2:])  # half a character
    _same(memo, raw[:at] + b'"' + raw[at + 1:])  # a JSON syntax error
    _same(memo, raw[:-2] + b', {"role": "user", "content": "\xc3"}]}')  # invalid in the new tail
    before = memo.num_reused
    _same(memo, raw[:-2] + b', {"role": "user", "content": "ok"}]}')  # still resumes from raw
    assert memo.num_reused - before == 30


def test_shorter_equal_and_truncated_bodies_decode_like_json_loads() -> None:
    memo = BodyMemo(_reject)
    history = _history(50, "\u00e9t\u00e9")
    _same(memo, _utf8_body(history))
    before = memo.num_reused
    _same(memo, _utf8_body(history[:20]))  # a shorter history (a title request, a compaction)
    assert memo.num_reused - before == 20
    before = memo.num_reused
    _same(memo, _utf8_body(history))  # the same body again (a retry)
    assert memo.num_reused - before == 50
    raw = _utf8_body(history)
    for cut in (len(raw) - 1, len(raw) - 3, len(raw) // 2, 12):
        _same(memo, raw[:cut])  # a body cut short: json.loads' error
    _same(memo, bytearray(raw))  # not bytes: json.loads itself


def test_every_new_element_offset_is_exact_after_multibyte_text() -> None:
    memo = BodyMemo(_reject)
    history: list[Any] = [{"role": "system", "content": "\u00e9"}]
    for turn in range(30):
        history.append({"role": "user", "content": "\u4e2d" * (turn % 4) + f"{turn}"})
        history.append({"role": "assistant", "content": "\U0001f600" * (turn % 3) + "a"})
        before = memo.num_reused
        _same(memo, json.dumps({"messages": history}, ensure_ascii=False).encode())
        assert memo.num_reused - before == len(history) - 2 or turn == 0
