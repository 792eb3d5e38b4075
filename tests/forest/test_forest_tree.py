"""SessionForest: subtrees, branches, idempotent commits, lineages and the context limit."""

from __future__ import annotations

import json

import pytest
from tests.forest.forest_testlib import SEARCH_TOOL, Driver, assistant, reference_match, tool_call, tool_result, user
from tests.support.lineage import train_token_ids

from relaxtrio import ContextLengthExceededError, InvalidRequestError
from relaxtrio.forest import (
    Conversation,
    ObservationNode,
    ResponseNode,
    RootNode,
    SessionForest,
    WeightSpan,
    export_samples,
    parse_session_output,
    state_hash,
)

SYSTEM = {"role": "system", "content": "Be brief."}


def _conv(messages, tools=None, kwargs=None) -> Conversation:
    return Conversation.from_wire(messages, tools, kwargs)


def test_first_request_matches_the_root_and_becomes_a_subtree_root() -> None:
    forest = SessionForest("s")
    conv = _conv([SYSTEM, user("hi")], [SEARCH_TOOL], {"enable_thinking": False})
    match = forest.match(conv)
    assert match.parent is forest.root and isinstance(match.parent, RootNode)
    assert match.delta == conv.messages and not match.is_full_match
    assert match.state_hash == state_hash(conv)
    obs = forest.add_observation(match, token_ids=[1, 2, 3])
    assert obs.is_subtree_root and obs.parent_hash is None
    assert obs.tools == conv.tools and obs.template_kwargs == {"enable_thinking": False}
    assert obs.state_hash == state_hash(conv)
    assert obs.num_messages == 2 and obs.num_train_tokens == 3 and obs.depth == 1 and obs.num_responses == 0
    assert forest.get(obs.state_hash) is obs and forest.get("nope") is None
    assert forest.subtree_root(obs) is obs
    assert forest.leaves() == (obs,)


def test_lineage_messages_and_token_views() -> None:
    forest = SessionForest("s")
    drive = Driver(forest)
    obs1 = drive.observe([SYSTEM, user("q")], [SEARCH_TOOL])
    resp1 = drive.respond(obs1, assistant("", tool_calls=[tool_call("c1", "search", '{"query": "x"}')]))
    history = [SYSTEM, user("q"), assistant("", tool_calls=[tool_call("c1", "search", {"query": "x"})])]
    match = forest.match(_conv([*history, tool_result("c1", "found")], [SEARCH_TOOL]))
    assert match.parent is resp1 and match.delta == (
        {"role": "tool", "content": "found", "tool_call_id": "c1"},
    )
    obs2 = forest.add_observation(
        match, token_ids=[7, 8], rollout_token_ids=[7, 9, 9, 8], multimodal={"img": 1}
    )
    resp2 = drive.respond(obs2, assistant("done"))

    assert forest.lineage(resp2) == (obs1, resp1, obs2, resp2)
    assert forest.lineage(forest.root) == ()
    assert forest.messages(resp2) == (
        *_conv(history).messages,
        *match.delta,
        {"role": "assistant", "content": "done"},
    )
    assert train_token_ids(forest, resp2) == obs1.token_ids + resp1.token_ids + (7, 8) + resp2.token_ids
    assert (
        forest.rollout_token_ids(resp2) == obs1.token_ids + resp1.token_ids + (7, 9, 9, 8) + resp2.token_ids
    )
    assert forest.train_token_count(resp2) == len(train_token_ids(forest, resp2))
    assert forest.train_token_count(forest.root) == 0
    assert forest.subtree_root(resp2) is obs1
    assert obs2.tools is None and obs2.template_kwargs is None and not obs2.is_subtree_root
    assert forest.conversation(resp2) == _conv(list(forest.messages(resp2)), [SEARCH_TOOL])
    assert state_hash(forest.conversation(resp2)) == resp2.state_hash
    assert forest.leaves() == (resp2,)
    assert len(forest) == 4
    assert forest.num_multimodal_observations == 1


