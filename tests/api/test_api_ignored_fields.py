"""Request fields outside the contract's tables do not alter generation: ignored, logged once per
Session and counted; ``--agentic-strict-request-fields`` refuses them; malformed values stay 400s
(docs/agent-contract.md#ignored-request-fields)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest
from tests.api.api_helpers import ENDPOINTS, ScriptedHandler, post, scripted_pipeline
from tests.support.sessions import open_session

from relaxtrio.api.app import create_app
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.config import ApiConfig
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.nursery.turns import TurnRequest

CUSTOM_TOOL = {"name": "lookup", "description": "Look a word up", "input_schema": {"type": "object"}}
FUNCTION_TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
BASE = {
    "chat": {"messages": [{"role": "user", "content": "hi"}], "tools": [FUNCTION_TOOL]},
    "responses": {"input": "hi", "tools": [{"type": "function", "name": "lookup",
                                            "parameters": {"type": "object"}}]},
    "messages": {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tools": [CUSTOM_TOOL]},
}

# (protocol, extra fields, param of the strict 400, counted key). Each asks for something relaxtrio
# does not do; today's harnesses send them (the list), so each must leave generation as
# the same body without it would.
IGNORED = [
    ("chat", {"n": 2}, "n", "n"),
    ("chat", {"tool_choice": "required"}, "tool_choice", "tool_choice"),
    ("chat", {"tool_choice": {"type": "function", "function": {"name": "lookup"}}}, "tool_choice", "tool_choice"),
    ("chat", {"top_logprobs": 3}, "top_logprobs", "top_logprobs"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
     "response_format.type", "response_format.type"),
    ("chat", {"response_format": {"type": "json_object"}}, "response_format.type", "response_format.type"),
    ("chat", {"functions": [{"name": "f", "parameters": {}}]}, "functions", "functions"),
    ("chat", {"function_call": "auto"}, "function_call", "function_call"),
    ("responses", {"tool_choice": "required"}, "tool_choice", "tool_choice"),
    ("responses", {"top_logprobs": 2}, "top_logprobs", "top_logprobs"),
    ("responses", {"include": ["message.output_text.logprobs"]}, "include[0]",
     "include:message.output_text.logprobs"),
    ("responses", {"text": {"format": {"type": "json_object"}}}, "text.format.type", "text.format.type"),
    ("messages", {"tool_choice": {"type": "any"}}, "tool_choice.type", "tool_choice"),
    ("messages", {"tool_choice": {"type": "tool", "name": "lookup"}}, "tool_choice.type", "tool_choice"),
    ("messages", {"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "mcp_servers", "mcp_servers"),
    ("messages", {"output_config": {"format": {"type": "json_schema", "schema": {}}}},
     "output_config.format", "output_config.format"),
    ("messages", {"output_format": {"type": "json_schema", "schema": {}}}, "output_format", "output_format"),
    # Anthropic server tools beside a custom tool: run on Anthropic's side, left out of the prompt.
    ("messages", {"tools": [CUSTOM_TOOL, {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]},
     "tools[1].type", "tools:web_search_20250305"),
    ("messages", {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}, CUSTOM_TOOL]},
     "tools[0].type", "tools:web_fetch_20250910"),
    ("messages", {"tools": [CUSTOM_TOOL, {"type": "mcp_toolset", "mcp_server_name": "x"}]},
     "tools[1].type", "tools:mcp_toolset"),
]


def _generation_inputs(request: TurnRequest) -> tuple:
    """Everything of a turn that generation reads."""
    conv = request.conversation
    return (conv.messages, conv.tools, conv.template_kwargs, request.max_new_tokens, request.stop,
            request.seed, request.logprobs)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("protocol", "extra", "param", "key"), IGNORED)
async def test_fields_outside_the_tables_do_not_alter_generation(
        protocol: str, extra: dict, param: str, key: str, stream: bool, registry: SessionRegistry,
        caplog: pytest.LogCaptureFixture) -> None:
    """Default: the request is served exactly as the same body without the field (one choice,
    the same prompt and tools); the field is logged once per Session and counted per request."""
    handler = ScriptedHandler()
    app = create_app(registry, handler)
    async with open_session(registry) as session:
        status, answer, _ = await post(app, ENDPOINTS[protocol], {**BASE[protocol], "stream": stream},
                                       token=session.session_id)
        assert status == 200, answer
        assert session.ignored_request_fields == {}
        with caplog.at_level(logging.INFO, logger="relaxtrio.api"):
            for _ in range(2):
                status, answer, _ = await post(app, ENDPOINTS[protocol],
                                               {**BASE[protocol], **extra, "stream": stream},
                                               token=session.session_id)
                assert status == 200, answer
        assert session.ignored_request_fields == {key: 2}
    baseline, *with_field = handler.requests
    assert len(with_field) == 2
    assert all(_generation_inputs(r) == _generation_inputs(baseline) for r in with_field)
    lines = [r for r in caplog.records if "is ignored" in r.getMessage()]
    assert len(lines) == 1 and session.session_id in lines[0].getMessage()
    assert f"field {param} is ignored" in lines[0].getMessage()
    dropped = key.startswith("tools:") or key in ("mcp_servers", "functions")
    assert lines[0].levelno == (logging.WARNING if dropped else logging.INFO)
    if protocol == "chat" and not stream:
        assert len(answer["choices"]) == 1  # n: 2 still gets one choice


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("protocol", "extra", "param", "key"), IGNORED)
async def test_strict_request_fields_refuses_them(protocol: str, extra: dict, param: str, key: str, stream: bool,
                                                  registry: SessionRegistry) -> None:
    """--agentic-strict-request-fields: the 400 naming the field, before anything is generated."""
    handler = ScriptedHandler()
    app = create_app(registry, handler, config=ApiConfig(strict_request_fields=True))
    async with open_session(registry) as session:
        status, answer, headers = await post(app, ENDPOINTS[protocol], {**BASE[protocol], **extra, "stream": stream},
                                             token=session.session_id)
        assert session.ignored_request_fields == {}
    assert status == 400 and headers["Content-Type"] == "application/json"
    error = answer["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith(f"{param} ")
    if protocol != "messages":
        assert error["param"] == param
    assert handler.requests == []


# Right field, wrong JSON type: malformed, a 400 in either mode. (protocol, extra, param)
MALFORMED = [
    ("chat", {"n": "2"}, "n"),
    ("chat", {"n": 0}, "n"),
    ("chat", {"tool_choice": 3}, "tool_choice"),
    ("chat", {"response_format": "json"}, "response_format"),
    ("chat", {"functions": {"name": "f"}}, "functions"),
    ("chat", {"function_call": 1}, "function_call"),
    ("chat", {"top_logprobs": -1}, "top_logprobs"),
    ("responses", {"tool_choice": ["auto"]}, "tool_choice"),
    ("responses", {"text": {"format": "json"}}, "text.format"),
    ("responses", {"include": "reasoning.encrypted_content"}, "include"),
    ("messages", {"tool_choice": {}}, "tool_choice.type"),
    ("messages", {"tool_choice": {"type": 1}}, "tool_choice.type"),
    ("messages", {"mcp_servers": {"url": "https://x"}}, "mcp_servers"),
    ("messages", {"output_format": "json"}, "output_format"),
    ("messages", {"output_config": {"format": []}}, "output_config.format"),
]


@pytest.mark.parametrize(("protocol", "extra", "param"), MALFORMED)
async def test_malformed_values_stay_400(protocol: str, extra: dict, param: str, registry: SessionRegistry) -> None:
    handler = ScriptedHandler()
    app = create_app(registry, handler)
    async with open_session(registry) as session:
        status, answer, _ = await post(app, ENDPOINTS[protocol], {**BASE[protocol], **extra},
                                       token=session.session_id)
        assert session.ignored_request_fields == {}
    assert status == 400 and answer["error"]["message"].startswith(f"{param} "), answer
    assert handler.requests == []


@pytest.mark.parametrize("strict", [False, True])
async def test_responses_hosted_tools_are_left_out_in_either_mode(strict: bool, registry: SessionRegistry) -> None:
    """They were never refused: strict mode keeps leaving them out (and counts them)."""
    handler = ScriptedHandler()
    app = create_app(registry, handler, config=ApiConfig(strict_request_fields=strict))
    body = {**BASE["responses"], "tools": [*BASE["responses"]["tools"], {"type": "web_search"}]}
    async with open_session(registry) as session:
        status, answer, _ = await post(app, ENDPOINTS["responses"], body, token=session.session_id)
        assert status == 200, answer
        assert session.ignored_request_fields == {"tools:web_search": 1}
    [request] = handler.requests
    assert [t["function"]["name"] for t in request.conversation.tools] == ["lookup"]


async def test_count_tokens_leaves_server_tools_out_like_a_model_request(registry: SessionRegistry,
                                                                         compiler: ChatCompiler) -> None:
    handler, _ = scripted_pipeline(compiler, [])
    body = {**BASE["messages"], "tools": [CUSTOM_TOOL, {"type": "web_search_20250305", "name": "web_search"}]}
    for strict, expected in ((False, 200), (True, 400)):
        app = create_app(registry, handler, config=ApiConfig(strict_request_fields=strict))
        async with open_session(registry) as session:
            status, answer, _ = await post(app, ENDPOINTS["messages"] + "/count_tokens", body,
                                           token=session.session_id)
        assert status == expected, answer


def test_the_flag_reaches_the_api_config(tmp_path: Path) -> None:
    """``--agentic-strict-request-fields`` → ``TrainRunConfig.api``, which the driver's app serves with."""
    from relaxtrio.cli.train_config import train_config
    from relaxtrio.cli.train_flags import add_train_parser

    data = tmp_path / "tasks.jsonl"
    data.write_text('{"input": [{"role": "user", "content": "x"}]}\n')
    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers(dest="command"))
    base = ["train", "--prompt-data", str(data), "--agent-cwd", str(tmp_path), "--agent-command", "true"]
    assert train_config(parser.parse_args(base)).api.strict_request_fields is False
    strict = train_config(parser.parse_args([*base, "--agentic-strict-request-fields"]))
    assert strict.api.strict_request_fields is True
