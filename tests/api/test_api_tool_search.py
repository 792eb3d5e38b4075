"""Claude Code's tool search on ``/v1/messages``: deferred tools, ``tool_reference`` items and the
tool-search blocks are refused with a 400 that names ``ENABLE_TOOL_SEARCH`` (and, for deferred
tools, ``defer_loading``, which Claude Code matches to send the request again without them).

Request shapes as Claude Code 2.1.332 sends them with ``ENABLE_TOOL_SEARCH=true``: a custom
``ToolSearch`` tool plus a ``DeferredToolPlaceholder`` with ``defer_loading: true``; the API's own
variant adds a ``tool_search_tool_regex_20251119`` server tool, ``server_tool_use`` /
``tool_search_tool_result`` blocks and ``tool_reference`` items in tool results.
"""

from __future__ import annotations

from typing import Any

import pytest

from relaxtrio import InvalidRequestError
from relaxtrio.api.messages import parse_messages_request

BASH = {"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
SEARCH = {"name": "ToolSearch", "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}
PLACEHOLDER = {"name": "DeferredToolPlaceholder", "description": "never call this tool",
               "input_schema": {"type": "object", "properties": {}}, "defer_loading": True}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {"query": "select:WebFetch"}}


def _body(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "policy", "max_tokens": 64, "messages": messages, "tools": tools}


def _refused(body: dict[str, Any]) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        parse_messages_request(body)
    assert "ENABLE_TOOL_SEARCH=false" in info.value.message
    assert info.value.message.startswith(info.value.param)
    return info.value


def test_a_deferred_tool_is_refused_naming_the_variable_and_defer_loading() -> None:
    error = _refused(_body([{"role": "user", "content": "hi"}], [BASH, SEARCH, PLACEHOLDER]))
    assert error.param == "tools[2].defer_loading"
    assert error.http_status == 400 and error.anthropic_type == "invalid_request_error"


def test_the_same_tools_without_deferral_are_served() -> None:
    parsed = parse_messages_request(_body([{"role": "user", "content": "hi"}],
                                          [BASH, SEARCH, {**PLACEHOLDER, "defer_loading": False}]))
    assert [t["function"]["name"] for t in parsed.turn.conversation.tools] == [
        "Bash", "ToolSearch", "DeferredToolPlaceholder"]


@pytest.mark.parametrize(("messages", "param"), [
    ([{"role": "user", "content": "find a fetch tool"},
      {"role": "assistant", "content": [CALL]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                     "content": [{"type": "tool_reference", "tool_name": "WebFetch"}]}]}],
     "messages[2].content[0].content[0].type"),
    ([{"role": "user", "content": "find a fetch tool"},
      {"role": "assistant", "content": [{"type": "server_tool_use", "id": "srvtoolu_1",
                                         "name": "tool_search_tool_regex", "input": {"query": "fetch"}}]}],
     "messages[1].content[0].type"),
    ([{"role": "user", "content": [{"type": "text", "text": "x"},
                                   {"type": "tool_search_tool_result", "tool_use_id": "srvtoolu_1", "content": {}}]}],
     "messages[0].content[1].type"),
])
def test_tool_search_blocks_are_refused_naming_the_variable(messages: list[dict[str, Any]], param: str) -> None:
    assert _refused(_body(messages, [BASH, SEARCH])).param == param