def test_nodes_store_only_their_delta() -> None:
    forest = SessionForest("s")
    drive = Driver(forest)
    messages = [user("u0")]
    node = drive.observe(messages)
    for i in range(1, 6):
        node = drive.respond(node, assistant(f"a{i}"))
        messages += [assistant(f"a{i}"), user(f"u{i}")]
        node = drive.observe(messages)
    for n in forest.lineage(node):
        assert len(n.messages) == 1
    # The full history is assembled from the very dicts the nodes hold, not copies.
    full = forest.messages(node)
    assert [id(m) for m in full] == [id(m) for n in forest.lineage(node) for m in n.messages]
    assert node.num_messages == len(full) == 11 and node.depth == 11


def test_rollout_ids_of_recent_lineages_are_reused_and_exact() -> None:
    forest = SessionForest("s")
    drive = Driver(forest)
    messages = [user("u0")]
    node = drive.observe(messages)
    nodes = [node]
    for i in range(1, 8):
        node = drive.respond(node, assistant(f"a{i}"))
        messages = [*messages, assistant(f"a{i}"), user(f"u{i}")]
        node = drive.observe(messages)
        nodes += [forest.get(node.parent_hash), node]
        assert forest.rollout_token_ids(node) == tuple(t for n in forest.lineage(node)
                                                         for t in n.rollout_token_ids)
    # Branches and old states, asked for in any order, still give their own lineage's ids.
    branch = drive.observe([*messages[:3], user("other")])
    for n in [branch, *reversed(nodes), branch, nodes[0], forest.root]:
        expected = tuple(t for m in forest.lineage(n) for t in m.rollout_token_ids)
        assert forest.rollout_token_ids(n) == expected
    assert forest.num_multimodal_observations == 0


def test_different_history_tools_or_kwargs_form_separate_subtrees() -> None:
    forest = SessionForest("s")
    drive = Driver(forest)
    base = drive.observe([user("task")])
    other_history = drive.observe([user("another task")])
    with_tools = drive.observe([user("task")], [SEARCH_TOOL])
    with_kwargs = drive.observe([user("task")], None, {"enable_thinking": True})
    nodes = [base, other_history, with_tools, with_kwargs]
    assert all(isinstance(n, ObservationNode) and n.is_subtree_root for n in nodes)
    assert len({n.state_hash for n in nodes}) == 4
    resp = drive.respond(base, assistant("answer"))
    # Same messages with other tools never match the committed state: reset to a new subtree.
    match = forest.match(_conv([user("task"), assistant("answer"), user("more")], [SEARCH_TOOL]))
    assert match.parent is with_tools and len(match.delta) == 2
    match = forest.match(_conv([user("task"), assistant("answer"), user("more")]))
    assert match.parent is resp


def test_full_match_branches_and_identical_commits_are_idempotent() -> None:
    forest = SessionForest("s")
    drive = Driver(forest)
    obs = drive.observe([user("q")])
    again = forest.match(_conv([user("q")]))
    assert again.parent is obs and again.is_full_match and again.delta == ()
    first = drive.respond(obs, assistant("A"))
    sibling = drive.respond(obs, assistant("B"))
    assert first.parent_hash == sibling.parent_hash == obs.state_hash
    assert set(forest.leaves()) == {first, sibling}
    duplicate = forest.add_response(
        obs, assistant("A"), token_ids=[5], rollout_logprobs=[-1.0], finish_reason="stop"
    )
    assert duplicate is first and duplicate.token_ids == first.token_ids
    assert len(forest.leaves()) == 2
    # The same observation committed twice (e.g. two concurrent requests) is one node.
    m1 = forest.match(_conv([user("q"), assistant("A"), user("next")]))
    m2 = forest.match(_conv([user("q"), assistant("A"), user("next")]))
    o1 = forest.add_observation(m1, token_ids=[1])
    o2 = forest.add_observation(m2, token_ids=[2, 2])
    assert o1 is o2 and o1.token_ids == (1,)
    # A full match on a response continues from that response (a new branch from that state).
    full = forest.match(_conv([user("q"), assistant("B")]))
    assert full.parent is sibling and full.is_full_match


