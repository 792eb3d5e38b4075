"""select_leaves: the implicit-export policies strict, final and all-leaves
(docs/export-and-credit.md#export-policies)."""

from __future__ import annotations

import pytest
from tests.forest.forest_testlib import Driver, assistant, user

from relaxtrio import ExportError
from relaxtrio.forest import SessionForest, export_samples, select_leaves

SYSTEM = {"role": "system", "content": "You are a coding agent."}
TITLE = {"role": "system", "content": "Generate a title."}


def _branching_forest(*, title_last: bool) -> tuple[SessionForest, list]:
    """mini-swe-agent's format-error retries (three branches) and opencode's title request."""
    forest = SessionForest("s")
    drive = Driver(forest)
    title = None
    if not title_last:
        title = drive.respond(drive.observe([TITLE, user("task")]), assistant("Fix the bug"), n_ids=30)
    replies = [drive.respond(drive.observe([SYSTEM, user("task")]), assistant("no code block"))]
    for retry in range(2):
        parent = drive.observe([SYSTEM, user("task"), user(f"format error {retry}")])
        replies.append(drive.respond(parent, assistant(f"attempt {retry}")))
    if title_last:
        title = drive.respond(drive.observe([TITLE, user("task")]), assistant("Fix the bug"), n_ids=30)
    return forest, [*replies, title]


@pytest.mark.parametrize("title_last", [False, True])
def test_final_is_the_last_answer_of_the_main_subtree(title_last: bool) -> None:
    forest, (first, retry_0, retry_1, title) = _branching_forest(title_last=title_last)
    selection = select_leaves(forest, "final")
    assert selection.contexts == ((None, retry_1),)
    assert set(selection.dropped_branches) == {first, retry_0} and selection.side_leaves == (title,)
    assert selection.num_unexported_leaves == 3
    [sample] = export_samples(forest, None, policy="final")
    assert sample.name is None and sample.metadata["agentic_trace"]["leaf_state_hash"] == retry_1.state_hash


def test_final_follows_the_last_answer_not_the_newest_leaf() -> None:
    forest = SessionForest("s")
    drive = Driver(forest)
    parent = drive.observe([SYSTEM, user("task")])
    early = drive.respond(parent, assistant("one"))
    drive.respond(drive.observe([SYSTEM, user("task"), user("retry")]), assistant("two"))
    assert drive.respond(parent, assistant("one")) is early  # the same answer again, answered last
    assert select_leaves(forest, "final").contexts == ((None, early),)


def test_final_ignores_an_observation_that_only_follows_the_last_answer() -> None:
    forest = SessionForest("s")
    drive = Driver(forest)
    reply = drive.respond(drive.observe([SYSTEM, user("task")]), assistant("done"))
    drive.observe([SYSTEM, user("task"), assistant("done"), user("too long to answer")])
    selection = select_leaves(forest, "final")
    assert selection.contexts == ((None, reply),) and selection.num_unexported_leaves == 0


def test_strict_and_all_leaves() -> None:
    forest, leaves = _branching_forest(title_last=True)
    with pytest.raises(ExportError, match="requires one committed leaf, found 4") as info:
        select_leaves(forest, "strict")
    assert info.value.num_leaves == 4
    selection = select_leaves(forest, "all-leaves")
    assert selection.contexts == tuple((f"leaf-{i}", leaf) for i, leaf in enumerate(leaves))
    assert [s.name for s in export_samples(forest, None, policy="all-leaves")] == [
        "leaf-0", "leaf-1", "leaf-2", "leaf-3"]


@pytest.mark.parametrize("policy", ["strict", "final", "all-leaves"])
def test_no_answer_is_an_export_error_under_every_policy(policy: str) -> None:
    forest = SessionForest("s")
    Driver(forest).observe([SYSTEM, user("task")])
    with pytest.raises(ExportError, match="found 0") as info:
        select_leaves(forest, policy)
    assert info.value.num_leaves == 0


def _timed_out_then_asked_again() -> tuple[SessionForest, list]:
    """One state, two answers: the first never reached the agent (its client timed out), the
    second answers the same history asked again with another token limit; then the agent goes on
    from the second."""
    forest = SessionForest("s")
    drive = Driver(forest)
    parent = drive.observe([SYSTEM, user("task")])
    abandoned = drive.respond(parent, assistant("long answer"), n_ids=40)
    short = drive.respond(parent, assistant("short"))
    follow = drive.respond(drive.observe([SYSTEM, user("task"), assistant("short"), user("more")]),
                           assistant("done"))
    return forest, [abandoned, short, follow]


@pytest.mark.parametrize("policy", ["strict", "final", "all-leaves"])
def test_an_undelivered_answer_is_a_side_leaf_under_every_policy(policy: str) -> None:
    forest, (abandoned, _, follow) = _timed_out_then_asked_again()
    with pytest.raises(ExportError):  # without the delivery record, strict sees a branch
        select_leaves(forest, "strict")
    selection = select_leaves(forest, policy, undelivered={abandoned.state_hash})
    assert [node for _, node in selection.contexts] == [follow]
    assert selection.undelivered == (abandoned,) and selection.num_unexported_leaves == 1
    [sample] = export_samples(forest, None, policy=policy, undelivered={abandoned.state_hash})
    assert sample.metadata["agentic_trace"]["leaf_state_hash"] == follow.state_hash


def test_only_leaves_are_set_aside_and_nothing_undelivered_is_trained() -> None:
    forest, (abandoned, short, follow) = _timed_out_then_asked_again()
    # An answer the agent never got but continued from anyway (it is not a leaf) stays history.
    assert select_leaves(forest, "final", undelivered={short.state_hash}).contexts == ((None, follow),)
    # Every answer undelivered: no conversation the agent saw.
    with pytest.raises(ExportError, match="found 0"):
        select_leaves(forest, "strict", undelivered={abandoned.state_hash, follow.state_hash})
    # final: the last answer the agent received (here before the undelivered last one).
    selection = select_leaves(forest, "final", undelivered={follow.state_hash})
    assert selection.contexts == ((None, short),) and selection.dropped_branches == (abandoned,)
    assert selection.undelivered == (follow,)
