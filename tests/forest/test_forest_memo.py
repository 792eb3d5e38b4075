"""ConversationMemo: reusing a Session's repeated messages gives exactly ``from_wire``'s result."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relaxtrio import InvalidRequestError
from relaxtrio.forest import Conversation, ConversationMemo, SessionForest, state_hash

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _same(conv: Conversation, expected: Conversation) -> None:
    assert conv.messages == expected.messages
    assert conv._message_json == expected._message_json and conv._suffix == expected._suffix
    assert state_hash(conv) == state_hash(expected)
    assert conv.tools == expected.tools and conv.template_kwargs == expected.template_kwargs


def _check(memo: ConversationMemo, messages: Any, tools: Any = None, kwargs: Any = None) -> None:
    try:
        expected = Conversation.from_wire(copy.deepcopy(messages), tools, kwargs)
    except InvalidRequestError as exc:
        with pytest.raises(InvalidRequestError) as info:
            memo.conversation(messages, tools, kwargs)
        assert (info.value.message, info.value.param) == (exc.message, exc.param)
        return
    _same(memo.conversation(messages, tools, kwargs), expected)


def test_a_growing_chat_reuses_its_history() -> None:
    memo = SessionForest("s").memo
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for turn in range(6):
        messages = [*messages, {"role": "user", "content": f"q{turn}"}]
        _check(memo, messages, TOOLS, {"enable_thinking": False})
        messages = [*messages, {"role": "assistant", "content": f"a{turn}",
                                "tool_calls": [{"id": "c", "type": "function",
                                                "function": {"name": "f", "arguments": "{}"}}]}]
    assert memo.num_reused == sum(2 * t for t in range(6))


def test_edits_late_system_messages_and_invalid_messages() -> None:
    memo = ConversationMemo()
    base = [{"role": "system", "content": "s1"}, {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"}]
    _check(memo, base)
    _check(memo, [*base, {"role": "system", "content": "late"}, {"role": "user", "content": "u2"}])
    _check(memo, [base[0], {"role": "user", "content": "edited"}, base[2]])  # an edit mid-history
    _check(memo, [*base, {"role": "robot", "content": "x"}])  # invalid: same error
    _check(memo, [*base, {"role": "user", "content": "\ud800"}])  # not UTF-8: same error
    _check(memo, base)  # the failed requests left the memo usable
    _check(memo, [{"role": "system", "content": [{"type": "text", "text": "p1"},
                                                 {"type": "text", "text": "p2"}]}, base[1]])
    _check(memo, None)
    _check(memo, ())


def test_numbers_and_booleans_are_never_reused_by_python_equality() -> None:
    memo = ConversationMemo()
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
    first = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    _check(memo, first)
    flipped = copy.deepcopy(first)
    flipped[1]["tool_calls"][0]["function"]["arguments"] = {"x": True}  # == {"x": 1} in Python
    _check(memo, flipped)
    assert memo.num_reused == 1  # the user message only


_text = st.text(alphabet="ab \u00e9", min_size=1, max_size=4)
_message = st.one_of(
    st.builds(lambda r, c: {"role": r, "content": c}, st.sampled_from(["user", "assistant", "system", "tool"]), _text),
    st.builds(lambda c: {"role": "user", "content": [{"type": "text", "text": c}]}, _text),
    st.builds(lambda n: {"role": "user", "content": n}, st.integers(0, 2)),  # invalid content
)


@given(st.lists(st.lists(_message, max_size=6), min_size=1, max_size=5), st.data())
def test_any_request_sequence_equals_from_wire(histories: list[list[dict]], data: st.DataObject) -> None:
    memo = ConversationMemo()
    previous: list[dict] = []
    for extra in histories:
        keep = data.draw(st.integers(0, len(previous)))
        messages = [*copy.deepcopy(previous[:keep]), *extra]
        _check(memo, messages)
        previous = messages
