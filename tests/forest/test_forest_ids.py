"""LineageIds: views of shared append-only buffers behave as the tuples of their ids."""

from __future__ import annotations

import pickle

import pytest
from tests.forest.forest_testlib import forest_settings
from hypothesis import given
from hypothesis import strategies as st

from relaxtrio.forest import LineageIds

_ids = st.lists(st.integers(0, 70000), max_size=6)
# Each step extends one earlier view (any of them: the longest one of a buffer, or a branch).
_steps = st.lists(st.tuples(st.integers(0, 10**6), _ids), max_size=25)


@forest_settings()
@given(st.lists(st.integers(0, 70000), max_size=5), _steps)
def test_views_never_change_and_equal_their_tuples(first: list[int], steps: list[tuple[int, list[int]]]) -> None:
    views = [LineageIds.of(first)]
    expected = [tuple(first)]
    for pick, ids in steps:
        base = views[pick % len(views)]
        views.append(base.extended(ids))
        expected.append(expected[pick % len(views[:-1])] + tuple(ids))
        for view, want in zip(views, expected, strict=True):  # earlier views are unchanged
            assert view == want and want == view and tuple(view) == want and len(view) == len(want)
            assert hash(view) == hash(want) and list(view) == list(want)
    for view, want in zip(views, expected, strict=True):
        assert view[-3:] == want[-3:] and view[1::2] == want[1::2]
        if want:
            assert view[0] == want[0] and view[-1] == want[-1]
        with pytest.raises(IndexError):
            view[len(want)]
        for other, other_want in zip(views, expected, strict=True):
            assert (view == other) == (want == other_want)
            if view.extends(other):  # known prefixes are prefixes
                assert want[:len(other_want)] == other_want


def test_extending_the_longest_view_shares_the_buffer_and_a_branch_copies() -> None:
    a = LineageIds.of((1, 2, 3))
    b = a.extended((4, 5))
    c = b.extended([6])
    assert b.extends(a) and c.extends(a) and c.extends(b) and not a.extends(b)
    assert a.extended(()) is a and b + () is b
    branch = a.extended((9,))  # a is no longer its buffer's longest view
    assert branch == (1, 2, 3, 9) and c == (1, 2, 3, 4, 5, 6) and b == (1, 2, 3, 4, 5)
    assert not branch.extends(a) and branch.extends(branch)  # a new buffer: unknown, not wrong
    assert b + (7,) == (1, 2, 3, 4, 5, 7) and (0,) + a == (0, 1, 2, 3)
    assert isinstance(a + b, LineageIds) and a + b == (1, 2, 3, 1, 2, 3, 4, 5)
    assert a != [1, 2, 3] and a != (1, 2)  # like a tuple: never equal to a list
    assert pickle.loads(pickle.dumps(c)) == c
    assert repr(LineageIds.of(range(10))) == "LineageIds([0, 1, 2, 3, 4, 5, 6, 7, ...], len=10)"
    with pytest.raises(ValueError, match="length 4 is outside"):
        LineageIds([1, 2], 4)


def test_forest_lineage_ids_stay_exact_after_a_resume_appended_partial_ids() -> None:
    from tests.forest.forest_testlib import Driver, assistant, user

    from relaxtrio.forest import SessionForest

    forest = SessionForest("s")
    drive = Driver(forest)
    messages = [user("u0")]
    node = drive.observe(messages)
    previous = forest.rollout_token_ids(node)
    for i in range(1, 6):
        # A resumed generation sends the prompt plus its partial ids (appended to the buffer).
        resumed = forest.rollout_token_ids(node) + (90000 + i, 90001 + i)
        assert resumed.extends(forest.rollout_token_ids(node))
        node = drive.respond(node, assistant(f"a{i}"))
        messages = [*messages, assistant(f"a{i}"), user(f"u{i}")]
        node = drive.observe(messages)
        ids = forest.rollout_token_ids(node)
        assert ids == tuple(t for n in forest.lineage(node) for t in n.rollout_token_ids)
        assert previous == tuple(t for n in forest.lineage(forest.get(node.parent_hash))[:-1]
                                 for t in n.rollout_token_ids)  # earlier views never change
        previous = ids
