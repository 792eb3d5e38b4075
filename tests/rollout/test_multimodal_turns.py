"""The turn handler with images: what it commits, what it sends, and what it refuses (scripted engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from tests.support.sessions import leased_session
from tests.support.images import closed_port_url, data_url
from tests.support.chat import observation

from relaxtrio import ContextLengthExceededError, InvalidRequestError
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.config import GenerationConfig
from relaxtrio.forest import Conversation
from relaxtrio.models import load_tokenizer
from relaxtrio.nursery.session import Session
from relaxtrio.nursery.turns import TurnRequest
from relaxtrio.rollout.turns import EngineTurnHandler
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine


class RecordingEngine(ScriptedEngine):
    """The scripted engine, also recording each call's ``image_data``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.image_data: list[list[str] | None] = []

    async def generate(self, input_ids, sampling, *, rid, return_logprob=True, **extra):
        self.image_data.append(extra.get("image_data"))
        return await super().generate(input_ids, sampling, rid=rid, return_logprob=return_logprob)


def _session(max_context_tokens: int | None) -> Session:
    return leased_session(group_id="train:group_mm_turns", max_context_tokens=max_context_tokens)


def _request(*messages: dict) -> TurnRequest:
    return TurnRequest(conversation=Conversation.from_wire(list(messages)))


def _user(text: str, *urls: str) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": text},
                                        *({"type": "image_url", "image_url": {"url": u}} for u in urls)]}


def _handler(compiler: ChatCompiler, replies: list[Reply]) -> tuple[EngineTurnHandler, RecordingEngine]:
    engine = RecordingEngine(tokenizer=compiler.tokenizer, eos_id=compiler.tokenizer.eos_token_id, replies=replies)
    handler = EngineTurnHandler(client=engine, compiler=compiler,  # type: ignore[arg-type]
                                config=GenerationConfig(max_response_tokens=8))
    return handler, engine


async def test_turns_send_lineage_images_and_commit_both_views(vlm_compiler: ChatCompiler) -> None:
    one, two = data_url(56, 84, seed=1), data_url(28, 56, seed=2)
    handler, engine = _handler(vlm_compiler, [Reply(text="A dog."), Reply(text="A cat."), Reply(text="ok")])
    session = _session(4096)
    first = _user("What is this?", one)
    with trio.fail_after(30):
        result1 = await handler.complete(session.turn_context(), _request(first))
        reply1 = {"role": "assistant", "content": "A dog."}
        result2 = await handler.complete(session.turn_context(), _request(first, reply1, _user("And this?", two)))
        text_only = await handler.complete(session.turn_context(), _request({"role": "user", "content": "no image"}))
    assert result2.message["content"] == "A cat."
    assert engine.image_data == [[one], [one, two], None]  # every image of the lineage, in order
    forest = session.forest
    obs1, resp1, obs2, resp2 = forest.lineage(forest.get(result2.state_hash))
    pad = vlm_compiler.vision.image_token_id
    assert obs1.rollout_token_ids.count(pad) == 1 and obs1.token_ids.count(pad) == 6
    assert obs2.rollout_token_ids.count(pad) == 1 and obs2.token_ids.count(pad) == 2
    # The engine gets the rollout view; usage counts the training view.
    assert engine.calls[1][0] == forest.rollout_token_ids(obs2)
    assert result1.prompt_tokens == len(obs1.token_ids)
    assert result2.prompt_tokens == forest.train_token_count(obs2) == len(forest.rollout_token_ids(obs2)) + 5 + 1
    assert text_only.prompt_tokens == len(forest.lineage(forest.get(text_only.state_hash))[0].token_ids)


async def test_context_limit_counts_expanded_ids(vlm_compiler: ChatCompiler) -> None:
    message = _user("Describe.", data_url(84, 84, seed=3))  # 9 image tokens: 8 more than the placeholder
    obs = observation(vlm_compiler, [message], delta=False)
    handler, engine = _handler(vlm_compiler, [])
    session = _session(len(obs.rollout_token_ids) + 4)  # the rollout view would fit, the training view not
    with pytest.raises(ContextLengthExceededError) as caught:
        await handler.complete(session.turn_context(), _request(message))
    assert f"resulted in {len(obs.token_ids)} tokens" in caught.value.message
    assert len(session.forest) == 0 and not engine.calls  # nothing committed, nothing generated


async def test_unusable_images_are_refused_before_commit(vlm_compiler: ChatCompiler, tiny_model_dir: Path) -> None:
    handler, engine = _handler(vlm_compiler, [])
    session = _session(None)
    with pytest.raises(InvalidRequestError, match="cannot fetch remote image") as caught:
        await handler.complete(session.turn_context(), _request(_user("look", closed_port_url())))
    assert caught.value.param == "messages[0].content[1].image_url.url"
    text_compiler = ChatCompiler(load_tokenizer(tiny_model_dir))
    text_handler, _ = _handler(text_compiler, [])
    with pytest.raises(InvalidRequestError, match="text-only"):
        await text_handler.complete(session.turn_context(), _request(_user("look", data_url(28, 28))))
    assert len(session.forest) == 0 and not engine.calls


async def test_an_image_in_a_tool_result_reaches_the_engine(vlm_compiler: ChatCompiler) -> None:
    """Claude Code's Read of an image file / Codex's view_image: the image is a tool observation."""
    from relaxtrio.api.messages import parse_messages_request

    shot = data_url(28, 56, seed=3)
    data = shot.partition(",")[2]
    tools = [{"name": "Read", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}}]
    handler, engine = _handler(vlm_compiler, [
        Reply(text='<tool_call>\n{"name": "Read", "arguments": {"file_path": "shot.png"}}\n</tool_call>'),
        Reply(text="A red square.")])
    handler.config = GenerationConfig(max_response_tokens=64, tool_call_parser="hermes")
    session = _session(4096)
    history: list[dict] = [{"role": "user", "content": "What is in shot.png?"}]
    body = {"max_tokens": 64, "tools": tools, "messages": history}
    with trio.fail_after(30):
        first = await handler.complete(session.turn_context(), parse_messages_request(body).turn)
        [call] = first.message["tool_calls"]
        history += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": call["id"], "name": "Read",
                                               "input": {"file_path": "shot.png"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]}]}]
        second = await handler.complete(session.turn_context(), parse_messages_request(body).turn)
    assert second.message["content"] == "A red square."
    assert engine.image_data == [None, [shot]]
    leaf = session.forest.get(second.state_hash)
    assert session.forest.leaves() == (leaf,)
    observation = session.forest.lineage(leaf)[-2]
    assert observation.rollout_token_ids.count(vlm_compiler.vision.image_token_id) == 1
