"""SharedRun: append-only views behave as tuples and never change; the memo's extensions share."""

from __future__ import annotations

import copy
import pickle

import pytest

from relaxtrio.forest import Conversation, ConversationMemo, state_hash
from relaxtrio.forest._shared import SharedRun, grown


def test_views_extend_in_place_and_branches_copy() -> None:
    base = SharedRun.of([1, 2])
    longer = base.extended([3])
    assert longer._buffer is base._buffer  # appended, not copied
    branch = base.extended([9, 9])  # base is no longer the longest view: a new list
    assert branch._buffer is not base._buffer
    assert base == (1, 2) and longer == (1, 2, 3) and branch == (1, 2, 9, 9)
    assert (1, 2, 3) == longer and longer != (1, 2) and longer != [1, 2, 3]
    assert longer[1:] == (2, 3) and longer[-1] == 3 and list(longer) == [1, 2, 3]
    assert hash(longer) == hash((1, 2, 3)) and longer + (4,) == (1, 2, 3, 4)
    assert (0,) + longer == (0, 1, 2, 3) and base.extended(()) is base
    assert pickle.loads(pickle.dumps(longer)) == (1, 2, 3)
    with pytest.raises(IndexError):
        base[2]
    with pytest.raises(ValueError):
        SharedRun([1], 2)
    assert grown((1,), [2]) == (1, 2) and grown(longer, [4])._buffer is longer._buffer


def test_extended_conversations_share_their_history_and_stay_exact() -> None:
    memo = ConversationMemo()
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u0"}]
    convs = [memo.conversation(copy.deepcopy(messages))]
    for turn in range(1, 5):
        messages += [{"role": "assistant", "content": f"a{turn}"}, {"role": "user", "content": f"u{turn}"}]
        convs.append(memo.conversation(copy.deepcopy(messages)))
    last = convs[-1]
    assert isinstance(last.messages, SharedRun) and memo.num_extended == 4
    assert last.messages._buffer is convs[1].messages._buffer  # one list for the whole Session
    assert last._message_json._buffer is convs[1]._message_json._buffer
    # A branch from an earlier request copies; no earlier conversation changes.
    branched = memo.conversation([*copy.deepcopy(messages[:3]), {"role": "user", "content": "b"}])
    expected_branch = Conversation.from_wire([*messages[:3], {"role": "user", "content": "b"}])
    assert branched.messages == expected_branch.messages
    for n, conv in enumerate(convs):
        expected = Conversation.from_wire(messages[:2 + 2 * n])
        assert conv.messages == expected.messages and state_hash(conv) == state_hash(expected)
        assert len(conv._prefix_states()) == len(conv.messages) + 1
