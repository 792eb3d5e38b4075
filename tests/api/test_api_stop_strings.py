"""Stop strings on every protocol, JSON and stream (docs/canonical-contract.md#decoding-a-reply):
an engine stops after the token that completes a stop string, and that token may go on past it;
the reply ends where the string starts, while the committed ids keep the whole sampled token, so
the agent's echo extends the committed node and the next prompt holds the sampled ids verbatim."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from tests.api.api_helpers import ENDPOINTS, assert_one_lineage, events, parse_sse, post, scripted_pipeline
from tests.support.sessions import open_session

from relaxtrio.api.app import create_app
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.testing.scripted_engine import Reply

STOP = " "
SAMPLED = "Hello w"
"""What the engine returns for "Hello world" with stop " ": through the token " w" that completed
the stop string (no_stop_trim), so the decoded text does not end with the stop string."""
FINISH = {"chat": "stop", "responses": "completed", "messages": "stop_sequence"}


def _body(protocol: str, stream: bool) -> dict[str, Any]:
    history = [{"role": "user", "content": "Say hello."}]
    if protocol == "chat":
        return {"model": "m", "messages": history, "stop": [STOP], "stream": stream}
    if protocol == "responses":  # no stop field in Responses: the server's stop strings apply
        return {"model": "m", "input": history, "stream": stream}
    return {"model": "m", "messages": history, "max_tokens": 50, "stop_sequences": [STOP], "stream": stream}


def _answer(protocol: str, payload: Any) -> tuple[str, str, Any]:
    """``(text, finish, stop_sequence)`` of a JSON body or an SSE stream (Messages reports the
    stop string; the others have no such field)."""
    if isinstance(payload, str):
        frames = [frame.json() for frame in events(parse_sse(payload)) if frame.data != "[DONE]"]
        if protocol == "chat":
            choices = [choice for frame in frames for choice in frame["choices"]]
            text = "".join(choice["delta"].get("content") or "" for choice in choices)
            return text, next(c["finish_reason"] for c in choices if c["finish_reason"]), None
        if protocol == "messages":
            text = "".join(f["delta"]["text"] for f in frames
                           if f["type"] == "content_block_delta" and f["delta"]["type"] == "text_delta")
            [delta] = [f["delta"] for f in frames if f["type"] == "message_delta"]
            return text, delta["stop_reason"], delta["stop_sequence"]
        # Responses streams whole items (response.output_item.done), then the final response.
        items = [f["item"] for f in frames if f["type"] == "response.output_item.done"]
        assert items == frames[-1]["response"]["output"]
        payload = frames[-1]["response"]
    if protocol == "chat":
        choice = payload["choices"][0]
        return choice["message"]["content"], choice["finish_reason"], None
    if protocol == "responses":
        [message] = [item for item in payload["output"] if item["type"] == "message"]
        return message["content"][0]["text"], payload["status"], None
    [block] = payload["content"]
    return block["text"], payload["stop_reason"], payload["stop_sequence"]


def _echo(protocol: str, body: dict[str, Any], text: str) -> dict[str, Any]:
    body = json.loads(json.dumps(body))
    turn = [{"role": "assistant", "content": text}, {"role": "user", "content": "Again."}]
    body["input" if protocol == "responses" else "messages"] += turn
    return body


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("protocol", sorted(ENDPOINTS))
async def test_a_stop_string_that_starts_inside_a_token_is_cut_from_the_reply(
        protocol: str, stream: bool, registry: SessionRegistry, compiler: ChatCompiler) -> None:
    sampled_ids = tuple(compiler.tokenizer.encode(SAMPLED, add_special_tokens=False))
    assert compiler.decode(sampled_ids[-1:]) == " w"  # the stop string begins the last token
    handler, engine = scripted_pipeline(compiler, [Reply(ids=sampled_ids, stop_string=STOP), Reply(text="Done.")],
                                        reasoning_parser=None)
    if protocol == "responses":
        handler.config = attrs.evolve(handler.config, stop=(STOP,))
    app = create_app(registry, handler)
    async with open_session(registry) as session:
        body = _body(protocol, stream)
        status, payload, _ = await post(app, ENDPOINTS[protocol], body, token=session.session_id)
        assert status == 200, payload
        assert _answer(protocol, payload) == ("Hello", FINISH[protocol], STOP if protocol == "messages" else None)
        assert engine.calls[0][1].stop == [STOP]
        [leaf] = session.forest.leaves()
        assert leaf.message["content"] == "Hello" and leaf.token_ids == sampled_ids  # every sampled id kept
        status, payload, _ = await post(app, ENDPOINTS[protocol], _echo(protocol, body, "Hello"),
                                        token=session.session_id)
        assert status == 200, payload
        assert_one_lineage(session, responses=2)
        first_input = engine.calls[0][0]
        assert engine.calls[1][0][: len(first_input) + len(sampled_ids)] == (*first_input, *sampled_ids)