def test_a_state_committed_as_the_other_kind_is_the_one_node_of_that_state() -> None:
    """A client can send a request ending in an assistant message that a reply later recreates
    (and the other way round under concurrency): one node per state, never a 5xx."""
    forest = SessionForest("s")
    drive = Driver(forest)
    obs = drive.observe([user("q")])
    stale = forest.match(_conv([user("q"), assistant("X")]))
    sent = drive.observe([user("q"), assistant("Y")])  # an observation whose last message is an assistant
    assert drive.respond(obs, assistant("Y")) is sent
    assert forest.num_responses_into_observations == 1
    assert forest.responses_in_answer_order() == ()
    reply = drive.respond(obs, assistant("X"))
    assert forest.add_observation(stale, token_ids=[1]) is reply  # committed since the match
    assert len(forest) == 3 and forest.num_responses_into_observations == 1
    # The next turn continues the one committed state.
    assert forest.match(_conv([user("q"), assistant("Y"), user("more")])).parent is sent


def test_tool_arguments_are_matched_after_reserialization() -> None:
    forest = SessionForest("s")
    drive = Driver(forest)
    obs = drive.observe([user("weather?")], [SEARCH_TOOL])
    resp = drive.respond(obs, assistant("", tool_calls=[tool_call("c", "search", '{"c": "d", "a": "b"}')]))
    assert resp.message["tool_calls"][0]["function"]["arguments"] == '{"a":"b","c":"d"}'
    replay = [
        user("weather?"),
        assistant("", tool_calls=[tool_call("c", "search", '{"a":"b","c":"d"}')]),
        tool_result("c", "sunny"),
    ]
    match = forest.match(_conv(replay, [SEARCH_TOOL]))
    assert match.parent is resp
    assert match.delta == ({"role": "tool", "content": "sunny", "tool_call_id": "c"},)


def test_replay_without_reasoning_branches_from_the_last_common_state() -> None:
    """An agent dropping reasoning_content on replay creates a new branch
    (docs/client-quirks.md#dropped-reasoning-on-replay)."""
    forest = SessionForest("s")
    drive = Driver(forest)
    obs = drive.observe([user("How are you?")])
    resp = drive.respond(obs, assistant("I am good!", reasoning_content="ok"))
    with_reasoning = [user("How are you?"), assistant("I am good!", reasoning_content="ok"), user("Name?")]
    assert forest.match(_conv(with_reasoning)).parent is resp
    without = [user("How are you?"), assistant("I am good!"), user("Name?")]
    match = forest.match(_conv(without))
    assert match.parent is obs and len(match.delta) == 2
    branch = forest.add_observation(match, token_ids=[1, 2])
    assert branch.parent_hash == obs.state_hash
    assert set(forest.leaves()) == {resp, branch}


def test_sampled_ids_are_reused_not_re_encoded() -> None:
    """The turn-2 prompt carries the exact sampled ids of turn 1
    (docs/client-quirks.md#re-encoding-sampled-text)."""
    forest = SessionForest("s")
    obs = forest.add_observation(forest.match(_conv([user("Name a fictional city.")])), token_ids=[1, 2, 3])
    resp = forest.add_response(
        obs, assistant(" Pantom"), token_ids=[53122, 316], rollout_logprobs=[-0.1, -0.2], finish_reason="stop"
    )
    match = forest.match(_conv([user("Name a fictional city."), assistant(" Pantom"), user("Describe it.")]))
    assert match.parent is resp
    obs2 = forest.add_observation(match, token_ids=[4, 5])
    assert forest.rollout_token_ids(obs2) == (1, 2, 3, 53122, 316, 4, 5)
    forest.add_response(
        obs2,
        assistant("A city."),
        token_ids=[77, 78, 79],
        rollout_logprobs=[-1, -1, -1],
        finish_reason="stop",
    )
    (sample,) = export_samples(forest, None)
    assert sample.token_ids == (1, 2, 3, 53122, 316, 4, 5, 77, 78, 79)
    assert sample.loss_mask == (0, 0, 0, 1, 1, 0, 0, 1, 1, 1)
    assert sample.rollout_logprobs[3:5] == (-0.1, -0.2)


