"""Plain turns end to end on the tiny real model: SDK → API → forest → embedded engine → commit.

No scripted engine here: the in-process engine (``serve_engine``) samples with the tiny random
model, so the texts are noise, but every id, logprob and usage count is real and must agree
between the HTTP answer and the committed forest, in all three protocols and both transports.
"""

from __future__ import annotations

from pathlib import Path

import anthropic
import openai
import pytest
import trio
from tests.support.apps import serve_agent_api
from tests.support.sessions import open_session

from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.config import GenerationConfig
from relaxtrio.engine.server import EngineConfig, serve_engine
from relaxtrio.forest import ResponseNode
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.rollout.turns import EngineTurnHandler
from tests.support.fleets import open_fleet_of_one

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|anthropic|httpx2|httpcore2)\.:ResourceWarning")]


async def test_plain_turns_on_the_tiny_model(registry: SessionRegistry, compiler: ChatCompiler,
                                             tiny_model_dir: Path) -> None:
    config = GenerationConfig(max_response_tokens=6, seed=7, tool_call_parser=None, reasoning_parser=None)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            engine_url = await nursery.start(serve_engine, EngineConfig(model_path=tiny_model_dir,
                                                                        max_running_requests=4))
            async with open_fleet_of_one(engine_url) as engine:
                handler = EngineTurnHandler(client=engine, compiler=compiler, config=config)
                async with (serve_agent_api(registry, handler, model_name="tiny") as base_url,
                            open_session(registry) as session):
                    oai = openai.AsyncOpenAI(base_url=base_url, api_key=session.session_id, max_retries=0)
                    claude = anthropic.AsyncAnthropic(base_url=base_url, api_key=session.session_id, max_retries=0)
                    models = await oai.models.list()
                    assert [m.id for m in models.data] == ["tiny"]

                    history = [{"role": "user", "content": "Say something."}]
                    chat = await oai.chat.completions.create(model="tiny", messages=history, logprobs=True)
                    leaf = session.forest.leaves()[0]
                    assert isinstance(leaf, ResponseNode)
                    assert chat.usage.completion_tokens == len(leaf.token_ids) <= 6
                    assert [e.logprob for e in chat.choices[0].logprobs.content] == list(leaf.rollout_logprobs)
                    assert (chat.choices[0].message.content or "") == leaf.message["content"]
                    assert chat.choices[0].finish_reason == leaf.finish_reason

                    history += [chat.choices[0].message.model_dump(), {"role": "user", "content": "More."}]
                    async with await oai.chat.completions.create(model="tiny", messages=history,
                                                                 stream=True) as stream:
                        [chunk] = [c async for c in stream]
                    assert chunk.usage.prompt_tokens > chat.usage.prompt_tokens

                    response = await oai.responses.create(model="tiny", input="Another topic.", max_output_tokens=3)
                    assert response.usage.output_tokens <= 3
                    assert response.status in ("completed", "incomplete")

                    message = await claude.messages.create(model="tiny", max_tokens=4,
                                                           messages=[{"role": "user", "content": "Hi."}])
                    assert message.usage.output_tokens <= 4
                    assert message.stop_reason in ("end_turn", "max_tokens")

                    # chat turn 1 → turn 2 is one lineage; responses and messages are new roots
                    lineages = [session.forest.lineage(leaf) for leaf in session.forest.leaves()]
                    assert sorted(sum(isinstance(n, ResponseNode) for n in lin) for lin in lineages) == [1, 1, 2]
                    await oai.close()
                    await claude.close()
            nursery.cancel_scope.cancel()
