"""Both servers of a run, live on 127.0.0.1: the embedded engine (tiny model, in-process) and the
agent API in front of it, with one leased Session; and the checks that both still serve."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

import attrs
import httpx
import trio

from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.config import GenerationConfig
from relaxtrio.engine.server import EngineConfig, serve_engine
from relaxtrio.models import load_tokenizer
from relaxtrio.nursery.session import Session, SessionRegistry
from relaxtrio.rollout.turns import EngineTurnHandler
from tests.support.apps import serve_agent_api
from tests.support.sessions import open_session
from tests.support.fleets import open_fleet_of_one

CHAT_PATH = "/agentic_api/v1/chat/completions"
CHAT_BODY = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Say something."}],
                        "max_tokens": 4}).encode()
GENERATE_BODY = json.dumps({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3}}).encode()


@attrs.frozen
class LiveStack:
    """Ports of the two servers and the Session's bearer token."""

    api_url: str
    engine_url: str
    token: str
    session: Session

    @property
    def api_port(self) -> int:
        return urlsplit(self.api_url).port or 0

    @property
    def engine_port(self) -> int:
        return urlsplit(self.engine_url).port or 0

    @property
    def auth(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.token}"), ("content-type", "application/json")]


@asynccontextmanager
async def open_live_stack(model_dir: Path) -> AsyncIterator[LiveStack]:
    """Serves the engine and the API until the context exits (both cancelled then).

    Cancellation:
        Exiting closes the Session (turns still running are cancelled) and both servers.
    """
    compiler = ChatCompiler(load_tokenizer(model_dir))
    config = GenerationConfig(max_response_tokens=4, seed=3, tool_call_parser=None, reasoning_parser=None)
    registry = SessionRegistry()
    async with trio.open_nursery() as nursery:
        engine_url = await nursery.start(serve_engine, EngineConfig(model_path=model_dir, max_running_requests=4))
        async with open_fleet_of_one(engine_url) as engine:
            handler = EngineTurnHandler(client=engine, compiler=compiler, config=config)
            async with serve_agent_api(registry, handler, model_name="tiny") as api_url, \
                    open_session(registry, budget_s=600) as session:
                yield LiveStack(api_url=api_url.rstrip("/").removesuffix("/agentic_api"),
                                engine_url=engine_url, token=session.session_id, session=session)
        nursery.cancel_scope.cancel()


async def assert_serving(stack: LiveStack) -> None:
    """Both servers answer ``/health`` on a new connection, a real turn succeeds through the API,
    and a real ``/generate`` succeeds on the engine."""
    async with httpx.AsyncClient(timeout=60.0) as http:  # a loaded 2-core machine is slow, not dead
        assert (await http.get(stack.api_url + "/health")).status_code == 200
        assert (await http.get(stack.engine_url + "/health")).status_code == 200
        chat = await http.post(stack.api_url + CHAT_PATH, content=CHAT_BODY, headers=dict(stack.auth))
        assert chat.status_code == 200, chat.text
        assert chat.json()["choices"][0]["message"]["role"] == "assistant"
        generate = await http.post(stack.engine_url + "/generate", content=GENERATE_BODY)
        assert generate.status_code == 200, generate.text
        assert len(generate.json()["output_ids"]) >= 1
