"""An OpenAI Agents SDK agent (Responses and Chat Completions models, one function tool) runs as a
real agent subprocess against the real server, and every one of its turns lands in one lineage."""

from __future__ import annotations

import pytest

import json
import os
import sys
from pathlib import Path

import trio
from tests.api.api_helpers import scripted_pipeline, tool_call_text
from tests.support.apps import serve_app
from tests.support.sessions import open_session

from relaxtrio.api.app import create_app
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.forest import ResponseNode
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.testing.scripted_engine import Reply

pytestmark = pytest.mark.slow  # starts real processes

AGENT_SCRIPT = Path(__file__).with_name("agents_sdk_agent.py")


async def test_agents_sdk_agent_with_a_function_tool(registry: SessionRegistry, compiler: ChatCompiler) -> None:
    handler, engine = scripted_pipeline(compiler, [
        Reply(text="<think>Ask the tool.</think>" + tool_call_text("get_weather", {"city": "Paris"})),
        Reply(text="Paris is sunny."),
        Reply(text=tool_call_text("get_weather", {"city": "Rome"})),
        Reply(text="Rome is sunny."),
    ])
    app = create_app(registry, handler)
    with trio.fail_after(120):
        async with serve_app(app) as base_url, open_session(registry) as session:
            env = {**os.environ, "RELAX_BASE_URL": base_url, "RELAX_SESSION_ID": session.session_id,
                   "OPENAI_AGENTS_DISABLE_TRACING": "1", "OPENAI_API_KEY": "unused"}
            done = await trio.run_process([sys.executable, str(AGENT_SCRIPT)], env=env, capture_stdout=True,
                                          capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    report = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert report == {"outputs": {"responses": "Paris is sunny.", "chat": "Rome is sunny."},
                      "tool_calls": ["Paris", "Rome"]}
    assert len(engine.calls) == 4
    leaves = session.forest.leaves()
    assert len(leaves) == 2, "each agent run is one lineage: every follow-up matched the committed turn"
    for leaf in leaves:
        lineage = session.forest.lineage(leaf)
        assert [type(node).__name__ for node in lineage] == [
            "ObservationNode", "ResponseNode", "ObservationNode", "ResponseNode"]
        assert isinstance(leaf, ResponseNode) and leaf.finish_reason == "stop"
