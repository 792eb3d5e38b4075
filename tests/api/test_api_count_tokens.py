"""``POST /v1/messages/count_tokens`` with the official anthropic SDK (``messages.count_tokens``),
on the real turn pipeline over a scripted engine: the count is the prompt a Messages request with
the same body generates from (so it equals that turn's ``usage.input_tokens``), authenticated like
the model routes, and nothing is generated or committed."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
import trio
from tests.api.api_helpers import scripted_pipeline
from tests.support.apps import serve_app
from tests.support.sessions import open_session

from relaxtrio.api.app import create_app
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.testing.scripted_engine import Reply

pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(anthropic|httpx2|httpcore2)\.:ResourceWarning")

TOOLS = [{"name": "get_weather", "description": "Weather",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]


async def test_count_tokens_matches_the_turn_and_changes_nothing(registry: SessionRegistry,
                                                                 compiler: ChatCompiler) -> None:
    handler, engine = scripted_pipeline(compiler, [Reply(text="Sunny."), Reply(text="Still sunny.")])
    with trio.fail_after(30):
        async with serve_app(create_app(registry, handler)) as base_url, open_session(registry) as session:
            async with anthropic.AsyncAnthropic(base_url=base_url, api_key=session.session_id,
                                              max_retries=0) as claude:
                history = [{"role": "user", "content": "Weather in Paris?"}]
                counted = await claude.messages.count_tokens(model="tiny", system="Be brief.", messages=history)
                assert counted.input_tokens > 0
                assert len(session.forest) == 0 and engine.calls == []  # nothing committed, nothing generated

                with_tools = await claude.messages.count_tokens(model="tiny", system="Be brief.", messages=history,
                                                                tools=TOOLS)
                assert with_tools.input_tokens > counted.input_tokens

                reply = await claude.messages.create(model="tiny", max_tokens=8, system="Be brief.", messages=history)
                assert reply.usage.input_tokens == counted.input_tokens
                num_nodes = len(session.forest)

                # the next turn: the committed lineage plus the new observation
                history += [{"role": "assistant", "content": reply.content[0].text},
                            {"role": "user", "content": "And tomorrow?"}]
                counted = await claude.messages.count_tokens(model="tiny", system="Be brief.", messages=history)
                assert len(session.forest) == num_nodes and len(engine.calls) == 1
                reply = await claude.messages.create(model="tiny", max_tokens=8, system="Be brief.", messages=history)
                assert reply.usage.input_tokens == counted.input_tokens


async def test_count_tokens_routes_and_auth(registry: SessionRegistry, compiler: ChatCompiler) -> None:
    handler, engine = scripted_pipeline(compiler, [])
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Hi."}]})
    with trio.fail_after(30):
        async with serve_app(create_app(registry, handler)) as base_url, open_session(registry) as session, \
                httpx.AsyncClient(base_url=base_url, timeout=10.0) as http:
            auth = {"x-api-key": session.session_id, "content-type": "application/json"}
            counts = []
            for path in ("v1/messages/count_tokens", "messages/count_tokens"):
                answer = await http.post(path, content=body, headers=auth)
                assert answer.status_code == 200, answer.text
                assert list(answer.json()) == ["input_tokens"]
                counts.append(answer.json()["input_tokens"])
            assert counts[0] == counts[1] > 0

            missing = await http.post("v1/messages/count_tokens", content=body,
                                      headers={"content-type": "application/json"})
            assert missing.status_code == 401 and missing.json()["type"] == "error"
            unknown = await http.post("v1/messages/count_tokens", content=body,
                                      headers={**auth, "x-api-key": "session-" + "0" * 32})
            assert unknown.status_code == 401 and unknown.json()["error"]["type"] == "authentication_error"
            invalid = await http.post("v1/messages/count_tokens", content=json.dumps({"messages": "Hi."}),
                                      headers=auth)
            assert invalid.status_code == 400
            assert invalid.json()["error"]["type"] == "invalid_request_error"
            wrong_method = await http.get("v1/messages/count_tokens", headers=auth)
            assert wrong_method.status_code == 405 and wrong_method.json()["type"] == "error"
            assert len(session.forest) == 0 and engine.calls == []
