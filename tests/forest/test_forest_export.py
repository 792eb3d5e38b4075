"""export_samples: implicit and explicit export, TrainingSample semantics (docs/export-and-credit.md)."""

from __future__ import annotations

import copy
import json
import re

import pytest
from tests.forest.forest_testlib import SEARCH_TOOL, Driver, assistant, tool_call, tool_result, user
from tests.support.lineage import train_token_ids

from relaxtrio import ExportError
from relaxtrio.forest import (
    Conversation,
    SessionForest,
    SessionOutput,
    TrainingSample,
    WeightSpan,
    export_samples,
    parse_session_output,
)


def _branched(n: int) -> str:
    """The strict export failure of a Session whose requests formed ``n`` >= 2 conversations:
    what happened and the ways out (explicit records, or another policy)."""
    return (f"implicit export requires one committed leaf, found {n}: the Session's requests "
            f"branched into {n} separate conversations (a request that does not continue an "
            "earlier answered history starts a new one). Export explicitly (one named JSONL "
            "record per context to train, written to RELAX_OUTPUT_JSON), or pass "
            "--agentic-export-policy final (train only the last answered conversation) or "
            "all-leaves (each conversation a context); training several contexts per Session "
            "needs --agentic-custom-advantage-path")


def _sdk_echo(message: dict) -> dict:
    """What ``ChatCompletionMessage.model_dump()`` gives back for a committed assistant message."""
    echo = {
        "role": "assistant",
        "content": message["content"] or None,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": None,
    }
    if message.get("tool_calls"):
        echo["tool_calls"] = [
            {
                "id": c["id"],
                "function": {
                    "arguments": json.dumps(json.loads(c["function"]["arguments"]), indent=1),
                    "name": c["function"]["name"],
                },
                "type": "function",
            }
            for c in message["tool_calls"]
        ]
    return echo


def test_multi_agent_session_exports_three_contexts_through_jsonl() -> None:
    forest = SessionForest("sess-1")
    drive = Driver(forest)
    main = [{"role": "system", "content": "You coordinate searchers."}, user("Which city hosted the event?")]
    searchers = [[{"role": "system", "content": "You search."}, user(f"Search: topic {i}")] for i in range(2)]

    # Interleaved like concurrent sub-agents of one process.
    main_reply = drive.turn(main, assistant("", tool_calls=[tool_call("d0", "delegate", '{"n": 2}')]))
    main.append(_sdk_echo(main_reply.message))
    for i, history in enumerate(searchers):
        reply = drive.turn(
            history,
            assistant("", tool_calls=[tool_call(f"s{i}", "search", f'{{"query": "t{i}"}}')]),
            tools=[SEARCH_TOOL],
        )
        history += [_sdk_echo(reply.message), tool_result(f"s{i}", f"snippet {i}")]
    for i, history in enumerate(searchers):
        reply = drive.turn(history, assistant(f"Found: city {i}."), tools=[SEARCH_TOOL])
        history.append(_sdk_echo(reply.message))
    main += [tool_result("d0", "city 0; city 1")]
    final = drive.turn(main, assistant("Lyon."))
    main.append(_sdk_echo(final.message))

    assert len(forest.leaves()) == 3
    with pytest.raises(ExportError, match=f"^{re.escape(_branched(3))}$") as caught:
        export_samples(forest, parse_session_output(None))
    assert caught.value.num_leaves == 3

    lines = [
        json.dumps(
            {"name": "main", "messages": main, "metadata": {"role": "main", "outcome": 1.0}, "reward": 1.0}
        )
    ]
    lines += [
        json.dumps(
            {
                "name": f"searcher_{i}",
                "messages": history,
                "tools": [SEARCH_TOOL],
                "metadata": {"role": "searcher", "usefulness": 0.5 + i / 10},
            }
        )
        for i, history in enumerate(searchers)
    ]
    samples = export_samples(
        forest, parse_session_output("\n".join(lines) + "\n"), dataset_metadata={"task_id": "t1"}
    )

    assert [s.name for s in samples] == ["main", "searcher_0", "searcher_1"]
    assert [s.reward for s in samples] == [1.0, None, None]
    assert [s.metadata["role"] for s in samples] == ["main", "searcher", "searcher"]
    assert samples[2].metadata["usefulness"] == 0.6
    leaves = [final, *(forest.match(Conversation.from_wire(h, [SEARCH_TOOL])).parent for h in searchers)]
    for sample, leaf in zip(samples, leaves, strict=True):
        assert isinstance(sample, TrainingSample)
        assert sample.session_id == "sess-1" and sample.status == "completed"
        assert sample.token_ids == train_token_ids(forest, leaf)
        assert sample.metadata["task_id"] == "t1" and sample.metadata["rollout_turns"] == 2
        assert sample.metadata["agentic_trace"]["leaf_state_hash"] == leaf.state_hash
        lineage = forest.lineage(leaf)
        assert sum(sample.loss_mask) == sum(len(n.token_ids) for n in lineage if n.kind == "response")
        assert sample.prompt_length == len(lineage[0].token_ids)
    assert samples[1].metadata["tools"] == [SEARCH_TOOL]
    assert samples[0].metadata["tools"] == []


