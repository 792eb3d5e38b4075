"""ConversationMemo: reusing a Session's repeated messages gives exactly ``from_wire``'s result."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from tests.forest.forest_testlib import Driver, forest_settings, reference_match
from hypothesis import example, given
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
    memo = ConversationMemo()
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


# -- the extension path: a request that starts with the whole previous request ----------------

def _session(memo: ConversationMemo, forest: SessionForest, drive: Driver, messages: list[dict]) -> Any:
    """One request through the memo: its conversation equals from_wire's, its match the naive
    loop's; commits its observation and a reply (the next request echoes it)."""
    conv = memo.conversation(messages)
    _same(conv, Conversation.from_wire(copy.deepcopy(messages)))
    match = forest.match(conv)
    expected_parent, expected_delta = reference_match(forest, conv)
    assert match.parent is expected_parent and match.delta == expected_delta
    parent = match.parent
    if match.delta:
        parent = forest.add_observation(match, token_ids=drive.ids(2))
    return drive.respond(parent, {"role": "assistant", "content": f"a{len(messages)}"})


def _grown(history: list[dict], reply: Any, text: str) -> list[dict]:
    return [*copy.deepcopy(history), {"role": "assistant", "content": reply.message["content"]},
            {"role": "user", "content": text}]


def test_an_extended_request_canonicalizes_only_its_new_messages() -> None:
    forest = SessionForest("s")
    memo, drive = ConversationMemo(), Driver(forest)
    history = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q0"}]
    reply = _session(memo, forest, drive, history)
    for turn in range(1, 6):
        history = _grown(history, reply, f"q{turn}")
        reused_before = memo.num_reused
        reply = _session(memo, forest, drive, history)
        assert memo.num_reused - reused_before == len(history) - 2  # all but the new two
    assert memo.num_extended == 5
    # The whole history was committed once: one observation and one response per turn.
    assert len(forest) == 12 and len(forest.leaves()) == 1


@pytest.mark.parametrize("change", ["edit", "remove", "call_id", "role", "late_system_end"])
def test_a_changed_earlier_message_leaves_the_extension_path(change: str) -> None:
    forest = SessionForest("s")
    memo, drive = ConversationMemo(), Driver(forest)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history = [{"role": "system", "content": "s"}, {"role": "user", "content": "q0"},
               {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": "same text"}]
    reply = _session(memo, forest, drive, history)
    history = _grown(history, reply, "q1")
    _session(memo, forest, drive, history)
    extended = memo.num_extended
    changed = copy.deepcopy(history)
    if change == "edit":
        changed[1]["content"] = "q0, edited"
    elif change == "remove":
        del changed[1]
    elif change == "call_id":
        changed[2]["tool_calls"][0]["id"] = "c2"
        changed[3]["tool_call_id"] = "c2"
    elif change == "role":
        changed[3] = {"role": "user", "content": "same text"}  # same content, another role
    else:  # appending a late system message extends; the next request cannot extend that
        changed.append({"role": "system", "content": "late"})
    _session(memo, forest, drive, changed)
    assert memo.num_extended == extended + (change == "late_system_end")
    # A branch: the changed request did not continue the committed lineage.
    assert len(forest.leaves()) == 2
    if change == "late_system_end":
        # The next system message merges into that late one (the reuse path places it).
        merged = [*copy.deepcopy(changed), {"role": "system", "content": "later"}]
        _session(memo, forest, drive, merged)
        assert memo.num_extended == extended + 1
        assert memo.conversation(merged).messages[-1] == {"role": "system", "content": "late\n\nlater"}
        grown = [*copy.deepcopy(merged), {"role": "user", "content": "q2"}]
        _session(memo, forest, drive, grown)
        _session(memo, forest, drive, [*copy.deepcopy(grown), {"role": "user", "content": "q3"}])
        assert memo.num_extended == extended + 2


def test_the_extension_path_places_new_system_messages_like_from_wire() -> None:
    memo = ConversationMemo()
    base = [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}]
    _check(memo, base)
    grown = [*base, {"role": "system", "content": "late1"},
             {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
             {"role": "system", "content": [{"type": "text", "text": "late2"}]},
             {"role": "user", "content": "u2"}, {"role": "system", "content": "late3"}]
    _check(memo, grown)
    assert memo.num_extended == 1
    # Leading system messages stay merged when a request only adds messages after them.
    memo = ConversationMemo()
    lead = [{"role": "system", "content": "s1"}, {"role": "system", "content": "s2"},
            {"role": "user", "content": "u1"}]
    _check(memo, lead)
    _check(memo, [*lead, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}])
    assert memo.num_extended == 1


def test_the_extension_path_compares_numbers_by_their_json() -> None:
    memo = ConversationMemo()
    part = {"type": "text", "text": "t", "weight": 1}
    first = [{"role": "user", "content": [part]}, {"role": "assistant", "content": "a"}]
    _check(memo, first)
    for value in (1, True, 1.0, 0.0, -0.0, -0.0):
        grown = copy.deepcopy(first)
        grown[0]["content"][0]["weight"] = value
        _check(memo, [*grown, {"role": "user", "content": "u2"}])
        _check(memo, grown)  # and back: a shorter request goes through the reuse path
    assert memo.num_extended == 2  # 1 after 1, and -0.0 after -0.0


def test_an_invalid_new_message_leaves_the_memo_on_the_last_valid_request() -> None:
    memo = ConversationMemo()
    base = [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}]
    _check(memo, base)
    _check(memo, [*base, {"role": "user", "content": ""}])  # same error as from_wire
    _check(memo, [*base, {"role": "user", "content": "u2"}], tools="not a list")
    _check(memo, [*base, {"role": "user", "content": "u2"}])
    assert memo.num_extended == 1


_edit = st.sampled_from(["extend", "extend", "extend", "edit", "remove", "role", "retry", "system"])


@forest_settings()
@given(st.lists(st.tuples(_edit, st.integers(0, 50)), min_size=1, max_size=12))
# A reply that recreates a state an earlier request sent as an observation ([e0, a1]).
@example(steps=[("extend", 0), ("edit", 0), ("remove", 44), ("remove", 1)])
def test_any_session_through_the_memo_matches_like_from_wire(steps: list[tuple[str, int]]) -> None:
    forest = SessionForest("p")
    memo, drive = ConversationMemo(), Driver(forest)
    history: list[dict] = [{"role": "user", "content": "q"}]
    reply = _session(memo, forest, drive, history)
    for op, pick in steps:
        if op == "extend":
            history = _grown(history, reply, f"q{pick}")
        elif op == "system":
            history = [*copy.deepcopy(history), {"role": "system", "content": f"s{pick}"}]
        elif op != "retry" and len(history) > 1:
            i = pick % len(history)
            history = copy.deepcopy(history)
            if op == "edit":
                history[i] = {**history[i], "content": f"e{pick}"}
            elif op == "remove":
                del history[i]
            else:
                history[i] = {**history[i], "role": "tool" if history[i]["role"] == "user" else "user"}
        reply = _session(memo, forest, drive, history)
