"""SessionMemo keeps its layers in step; SessionMemos forgets the memos of closed Sessions."""

from __future__ import annotations

import gc
from typing import Any

import pytest
from tests.support.sessions import make_group, open_session

from relaxtrio import InvalidRequestError
from relaxtrio.api.body_memo import BodyMemo
from relaxtrio.api.chat import parse_chat_request
from relaxtrio.api.responses import parse_responses_request
from relaxtrio.api.session_memo import SessionMemo, SessionMemos
from relaxtrio.nursery.session import SessionRegistry


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _memos() -> SessionMemos:
    return SessionMemos(lambda: BodyMemo(_reject_constant))


def _call(call_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}]}


def test_a_scan_is_not_resumed_after_a_request_that_moved_the_memo_without_a_check() -> None:
    """A request whose conversation replaced the remembered messages but stopped before its
    tool check (Responses with ``previous_response_id`` skips it) leaves no scan behind, so the
    next request, extending the replaced history by as many messages as the old scan covered,
    is scanned whole."""
    memo = SessionMemo(BodyMemo(_reject_constant))
    first = [{"role": "user", "content": "q"}, _call("c1"), {"role": "tool", "tool_call_id": "c1", "content": "r"}]
    parse_chat_request({"messages": first}, memo)
    assert memo.tool_scan is not None and memo.tool_scan.call_ids == {"c1"}
    # Same length, no call c1: replaces the remembered messages without a check.
    parse_responses_request({"input": [{"role": "user", "content": "other"},
                                       {"role": "assistant", "content": "a"},
                                       {"role": "user", "content": "b"}], "previous_response_id": "r1"}, memo)
    assert memo.tool_scan is None
    orphan = [{"role": "user", "content": "other"}, {"role": "assistant", "content": "a"},
              {"role": "user", "content": "b"}, {"role": "tool", "tool_call_id": "c1", "content": "r"}]
    with pytest.raises(InvalidRequestError) as info:
        parse_chat_request({"messages": orphan}, memo)
    assert info.value.param == "messages[3].tool_call_id"


def test_a_refused_request_keeps_the_scan_of_the_remembered_messages() -> None:
    memo = SessionMemo(BodyMemo(_reject_constant))
    first = [{"role": "user", "content": "q"}, _call("c1")]
    parse_chat_request({"messages": first}, memo)
    with pytest.raises(InvalidRequestError):
        parse_chat_request({"messages": [*first, {"role": "tool", "content": "no id"}]}, memo)
    assert memo.tool_scan is not None and memo.tool_scan.num_messages == 2
    done = [*first, {"role": "tool", "tool_call_id": "c1", "content": "r"}]
    parse_chat_request({"messages": done}, memo)
    assert memo.canonical.extended_from == 2 and memo.tool_scan.call_ids == {"c1"}


async def test_memos_are_per_session_and_dropped_once_their_session_closed() -> None:
    memos, registry = _memos(), SessionRegistry()
    async with open_session(registry) as a, open_session(registry) as b:
        assert memos.of(a) is memos.of(a) and memos.of(a) is not memos.of(b)
        assert memos.of(a).body is not memos.of(b).body
    assert a.closed and b.closed and len(memos) == 2
    memos.prune()
    assert len(memos) == 0


async def test_closed_sessions_memos_do_not_pile_up() -> None:
    """Creating memos for many Sessions that close one after another holds only a bounded
    number of memos (pruned as the map grows), even while the Sessions are still referenced."""
    memos, registry = _memos(), SessionRegistry()
    sessions = []
    for _ in range(300):
        async with open_session(registry) as session:
            memos.of(session)
        sessions.append(session)
    assert len(memos) <= 128


def test_a_memo_goes_with_its_session() -> None:
    memos = _memos()
    group = make_group(1)
    memos.of(group.sessions[0])
    assert len(memos) == 1
    del group
    gc.collect()
    assert len(memos) == 0
