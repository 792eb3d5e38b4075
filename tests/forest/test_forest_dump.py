"""forest_to_json and sample_to_json/sample_from_json: the plain-JSON views debug dumps store."""

from __future__ import annotations

import json

import pytest
from tests.forest.forest_testlib import SEARCH_TOOL, Driver, assistant, user

from relaxtrio.forest import (
    SessionForest,
    SessionOutput,
    WeightSpan,
    export_samples,
    forest_to_json,
    sample_from_json,
    sample_leaf_hash,
    sample_to_json,
)


def _branched_forest() -> tuple[SessionForest, list]:
    """Two subtrees (the second with tools), one of them branching after its first reply."""
    forest = SessionForest("sess-dump", max_context_tokens=4096)
    drive = Driver(forest)
    history = [user("first question")]
    first = drive.turn(history, assistant("first answer"))
    history.append(first.message)
    spans = [WeightSpan("v1", 0, 1), WeightSpan("v2", 1, 2)]
    left = drive.respond(drive.observe([*history, user("left?")]), assistant("left answer"),
                         weight_versions=spans, abort_count=1, request_id="req-l", rollout_id=3,
                         wall_s=1.5, generation_s=0.5)
    right = drive.turn([*history, user("right?")], assistant("right answer"))
    tools_reply = drive.turn([user("search something")], assistant("searched"), tools=[SEARCH_TOOL])
    return forest, [first, left, right, tools_reply]


def test_forest_json_lists_every_node_with_its_parent_kind_and_tokens() -> None:
    forest, (_, left, right, tools_reply) = _branched_forest()
    record = forest_to_json(forest, exported=[left.state_hash])
    json.dumps(record, allow_nan=False)  # plain JSON
    nodes = record["nodes"]
    assert record["session_id"] == "sess-dump" and record["num_nodes"] == len(forest) == len(nodes) == 8
    assert [n["state_hash"] for n in nodes] == [n.state_hash for n in forest.nodes()]
    by_hash = {n["state_hash"]: n for n in nodes}
    for node in forest.nodes():
        entry = by_hash[node.state_hash]
        assert entry["kind"] == node.kind and entry["parent_hash"] == node.parent_hash
        assert entry["token_ids"] == list(node.token_ids) and entry["num_tokens"] == len(node.token_ids)
        assert entry["num_train_tokens"] == node.num_train_tokens
        if node.parent_hash is not None:  # parents come first
            assert [n["state_hash"] for n in nodes].index(node.parent_hash) < nodes.index(entry)
    assert record["leaves"] == [left.state_hash, right.state_hash, tools_reply.state_hash]
    assert [n["state_hash"] for n in nodes if n["leaf"]] == sorted(record["leaves"], key=list(by_hash).index)
    assert record["exported"] == [left.state_hash]
    assert [n["state_hash"] for n in nodes if n["exported"]] == [left.state_hash]
    entry = by_hash[left.state_hash]
    assert entry["weight_versions"] == [{"version": "v1", "start": 0, "end": 1},
                                        {"version": "v2", "start": 1, "end": 2}]
    assert (entry["abort_count"], entry["request_id"], entry["rollout_id"]) == (1, "req-l", 3)
    assert (entry["wall_s"], entry["generation_s"]) == (1.5, 0.5)
    assert entry["rollout_logprobs"] == list(left.rollout_logprobs)
    assert entry["messages"] == [left.message] and entry["finish_reason"] == "stop"
    roots = [n for n in nodes if n["parent_hash"] is None]
    assert [r["tools"] for r in roots] == [[], [SEARCH_TOOL]]
    assert all("tools" not in n for n in nodes if n["parent_hash"] is not None)


def test_forest_json_refuses_an_export_that_is_not_committed() -> None:
    forest, _ = _branched_forest()
    with pytest.raises(ValueError, match="not committed"):
        forest_to_json(forest, exported=["0" * 64])


def test_samples_round_trip_through_json() -> None:
    forest = SessionForest("sess-rt")
    drive = Driver(forest)
    history = [user("q")]
    reply = drive.turn(history, assistant("a"))
    drive.turn([*history, reply.message, user("again")], assistant("b"))
    [sample] = export_samples(forest, SessionOutput(reward={"score": 1.0, "len": 3}, metadata={"k": [1, 2]}),
                              dataset_metadata={"row": 7})
    record = json.loads(json.dumps(sample_to_json(sample)))
    assert record["state_hash"] == sample_leaf_hash(sample) == forest.leaves()[0].state_hash
    assert record["name"] is None and record["num_multimodal_inputs"] == 0
    assert "rollout_token_ids" not in record  # text: the same ids
    assert sample_from_json(record) == sample
    assert sample_from_json(record).metadata == sample.metadata
    assert sample_from_json(record).rollout_logprobs == sample.rollout_logprobs