def _two_turn_session(max_context_tokens: int | None = None) -> tuple[SessionForest, list[dict]]:
    forest = SessionForest("s", max_context_tokens=max_context_tokens)
    history = [user("q1")]
    o1 = forest.add_observation(
        forest.match(Conversation.from_wire(history)),
        token_ids=[1, 2, 3],
        multimodal={"pixel_values": "img-1"},
    )
    r1 = forest.add_response(
        o1,
        assistant("a1"),
        token_ids=[10, 11],
        rollout_logprobs=[-0.1, -0.2],
        finish_reason="stop",
        weight_versions=[WeightSpan("v1", 0, 2)],
        request_id="req-1",
        rollout_id=3,
        wall_s=2.0,
        generation_s=1.5,
        abort_count=0,
    )
    history += [assistant("a1"), user("q2")]
    o2 = forest.add_observation(
        forest.match(Conversation.from_wire(history)), token_ids=[4, 5], rollout_token_ids=[4, 4, 5]
    )
    forest.add_response(
        o2,
        assistant("a2"),
        token_ids=[12, 13, 14],
        rollout_logprobs=[-0.3, -0.4, -0.5],
        finish_reason="length",
        weight_versions=[WeightSpan("v1", 0, 1), WeightSpan("v2", 1, 3)],
        request_id="req-2",
        rollout_id=4,
        wall_s=3.0,
        generation_s=1.0,
        abort_count=1,
    )
    history.append(assistant("a2"))
    assert r1.num_responses == 1
    return forest, history


def test_training_sample_semantics() -> None:
    forest, _ = _two_turn_session()
    dataset_metadata = {"task_id": "t", "nested": {"a": 1}, "role": "dataset"}
    snapshot = copy.deepcopy(dataset_metadata)
    output = parse_session_output('{"metadata": {"role": "agent", "task_success": 0.0}, "reward": 0}')
    (sample,) = export_samples(forest, output, dataset_metadata=dataset_metadata)
    assert dataset_metadata == snapshot
    assert sample.name is None and sample.reward == 0.0
    assert sample.token_ids == (1, 2, 3, 10, 11, 4, 5, 12, 13, 14)
    assert sample.rollout_token_ids == (1, 2, 3, 10, 11, 4, 4, 5, 12, 13, 14)
    assert sample.prompt_length == 3 and sample.response_length == 7
    assert sample.loss_mask == (0, 0, 0, 1, 1, 0, 0, 1, 1, 1)
    assert sample.rollout_logprobs == (0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3, -0.4, -0.5)
    assert sample.status == "truncated"  # the last response hit the length limit
    assert sample.weight_versions == (WeightSpan("v1", 3, 5), WeightSpan("v1", 7, 8), WeightSpan("v2", 8, 10))
    assert sample.multimodal_inputs == ({"pixel_values": "img-1"},)
    metadata = sample.metadata
    assert metadata["task_id"] == "t" and metadata["role"] == "agent" and metadata["task_success"] == 0.0
    assert metadata["start_rollout_id"] == 3 and metadata["rollout_turns"] == 2
    assert metadata["tools"] == [] and metadata["chat_template_kwargs"] == {}
    trace = metadata["agentic_trace"]
    assert trace["turn_count"] == 2 and trace["terminal_status"] == "truncated" and trace["session_id"] == "s"
    assert trace["wall_s"] == 5.0 and trace["generation_s"] == 2.5 and trace["non_generation_s"] == 2.5
    first, second = trace["turns"]
    assert first == {
        "turn_idx": 0,
        "resp_state_hash": forest.lineage(forest.leaves()[0])[1].state_hash,
        "parent_state_hash": forest.lineage(forest.leaves()[0])[0].state_hash,
        "request_id": "req-1",
        "rollout_id": 3,
        "abort_count": 0,
        "status": "completed",
        "finish_reason": "stop",
        "response_length": 2,
        "wall_s": 2.0,
        "generation_s": 1.5,
        "weight_versions": ["v1"],
    }
    assert (
        second["status"] == "truncated"
        and second["abort_count"] == 1
        and second["weight_versions"] == ["v1", "v2"]
    )
    json.dumps(metadata)  # plain JSON all the way down


