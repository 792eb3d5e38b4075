"""Images sent to a text-only policy (docs/client-quirks.md#images-sent-to-a-text-only-policy):
``--agentic-text-only-images refuse`` answers 400 naming the part; ``marker`` shows the model a
fixed text for each image on every turn, keeps one lineage, and counts each image once."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from tests.api.api_helpers import MESSAGES, assert_one_lineage, post, scripted_pipeline, tool_call_text
from tests.support.sessions import open_session

from relaxtrio.api.app import create_app
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.media.images import IMAGE_MARKER
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.testing.scripted_engine import Reply

PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
TOOLS = [{"name": "Read", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]


def _read_result(call_id: str) -> dict[str, Any]:
    """Claude Code's answer to a Read of a PNG: the image in a tool_result."""
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id,
                                         "content": [{"type": "image", "source": PNG}]}]}


def _pipeline(compiler: ChatCompiler, policy: str):
    handler, engine = scripted_pipeline(compiler, [
        Reply(text=tool_call_text("Read", {"path": "a.png"})),
        Reply(text=tool_call_text("Read", {"path": "b.png"})),
        Reply(text="Two pictures."),
    ], reasoning_parser=None)
    handler.config = attrs.evolve(handler.config, text_only_images=policy)
    return handler, engine


async def test_refuse_answers_400_naming_the_image(registry: SessionRegistry, compiler: ChatCompiler) -> None:
    assert compiler.vision is None  # the tiny test model is text-only
    handler, engine = _pipeline(compiler, "refuse")
    app = create_app(registry, handler)
    async with open_session(registry) as session:
        body: dict[str, Any] = {"model": "m", "max_tokens": 50, "tools": TOOLS,
                                "messages": [{"role": "user", "content": "Describe a.png"}]}
        status, first, _ = await post(app, MESSAGES, body, token=session.session_id)
        assert status == 200, first
        call_id = first["content"][0]["id"]
        body["messages"] += [{"role": "assistant", "content": first["content"]}, _read_result(call_id)]
        status, error, _ = await post(app, MESSAGES, body, token=session.session_id)
        assert status == 400 and "text-only" in error["error"]["message"]
        assert len(engine.calls) == 1 and session.images_as_text == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_marker_shows_each_image_as_text_on_every_turn(registry: SessionRegistry, compiler: ChatCompiler,
                                                            stream: bool) -> None:
    handler, engine = _pipeline(compiler, "marker")
    app = create_app(registry, handler)
    async with open_session(registry) as session:
        body: dict[str, Any] = {"model": "m", "max_tokens": 50, "tools": TOOLS, "stream": False,
                                "messages": [{"role": "user", "content": "Describe a.png and b.png"}]}
        for _ in range(2):
            status, reply, _ = await post(app, MESSAGES, body, token=session.session_id)
            assert status == 200, reply
            [call] = [b for b in reply["content"] if b["type"] == "tool_use"]
            body["messages"] += [{"role": "assistant", "content": reply["content"]}, _read_result(call["id"])]
        body["stream"] = stream
        status, last, _ = await post(app, MESSAGES, body, token=session.session_id)
        assert status == 200, last
        prompts = [compiler.tokenizer.decode(ids) for ids, _, _ in engine.calls]
        assert [p.count(IMAGE_MARKER) for p in prompts] == [0, 1, 2]  # every turn shows every image
        assert session.images_as_text == 2  # each image counted once, when it first arrived
        assert_one_lineage(session, responses=3)