def test_compacted_history_starts_a_new_subtree() -> None:
    """Trimming old messages never errors; it matches the longest committed prefix
    (docs/client-quirks.md#trimmed-or-compacted-history)."""
    forest = SessionForest("s")
    drive = Driver(forest)
    messages = [SYSTEM, user("task")]
    node = drive.observe(messages)
    for i in range(40):
        node = drive.respond(node, assistant(f"step {i}"))
        messages += [assistant(f"step {i}"), user(f"next {i}")]
        node = drive.observe(messages)
    compacted = [SYSTEM, user("summary of 40 turns"), *messages[-4:]]
    match = forest.match(_conv(compacted))
    assert (match.parent, match.delta) == reference_match(forest, _conv(compacted))
    assert match.parent is forest.root
    fresh = forest.add_observation(match, token_ids=[1])
    assert fresh.is_subtree_root and len(forest.leaves()) == 2
    after = drive.respond(fresh, assistant("continuing"))
    before = forest.lineage(node)[-2]  # the last response before compaction
    records = [
        {"name": "pre", "messages": list(forest.messages(before))},
        {"name": "post", "messages": [*compacted, assistant("continuing")]},
    ]
    pre, post = export_samples(forest, parse_session_output("\n".join(json.dumps(r) for r in records)))
    assert pre.token_ids == train_token_ids(forest, before) and pre.metadata["rollout_turns"] == 40
    assert post.token_ids == train_token_ids(forest, after) and post.metadata["rollout_turns"] == 1


def test_match_takes_the_longest_committed_prefix() -> None:
    forest = SessionForest("s")
    drive = Driver(forest)
    r1 = drive.turn([user("a")], assistant("b"))
    drive.turn([user("a"), assistant("b"), user("c")], assistant("d"))
    conv = _conv([user("a"), assistant("b"), user("x"), assistant("y")])
    match = forest.match(conv)
    assert match.parent is r1 and [m["content"] for m in match.delta] == ["x", "y"]
    assert (match.parent, match.delta) == reference_match(forest, conv)
    assert forest.match(_conv([])).parent is forest.root


# -- context limit -----------------------------------------------------------------------------


def test_context_limit_is_checked_before_committing_an_observation() -> None:
    forest = SessionForest("s", max_context_tokens=10)
    obs = forest.add_observation(forest.match(_conv([user("q")])), token_ids=range(6))
    resp = forest.add_response(
        obs, assistant("a"), token_ids=[1, 2], rollout_logprobs=[0.0, 0.0], finish_reason="stop"
    )
    conv = _conv([user("q"), assistant("a"), user("long")])
    match = forest.match(conv)
    with pytest.raises(ContextLengthExceededError) as caught:
        forest.add_observation(match, token_ids=[1, 2])
    error = caught.value
    assert error.message == (
        "This model's maximum context length is 10 tokens. However, your messages resulted in 10 tokens. "
        "Please reduce the length of the messages."
    )
    assert error.param == "messages" and error.code == "context_length_exceeded" and error.http_status == 400
    assert error.session_id == "s"
    assert len(forest) == 2 and forest.leaves() == (resp,) and forest.get(match.state_hash) is None
    assert forest.match(conv).parent is resp
    assert forest.add_observation(match, token_ids=[1]).num_train_tokens == 9


