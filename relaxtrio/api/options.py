"""Request options relaxtrio cannot honour: refused with a 400 naming the field, never dropped.

A client that asks for something relaxtrio does not do (several choices, alternative
logprobs, a forced tool call, a JSON-constrained answer, an input item it cannot replay)
gets a 400 ``invalid_request_error`` whose ``param`` is the field it sent, instead of an
answer that quietly ignores the request. What each protocol honours, ignores harmlessly or
refuses is listed in docs/agent-contract.md (the Chat Completions, Responses and Anthropic
Messages sections); these checks run where each protocol module parses its body.

Values that the harnesses send by default stay accepted: ``n: 1``, ``tool_choice: "auto"``
(Anthropic ``{"type": "auto"}``), ``parallel_tool_calls`` (either value),
``response_format`` / ``text.format`` of type ``text``, ``top_logprobs: 0`` and Codex's
``include: ["reasoning.encrypted_content"]``.

The Responses item types below are the members of the API's input item union
(https://platform.openai.com/docs/api-reference/responses/create; ``ResponseInputItemParam`` in
openai-python 3.57) that relaxtrio does not project.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .._errors import InvalidRequestError
from .._validate import is_int, require_list, require_object
from .fields import optional_bool

RESPONSES_BUILTIN_ITEMS: Final = frozenset({
    "file_search_call", "computer_call", "computer_call_output", "web_search_call",
    "tool_search_call", "tool_search_output", "additional_tools", "image_generation_call",
    "code_interpreter_call", "local_shell_call", "local_shell_call_output", "shell_call",
    "shell_call_output", "apply_patch_call", "apply_patch_call_output", "mcp_list_tools",
    "mcp_approval_request", "mcp_approval_response", "mcp_call", "program", "program_output",
})
"""Responses input item types of built-in (hosted) tools: their calls run on OpenAI's side or in
a client tool the model cannot call here (hosted tools are left out of the prompt)."""

RESPONSES_STATE_ITEMS: Final = frozenset({"item_reference", "compaction", "compaction_trigger",
                                          "configuration_update"})
"""Responses input item types that refer to state kept by the server: relaxtrio stores no
responses and does not compact, so the full history must be sent as items."""


def responses_item_type_error(kind: Any, path: str) -> InvalidRequestError:
    """The 400 for a Responses input item whose ``type`` relaxtrio does not project.

    Args:
        kind: the item's ``type`` value.
        path: the item's path (``input[3]``).
    """
    param = f"{path}.type"
    if not isinstance(kind, str):
        return InvalidRequestError(f"{param} must be a string", param=param)
    if kind in RESPONSES_BUILTIN_ITEMS:
        why = "built-in tool items cannot be replayed: only function and custom tools are served"
    elif kind in RESPONSES_STATE_ITEMS:
        why = "it refers to server-side state: relaxtrio stores no responses, send the full history as items"
    else:
        why = "it is not a Responses input item type"
    return InvalidRequestError(f"{param} {kind!r} is not supported: {why}", param=param)


def _has_tools(body: Mapping[str, Any]) -> bool:
    tools = body.get("tools")
    return isinstance(tools, list) and bool(tools)


def _tool_choice(value: Any, param: str, *, has_tools: bool) -> None:
    """``auto`` is what relaxtrio does; ``none`` only holds when no tool is offered."""
    if value is None or value == "auto" or (value == "none" and not has_tools):
        return
    raise InvalidRequestError(
        f"{param} {value!r} is not supported: the model decides whether to call the offered tools "
        "(send 'auto', or leave the tools out)", param=param)


def _top_logprobs(body: Mapping[str, Any]) -> None:
    value = body.get("top_logprobs")
    if value is None:
        return
    if not is_int(value) or value < 0:
        raise InvalidRequestError("top_logprobs must be a non-negative integer", param="top_logprobs")
    if value > 0:
        raise InvalidRequestError("top_logprobs must be 0: only the sampled token's logprob is returned",
                                  param="top_logprobs")


def _text_format(value: Any, param: str) -> None:
    """A ``response_format`` / ``text.format`` object; only plain text is produced."""
    fmt = require_object(value, param, optional=True)
    if fmt is None or fmt.get("type") == "text":
        return
    raise InvalidRequestError(
        f"{param}.type {fmt.get('type')!r} is not supported: generation is not constrained to a schema",
        param=f"{param}.type")


def _chat_tools(tools: Any) -> None:
    """Every Chat ``tools`` entry must be a function tool the model can be shown.

    The forest's canonical tools keep only ``{"type": "function", "function": {...}}``
    entries; anything else offered over Chat Completions would vanish from the prompt while the
    agent believes the model has it, so it is refused here instead.
    """
    if tools is None:
        return
    for index, tool in enumerate(require_list(tools, "tools")):
        path = f"tools[{index}]"
        kind = require_object(tool, path).get("type")
        if kind != "function":
            raise InvalidRequestError(
                f"{path}.type {kind!r} is not supported: only function tools are served over Chat "
                "Completions", param=f"{path}.type")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise InvalidRequestError(f"{path}.function must be an object", param=f"{path}.function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(f"{path}.function.name must be a non-empty string",
                                      param=f"{path}.function.name")
        # Absent or null parameters are allowed (OpenAI's schema: a function without arguments).
        if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
            raise InvalidRequestError(f"{path}.function.parameters must be a JSON object",
                                      param=f"{path}.function.parameters")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise InvalidRequestError(f"{path}.function.description must be a string",
                                      param=f"{path}.function.description")


def check_chat_options(body: Mapping[str, Any]) -> None:
    """Refuses Chat Completions options that would otherwise be dropped.

    Raises:
        InvalidRequestError: ``n`` other than 1 (``param`` ``n``), ``top_logprobs`` above 0,
            ``tool_choice`` other than ``auto`` (or ``none`` without tools), a
            ``response_format`` other than ``text`` (``response_format.type``), the legacy
            ``functions`` / ``function_call``, a non-boolean ``parallel_tool_calls``, or a
            ``tools`` entry that is not a named function tool (``tools[i].type``,
            ``tools[i].function``, ``tools[i].function.name``).
    """
    n = body.get("n")
    if n is not None:
        if not is_int(n) or n < 1:
            raise InvalidRequestError("n must be a positive integer", param="n")
        if n != 1:
            raise InvalidRequestError(f"n must be 1: relaxtrio samples one choice per request, got {n} "
                                      "(send n requests instead)", param="n")
    _top_logprobs(body)
    _tool_choice(body.get("tool_choice"), "tool_choice", has_tools=_has_tools(body))
    _text_format(body.get("response_format"), "response_format")
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise InvalidRequestError(f"{legacy} is not supported: send the functions as tools", param=legacy)
    optional_bool(body, "parallel_tool_calls")
    _chat_tools(body.get("tools"))


def check_responses_options(body: Mapping[str, Any]) -> None:
    """Refuses Responses options that would otherwise be dropped.

    Raises:
        InvalidRequestError: ``top_logprobs`` above 0, ``include`` asking for
            ``message.output_text.logprobs`` (``include[i]``), ``tool_choice`` other than
            ``auto`` (or ``none`` without tools), ``text.format`` other than ``text``
            (``text.format.type``), or a non-boolean ``parallel_tool_calls``.
    """
    _top_logprobs(body)
    include = body.get("include")
    if include is not None:
        for index, entry in enumerate(require_list(include, "include")):
            if entry == "message.output_text.logprobs":
                raise InvalidRequestError(f"include[{index}] {entry!r} is not supported: Responses answers "
                                          "carry no logprobs", param=f"include[{index}]")
    _tool_choice(body.get("tool_choice"), "tool_choice", has_tools=_has_tools(body))
    text = require_object(body.get("text"), "text", optional=True)
    if text is not None:
        _text_format(text.get("format"), "text.format")
    optional_bool(body, "parallel_tool_calls")


def check_messages_options(body: Mapping[str, Any]) -> None:
    """Refuses Anthropic Messages options that would otherwise be dropped.

    ``output_config.effort`` (Claude Code sends ``high``) is ignored like ``thinking.budget_tokens``.

    Raises:
        InvalidRequestError: ``tool_choice`` that is not an object (``tool_choice``) or whose
            ``type`` is not ``auto`` (or ``none`` without tools; ``tool_choice.type``), a
            structured-output schema (``output_config.format``, or the beta ``output_format``),
            or a non-empty ``mcp_servers`` (their tools run on Anthropic's side).
    """
    choice = require_object(body.get("tool_choice"), "tool_choice", optional=True)
    if choice is not None:
        if choice.get("type") is None:
            raise InvalidRequestError("tool_choice.type is required", param="tool_choice.type")
        _tool_choice(choice.get("type"), "tool_choice.type", has_tools=_has_tools(body))
    output_config = require_object(body.get("output_config"), "output_config", optional=True)
    for param, value in (("output_config.format", None if output_config is None else output_config.get("format")),
                         ("output_format", body.get("output_format"))):
        if value is not None:
            raise InvalidRequestError(f"{param} is not supported: generation is not constrained to a schema",
                                      param=param)
    servers = body.get("mcp_servers")
    if servers is not None and servers != []:
        raise InvalidRequestError("mcp_servers is not supported: their tools run on Anthropic's side; "
                                  "declare them as custom tools", param="mcp_servers")
