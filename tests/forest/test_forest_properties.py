"""Property tests over random Sessions: branches, retries, re-serialized tool arguments, exports."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.forest.forest_testlib import SEARCH_TOOL, Driver, forest_settings, reference_match
from hypothesis import given
from hypothesis import strategies as st

from relaxtrio import ContextLengthExceededError, ExportError
from relaxtrio.forest import Conversation, ResponseNode, SessionForest, export_samples, parse_session_output

TOOL_CHOICES = (None, [SEARCH_TOOL])
KWARG_CHOICES = (None, {"enable_thinking": True})
INITIAL = (
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "task A"}],
    [{"role": "user", "content": "task A"}],
    [
        {
            "role": "user",
            "content": [{"type": "text", "text": "task B"}, {"type": "image_url", "image_url": {"url": "u"}}],
        }
    ],
)

_args = st.dictionaries(
    st.sampled_from(["q", "k", "n"]),
    st.integers(-3, 3) | st.sampled_from(["a", "b", "北"]) | st.sampled_from([0.5, -1.5]) | st.booleans(),
    max_size=3,
)
_reply = st.one_of(
    st.sampled_from(["ok", "done", "I will search."]).map(lambda t: {"role": "assistant", "content": t}),
    st.tuples(st.sampled_from(["", "Let me look."]), _args, st.sampled_from(["c1", "c2"])).map(
        lambda t: {
            "role": "assistant",
            "content": t[0],
            "tool_calls": [
                {
                    "id": t[2],
                    "type": "function",
                    "function": {"name": "search", "arguments": json.dumps(t[1])},
                }
            ],
        }
    ),
    st.sampled_from(["hmm", "maybe"]).map(
        lambda t: {"role": "assistant", "content": t, "reasoning_content": "why"}
    ),
)
_ops = st.lists(
    st.tuples(
        st.sampled_from(["new", "extend", "retry", "edit", "observe"]),
        st.integers(0, 10**6),
        _reply,
        st.sampled_from(["more", "again", "why?"]),
    ),
    min_size=1,
    max_size=10,
)


def _loosen(value: Any) -> Any:
    """How another client might spell the same JSON: reversed keys, integral numbers as floats."""
    if isinstance(value, dict):
        return {k: _loosen(v) for k, v in reversed(list(value.items()))}
    if isinstance(value, list):
        return [_loosen(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _echo(message: dict[str, Any]) -> dict[str, Any]:
    """An agent's replay of a committed message: other key order, other argument spelling."""
    out = {k: v for k, v in reversed(list(message.items()))}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                "function": {
                    "arguments": json.dumps(_loosen(json.loads(c["function"]["arguments"])), indent=1),
                    "name": c["function"]["name"],
                },
                "type": "function",
                "id": c["id"],
                "index": i,
            }
            for i, c in enumerate(message["tool_calls"])
        ]
        if out["content"] == "":
            out["content"] = None
    return out


