"""The dashboard's timeline and Group comparison data, from real turns on a scripted engine.

A Session takes three requests through the agent API: two on its main line and a third that
branches from its first answer. The timeline puts the requests on two branch rows, marks the
first one shared-prefix (both leaves continue from it), gives each answered request the gap to
the agent's next request, and shows one engine span per request with its weight version.
"""

from __future__ import annotations

from typing import Any

from tests.api.api_helpers import CHAT, post, scripted_pipeline
from tests.support.sessions import open_session

from relaxtrio.api.app import create_app
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.rollout.group_view import first_divergence
from relaxtrio.rollout.timeline_view import session_timeline
from relaxtrio.testing.scripted_engine import Reply


async def _chat(app: Any, token: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    status, body, _ = await post(app, CHAT, {"model": "m", "messages": messages}, token=token)
    assert status == 200, body
    return [*messages, body["choices"][0]["message"]]


async def test_the_timeline_has_a_row_per_branch_and_marks_the_shared_prefix(tokenizer) -> None:
    handler, _ = scripted_pipeline(ChatCompiler(tokenizer), lambda ids: Reply(text="sure"),
                                   reasoning_parser=None)
    registry = SessionRegistry()
    app = create_app(registry, handler, model_name="tiny")
    async with open_session(registry) as session:
        first = await _chat(app, session.session_id, [{"role": "user", "content": "plan it"}])
        await _chat(app, session.session_id, [*first, {"role": "user", "content": "go on"}])
        await _chat(app, session.session_id, [*first, {"role": "user", "content": "other way"}])
        timeline = session_timeline(session)
    assert [e["kind"] for e in timeline["events"]] == ["lease", "barrier"]
    requests = timeline["requests"]
    assert len(requests) == 3 and len(timeline["rows"]) == 2
    assert [r["row"] for r in requests] == [0, 0, 1]
    assert [r["shared_prefix"] for r in requests] == [True, False, False]
    leaves = [leaf.state_hash for leaf in session.forest.leaves()]
    assert [row["leaf_hash"] for row in timeline["rows"]] == leaves
    for r in requests:
        [engine] = [s for s in r["spans"] if s["kind"] == "engine"]
        assert engine["finish"] == "stop" and engine["output_tokens"] == r["completion_tokens"] > 0
        assert r["weight_versions"] == engine["weight_versions"] and r["num_aborted"] == 0
        assert r["arrival_s"] <= engine["start_s"] <= engine["end_s"] <= r["committed_s"]
        assert r["prompt_tokens"] > 0
    assert requests[0]["gap_s"] is not None and requests[0]["gap_s"] >= 0
    assert requests[2]["gap_s"] is None  # no request after the last one
    assert requests[1]["prompt_tokens"] > requests[0]["prompt_tokens"]


def test_first_divergence_is_the_first_index_where_rows_differ() -> None:
    assert first_divergence([[1, 2, 3], [1, 2, 4]]) == 2
    assert first_divergence([[1, 2], [1, 2, 3]]) == 2  # the shorter row ends first
    assert first_divergence([[1, 2], [1, 2]]) is None
    assert first_divergence([[1, 2]]) is None  # nothing to compare with
    assert first_divergence([[5], [1], [1]]) == 0
