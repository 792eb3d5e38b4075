"""The dashboard's timeline and Group comparison data, from real turns on a scripted engine.

A Session takes three requests through the agent API: two on its main line and a third that
branches from its first answer. The timeline puts the requests on two branch rows, marks the
first one shared-prefix (both leaves continue from it), gives each answered request the gap to
the agent's next request, and shows one engine span per request with its weight version.
"""

from __future__ import annotations

from typing import Any

import trio
from tests.api.api_helpers import CHAT, post, scripted_pipeline
from tests.support.sessions import open_session

from relaxtrio._errors import EngineUnavailableError
from relaxtrio.api.app import create_app
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.nursery.timeline import call_end
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


async def test_a_failed_or_cancelled_engine_call_ends_its_request(tokenizer) -> None:
    started, never = trio.Event(), trio.Event()
    failures = [EngineUnavailableError("every worker refused the request")]

    def reply(ids: tuple[int, ...]) -> Reply:
        assert not started.is_set(), "two engine calls only"
        if failures:
            raise failures.pop()
        started.set()
        return Reply(text="never answered", gate=never)  # waits until its Session ends

    handler, _ = scripted_pipeline(ChatCompiler(tokenizer), reply, reasoning_parser=None)
    registry = SessionRegistry()
    app = create_app(registry, handler, model_name="tiny")
    statuses: list[int] = []

    async def chat(session_id: str, text: str) -> None:
        status, _, _ = await post(app, CHAT, {"model": "m", "messages": [{"role": "user", "content": text}]},
                                  token=session_id)
        statuses.append(status)

    async with trio.open_nursery() as nursery:
        async with open_session(registry) as session:
            await chat(session.session_id, "a")  # the engine call fails
            nursery.start_soon(chat, session.session_id, "b")
            await started.wait()
        # the Session ended: its turn still generating was cancelled
    assert statuses[0] >= 500 and statuses[1] == 404
    timeline = session_timeline(session)
    failed, cancelled = timeline["requests"]
    for request, end in ((failed, "error"), (cancelled, "cancelled")):
        [engine] = [s for s in request["spans"] if s["kind"] == "engine"]
        assert request["ended"] == end and engine["finish"] == end, request
        assert engine["output_tokens"] == 0 and engine["weight_versions"] == []
        assert request["committed_s"] is None and request["arrival_s"] <= engine["start_s"] <= engine["end_s"]


def test_a_call_that_raised_ends_as_error_or_cancelled() -> None:
    assert call_end(EngineUnavailableError("down")) == "error"
    assert call_end(KeyboardInterrupt()) == "error"
    assert call_end(BaseExceptionGroup("both", [KeyboardInterrupt(), EngineUnavailableError("down")])) == "error"