def test_observation_leaf_exports_truncated_with_trailing_ids_masked() -> None:
    """An observation committed after the last response (then a failed turn) is the leaf."""
    forest, history = _two_turn_session()
    obs = forest.add_observation(
        forest.match(Conversation.from_wire([*history, user("q3")])), token_ids=[6, 7]
    )
    (sample,) = export_samples(forest, None)
    assert forest.leaves() == (obs,)
    assert sample.status == "truncated" and sample.token_ids[-2:] == (6, 7)
    assert sample.loss_mask[-2:] == (0, 0) and sample.rollout_logprobs[-2:] == (0.0, 0.0)
    assert sample.metadata["agentic_trace"]["leaf_state_hash"] == obs.state_hash


def test_implicit_export_counts_only_leaves_with_a_response() -> None:
    forest = SessionForest("s")
    drive = Driver(forest)
    with pytest.raises(ExportError, match=r"^implicit export requires one committed leaf, found 0$") as caught:
        export_samples(forest, SessionOutput())
    assert caught.value.num_leaves == 0
    drive.observe([user("only an observation")])
    with pytest.raises(ExportError, match=r"^implicit export requires one committed leaf, found 0$"):
        export_samples(forest, SessionOutput())
    drive.turn([user("q")], assistant("a"))
    # One exportable leaf, but the observation-only branch makes the history nonlinear: that
    # needs explicit export (this export used to succeed).
    with pytest.raises(ExportError, match=r"^implicit export requires a linear history, but the "
                                          r"Forest has 2 leaves"):
        export_samples(forest, SessionOutput())
    drive.turn([user("q")], assistant("b"))  # a retry: a second branch
    with pytest.raises(ExportError, match=f"^{re.escape(_branched(2))}$") as caught:
        export_samples(forest, SessionOutput())
    assert caught.value.num_leaves == 2


def test_implicit_export_of_a_strictly_linear_history() -> None:
    forest = SessionForest("s")
    drive = Driver(forest)
    first = drive.turn([user("q")], assistant("a"))
    drive.turn([user("q"), first.message, user("more")], assistant("b"))
    (sample,) = export_samples(forest, SessionOutput())
    assert sample.status == "completed" and len(forest.leaves()) == 1


def test_implicit_export_refuses_a_second_subtree_without_response() -> None:
    forest = SessionForest("s")
    drive = Driver(forest)
    drive.turn([user("q")], assistant("a"))
    drive.observe([user("q")], tools=[SEARCH_TOOL])  # other tools: another subtree, no response
    with pytest.raises(ExportError, match="any nonlinear history requires explicit export"):
        export_samples(forest, SessionOutput())


def test_export_metadata_is_kept_apart_from_the_sample_metadata() -> None:
    forest, history = _two_turn_session()
    output = parse_session_output(json.dumps({"name": "main", "messages": history,
                                              "metadata": {"outcome": 1.0}}))
    (sample,) = export_samples(forest, output, dataset_metadata={"id": 7, "label": "x"})
    assert sample.export_metadata == {"outcome": 1.0}
    assert sample.metadata["id"] == 7 and sample.metadata["outcome"] == 1.0
    assert "agentic_trace" in sample.metadata and "tools" in sample.metadata
    implicit_forest, _ = _two_turn_session()
    (implicit,) = export_samples(implicit_forest, SessionOutput(metadata={"score": 0.5}),
                                 dataset_metadata={"id": 7})
    assert implicit.export_metadata == {"score": 0.5}


def test_duplicated_identical_responses_collapse_into_one_leaf() -> None:
    forest = SessionForest("s")
    drive = Driver(forest)
    first = drive.turn([user("q")], assistant("same"))
    second = drive.turn([user("q")], assistant("same"))
    assert first is second
    assert len(export_samples(forest, None)) == 1


def test_explicit_record_must_match_a_committed_state() -> None:
    forest, history = _two_turn_session()
    record = {"name": "main", "messages": history}
    (sample,) = export_samples(forest, parse_session_output(json.dumps(record)))
    assert sample.name == "main" and sample.reward is None
    altered = copy.deepcopy(history)
    altered[-1]["content"] = "something else"
    with pytest.raises(ExportError) as caught:
        export_samples(forest, parse_session_output(json.dumps({"name": "main", "messages": altered})))
    assert caught.value.message == "explicit export does not match a committed Forest state (record 'main')"
    with pytest.raises(
        ExportError, match=r"^explicit export does not match a committed Forest state \(record 'x'\)$"
    ):
        export_samples(
            forest,
            parse_session_output(json.dumps({"name": "x", "messages": history, "tools": [SEARCH_TOOL]})),
        )
    # An intermediate response state is exportable too; an observation state without response is not.
    (mid,) = export_samples(
        forest, parse_session_output(json.dumps({"name": "mid", "messages": history[:2]}))
    )
    assert mid.token_ids == (1, 2, 3, 10, 11) and mid.status == "completed"
    with pytest.raises(ExportError) as caught:
        export_samples(forest, parse_session_output(json.dumps({"name": "first", "messages": history[:1]})))
    assert caught.value.message == "export leaf has no committed response (record 'first')"