def _observations(history: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    last = history[-1]
    if last["role"] == "assistant" and last.get("tool_calls"):
        return [
            {"role": "tool", "tool_call_id": c["id"], "content": f"result for {text}"}
            for c in last["tool_calls"]
        ]
    return [{"role": "user", "content": text}]


def _wire_state(forest: SessionForest, node: Any) -> tuple[list[dict[str, Any]], Any, Any]:
    root = forest.subtree_root(node)
    return [_echo(m) for m in forest.messages(node)], list(root.tools), root.template_kwargs


def _request(forest: SessionForest, drive: Driver, messages, tools, kwargs) -> Any:
    """One agent request: match (checked against the naive loop), commit, generate."""
    conv = Conversation.from_wire(messages, tools, kwargs)
    match = forest.match(conv)
    expected_parent, expected_delta = reference_match(forest, conv)
    assert match.parent is expected_parent and match.delta == expected_delta
    return match


def _run_session(ops, forest: SessionForest) -> list[Any]:
    drive = Driver(forest)
    nodes: list[Any] = []
    for op, pick, reply, text in ops:
        if op == "new" or not nodes:
            tools, kwargs = TOOL_CHOICES[pick % 2], KWARG_CHOICES[(pick // 2) % 2]
            messages = list(INITIAL[(pick // 4) % len(INITIAL)])
        else:
            node = nodes[pick % len(nodes)]
            messages, tools, kwargs = _wire_state(forest, node)
            if op in ("extend", "observe"):
                messages += _observations(forest.messages(node), text)
            elif op == "edit" and len(messages) > 1:
                messages = [*messages[:-1], {"role": "user", "content": text}]  # a different last message
        match = _request(forest, drive, messages, tools, kwargs)
        if op == "retry" and nodes:
            assert match.is_full_match and match.parent is nodes[pick % len(nodes)]
        parent = match.parent
        if match.delta:
            before = (len(forest), forest.leaves())
            try:
                parent = forest.add_observation(match, token_ids=drive.ids(2 * len(match.delta) + 1))
            except ContextLengthExceededError:
                assert (len(forest), forest.leaves()) == before  # nothing committed
                continue
            nodes.append(parent)
        if op == "observe":
            continue  # the turn failed after its observation was committed: an observation leaf
        response = drive.respond(parent, reply, finish_reason="length" if pick % 5 == 0 else "stop")
        if not any(response is n for n in nodes):
            nodes.append(response)
    return nodes


def _occurrences(haystack: tuple[int, ...], needle: tuple[int, ...]) -> int:
    n = len(needle)
    return sum(1 for i in range(len(haystack) - n + 1) if haystack[i : i + n] == needle)


def _check_sample(forest: SessionForest, node: Any, sample: Any) -> None:
    lineage = forest.lineage(node)
    assert len(sample.token_ids) == len(sample.loss_mask) == len(sample.rollout_logprobs)
    assert sample.token_ids == tuple(t for n in lineage for t in n.token_ids)
    responses = [n for n in lineage if isinstance(n, ResponseNode)]
    sampled = {t for n in responses for t in n.token_ids}
    assert sum(sample.loss_mask) == sum(len(n.token_ids) for n in responses)
    for t, m, lp in zip(sample.token_ids, sample.loss_mask, sample.rollout_logprobs, strict=True):
        assert (m == 1) == (t in sampled)
        if m == 0:
            assert lp == 0.0
    for n in responses:
        assert _occurrences(sample.token_ids, n.token_ids) == 1
        start = next(
            i
            for i in range(len(sample.token_ids))
            if sample.token_ids[i : i + len(n.token_ids)] == n.token_ids
        )
        assert sample.rollout_logprobs[start : start + len(n.token_ids)] == n.rollout_logprobs
    assert sample.prompt_length == sample.token_ids.index(responses[0].token_ids[0])
    last_status = "truncated" if lineage[-1].kind == "observation" else lineage[-1].status
    assert sample.status == last_status
    assert sample.metadata["rollout_turns"] == len(responses)


@forest_settings()
@given(ops=_ops, max_context_tokens=st.sampled_from([None, 40]))
def test_random_sessions_keep_matching_and_export_invariants(ops, max_context_tokens) -> None:
    forest = SessionForest("prop", max_context_tokens=max_context_tokens)
    nodes = _run_session(ops, forest)
    assert len(forest) == len(nodes)

    # Matching any committed state's (re-serialized) messages returns that state.
    for node in nodes:
        messages, tools, kwargs = _wire_state(forest, node)
        match = forest.match(Conversation.from_wire(messages, tools, kwargs))
        assert match.parent is node and match.is_full_match

    # Every state with a response exports through an explicit record, all in one JSONL file.
    exportable = [n for n in nodes if n.num_responses > 0]
    lines = []
    for i, node in enumerate(exportable):
        messages, tools, kwargs = _wire_state(forest, node)
        lines.append(
            json.dumps(
                {
                    "name": f"ctx{i}",
                    "messages": messages,
                    "tools": tools,
                    "chat_template_kwargs": kwargs,
                    "reward": i,
                }
            )
        )
    if lines:
        samples = export_samples(forest, parse_session_output("\n".join(lines)))
        assert [s.name for s in samples] == [f"ctx{i}" for i in range(len(exportable))]
        for node, sample in zip(exportable, samples, strict=True):
            _check_sample(forest, node, sample)

    # Implicit export works exactly when the history is linear (one leaf) and that leaf holds a
    # response; one exportable leaf next to other leaves is still nonlinear.
    candidates = [leaf for leaf in forest.leaves() if leaf.num_responses > 0]
    if len(candidates) == 1 and len(forest.leaves()) == 1:
        (sample,) = export_samples(forest, None)
        _check_sample(forest, candidates[0], sample)
    elif len(candidates) == 1:
        with pytest.raises(ExportError, match="implicit export requires a linear history"):
            export_samples(forest, None)
    else:
        # the count ends the message (no leaf) or is followed by what to do (several leaves)
        with pytest.raises(ExportError, match=f"found {len(candidates)}(?:$|: )") as caught:
            export_samples(forest, None)
        assert caught.value.num_leaves == len(candidates)


@forest_settings()
@given(ops=_ops, extra=st.lists(st.sampled_from(["x", "y"]), max_size=3))
def test_match_equals_the_reference_loop_for_unrelated_requests(ops, extra) -> None:
    forest = SessionForest("prop")
    nodes = _run_session(ops, forest)
    drive = Driver(forest)
    for node in nodes:
        messages, tools, kwargs = _wire_state(forest, node)
        # Prefixes, extensions and edits of committed histories, with matching and other tools.
        variants = [messages[:k] for k in range(len(messages) + 1)]
        variants.append(messages + [{"role": "user", "content": t} for t in extra])
        variants.append([{"role": "user", "content": "unrelated"}, *messages[1:]])
        for variant in variants:
            for tool_choice in (tools, [SEARCH_TOOL] if not tools else None):
                _request(forest, drive, variant, tool_choice, kwargs)