def test_context_limit_applies_to_a_first_observation_and_uses_training_ids() -> None:
    forest = SessionForest("s", max_context_tokens=4)
    with pytest.raises(ContextLengthExceededError, match="resulted in 4 tokens"):
        forest.add_observation(
            forest.match(_conv([user("q")])), token_ids=[1, 2, 3, 4], rollout_token_ids=[1]
        )
    assert len(forest) == 0
    obs = forest.add_observation(
        forest.match(_conv([user("q")])), token_ids=[1], rollout_token_ids=[1, 2, 3, 4, 5]
    )
    assert obs.num_train_tokens == 1
    unlimited = SessionForest("s")
    assert (
        unlimited.add_observation(
            unlimited.match(_conv([user("q")])), token_ids=range(10_000)
        ).num_train_tokens
        == 10_000
    )


# -- invariants --------------------------------------------------------------------------------


def test_add_response_checks_its_inputs() -> None:
    forest = SessionForest("s")
    obs = forest.add_observation(forest.match(_conv([user("q")])), token_ids=[1])
    ok = {"token_ids": [1, 2], "rollout_logprobs": [0.0, 0.0], "finish_reason": "stop"}
    with pytest.raises(ValueError, match="token_ids must not be empty"):
        forest.add_response(obs, assistant("a"), token_ids=[], rollout_logprobs=[], finish_reason="stop")
    with pytest.raises(ValueError, match="rollout_logprobs has 1 entries for 2 token_ids"):
        forest.add_response(
            obs, assistant("a"), token_ids=[1, 2], rollout_logprobs=[0.0], finish_reason="stop"
        )
    with pytest.raises(ValueError, match="finish_reason must be stop, length or tool_calls"):
        forest.add_response(obs, assistant("a"), **{**ok, "finish_reason": "abort"})
    with pytest.raises(ValueError, match=r"span .* is outside \[0, 2\)"):
        forest.add_response(obs, assistant("a"), **ok, weight_versions=[WeightSpan("v1", 0, 3)])
    with pytest.raises(ValueError, match="must be >= start"):
        WeightSpan("v1", 2, 1)
    with pytest.raises(ValueError, match="not the technical root"):
        forest.add_response(forest.root, assistant("a"), **ok)
    with pytest.raises(ValueError, match="role assistant"):
        forest.add_response(obs, user("a"), **ok)
    with pytest.raises(InvalidRequestError) as caught:
        forest.add_response(obs, assistant("", tool_calls=[tool_call("c", "f", "{oops")]), **ok)
    assert caught.value.param == "message.tool_calls[0].function.arguments"
    other = SessionForest("other")
    foreign = other.add_observation(other.match(_conv([user("q")])), token_ids=[1])
    with pytest.raises(ValueError, match="does not belong to session s"):
        forest.add_response(foreign, assistant("a"), **ok)
    with pytest.raises(ValueError, match="non-empty delta"):
        forest.add_observation(forest.match(_conv([user("q")])), token_ids=[1])
    assert len(forest) == 1


def test_response_node_records_turn_metadata() -> None:
    forest = SessionForest("s")
    obs = forest.add_observation(forest.match(_conv([user("q")])), token_ids=[1])
    resp = forest.add_response(
        obs,
        assistant("partial"),
        token_ids=[1, 2, 3],
        rollout_logprobs=[-1, -2, -3],
        finish_reason="length",
        weight_versions=[WeightSpan("v1", 0, 2), WeightSpan("v2", 2, 3)],
        abort_count=1,
        request_id="r-1",
        rollout_id=4,
        wall_s=2.5,
        generation_s=1.5,
    )
    assert isinstance(resp, ResponseNode)
    assert resp.status == "truncated" and resp.rollout_logprobs == (-1.0, -2.0, -3.0)
    assert (resp.request_id, resp.rollout_id, resp.abort_count, resp.wall_s, resp.generation_s) == (
        "r-1",
        4,
        1,
        2.5,
        1.5,
    )
    assert resp.messages == (resp.message,) and resp.rollout_token_ids == resp.token_ids
    assert hash(resp) == hash(resp)  # frozen nodes are hashable
    obs2 = forest.add_observation(
        forest.match(_conv([user("q"), assistant("partial"), user("go on")])), token_ids=[9]
    )
    assert obs2.abort_count == 1  # observations inherit the abort count of their parent