def test_explicit_records_must_use_the_canonical_chat_shape() -> None:
    """A raw Responses input list is not an explicit record, even for an agent that spoke Responses."""
    forest, history = _two_turn_session()
    responses_items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q1"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a1"}]},
    ]
    with pytest.raises(ExportError, match="does not match a committed Forest state"):
        export_samples(
            forest, parse_session_output(json.dumps({"name": "main", "messages": responses_items}))
        )
    anthropic = [
        {"role": "user", "content": [{"type": "text", "text": "q1"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "a1"}]},
    ]
    with pytest.raises(ExportError, match="does not match a committed Forest state"):
        export_samples(forest, parse_session_output(json.dumps({"name": "main", "messages": anthropic})))
    (sample,) = export_samples(
        forest, parse_session_output(json.dumps({"name": "main", "messages": history[:2]}))
    )
    assert sample.name == "main"


def test_record_kwargs_are_merged_over_the_server_kwargs_before_hashing() -> None:
    forest = SessionForest("s")
    drive = Driver(forest)
    server = {"enable_thinking": False}
    messages = [user("q")]
    obs = forest.add_observation(
        forest.match(Conversation.from_wire(messages, None, {}, base_template_kwargs=server)), token_ids=[1]
    )
    drive.respond(obs, assistant("a"))
    record = {"name": "main", "messages": [*messages, assistant("a")]}
    output = parse_session_output(json.dumps(record))
    (sample,) = export_samples(forest, output, server_template_kwargs=server)
    assert sample.metadata["chat_template_kwargs"] == server
    with pytest.raises(ExportError, match="does not match"):
        export_samples(forest, output)
    overriding = parse_session_output(
        json.dumps({**record, "chat_template_kwargs": {"enable_thinking": True}})
    )
    with pytest.raises(ExportError, match="does not match"):
        export_samples(forest, overriding, server_template_kwargs=server)
    explicit_same = parse_session_output(
        json.dumps({**record, "chat_template_kwargs": {"enable_thinking": False}})
    )
    assert (
        export_samples(forest, explicit_same, server_template_kwargs={"enable_thinking": True})[0].name
        == "main"
    )
    with pytest.raises(ExportError, match="cannot set reserved keys: tools"):
        export_samples(forest, output, server_template_kwargs={"tools": []})


def test_session_metadata_and_record_metadata_merge() -> None:
    forest, history = _two_turn_session()
    output = SessionOutput(
        records=parse_session_output(
            json.dumps(
                {
                    "name": "main",
                    "messages": history,
                    "metadata": {"b": 2, "shared": "record"},
                    "reward": {"score": 1.0},
                }
            )
        ).records,
        metadata={"a": 1, "shared": "session"},
    )
    (sample,) = export_samples(forest, output, dataset_metadata={"shared": "dataset", "d": 0})
    assert {k: sample.metadata[k] for k in ("a", "b", "d", "shared")} == {
        "a": 1,
        "b": 2,
        "d": 0,
        "shared": "record",
    }
    assert sample.reward == {"score": 1.0}
    assert output.records[0].metadata == {"b": 2, "shared": "record"}


def test_training_sample_validates_its_invariants() -> None:
    ok = dict(
        name=None,
        session_id="s",
        token_ids=[1, 2, 3],
        prompt_length=1,
        loss_mask=[0, 1, 1],
        rollout_logprobs=[0.0, -1.0, -2.0],
        reward=None,
        status="completed",
        weight_versions=[],
        metadata={},
    )
    assert TrainingSample(**ok).rollout_token_ids == (1, 2, 3)
    for change, message in [
        ({"loss_mask": [0, 1]}, "loss_mask has 2 entries for 3 token_ids"),
        ({"rollout_logprobs": [0.0]}, "rollout_logprobs has 1 entries for 3 token_ids"),
        ({"prompt_length": 4}, "prompt_length 4 is outside"),
        ({"loss_mask": [0, 2, 1]}, "loss_mask must hold only 0 and 1"),
        ({"status": "aborted"}, "status must be completed or truncated"),
        ({"weight_versions": [WeightSpan("v", 0, 4)]}, "outside"),
    ]:
        with pytest.raises(ValueError, match=message):
            TrainingSample(**{**ok, **change})
