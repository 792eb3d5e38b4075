"""Responses tools that are not plain functions: ``custom`` (freeform) and ``namespace``.

Projection (docs/agent-contract.md#responses-tools):

* ``{"type": "function", "name", "parameters"?, "description"?}`` → a function tool, as before;
* ``{"type": "custom", "name", "description"?, "format"?}`` (Codex's freeform ``apply_patch``,
  whose ``format`` is ``{"type": "grammar", "syntax": "lark", "definition": ...}`` or
  ``{"type": "text"}``) → a function tool of the same name taking one string argument
  ``input``; its description is the tool's own, followed by the format (the grammar's syntax
  and definition verbatim), so the model sees what the raw text must look like. A call the
  model makes to it goes back to the client in the client's own item type, a
  ``custom_tool_call`` with the raw ``input`` text, and the client's replayed
  ``custom_tool_call`` / ``custom_tool_call_output`` items project onto the same assistant call
  ``{"input": <text>}`` and tool message, so the echo matches the committed turn;
* ``{"type": "namespace", "name", "description"?, "tools": [function tools]}`` (Codex's
  sub-agent tools, ``multi_agent_v1`` with ``spawn_agent``, ``send_input``, ``wait_agent``, ...)
  → each function tool of the namespace, under its own name (the model sees plain function
  tools); a call the model makes to one goes back as a ``function_call`` with that ``name`` and
  the ``namespace``, as Codex sends and expects it, and Codex's replayed call (``name`` plus
  ``namespace``) projects onto the same call. A tool of another type inside a namespace, or a
  name that two tools share, is a 400 naming it;
* hosted tools the server itself would run (``web_search``, ``file_search``, ``local_shell``,
  ``computer_use_preview``, ``image_generation``, ``code_interpreter``, ``mcp``, ...) are not
  tools the model can call here: they are left out and reported in ``Projection.ignored``
  (logged once per Session and counted, docs/agent-contract.md#ignored-request-fields; also
  under ``--agentic-strict-request-fields``, which never refused them).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any, Final

from .._errors import InvalidRequestError
from .._validate import require_list, require_object
from .fields import non_empty_str
from .options import IgnoredField
from .projection import Projection

CUSTOM_INPUT_KEY: Final = "input"
"""The one argument a projected custom tool takes: the raw freeform text."""


def _custom_schema() -> dict[str, Any]:
    return {"type": "object", "properties": {CUSTOM_INPUT_KEY: {"type": "string"}},
            "required": [CUSTOM_INPUT_KEY]}


def _custom_description(tool: Mapping[str, Any], path: str) -> str:
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequestError(f"{path}.description must be a string", param=f"{path}.description")
    parts = [description] if description else []
    fmt = tool.get("format")
    if fmt is not None:
        require_object(fmt, f"{path}.format")
        kind = fmt.get("type")
        if kind == "grammar":
            syntax = fmt.get("syntax")
            definition = non_empty_str(fmt.get("definition"), f"{path}.format.definition")
            parts.append(f"Call it with one argument `input`: raw text that follows this "
                         f"{syntax if isinstance(syntax, str) else 'grammar'} grammar:\n{definition}")
        elif kind in (None, "text"):
            parts.append("Call it with one argument `input`: raw text.")
        else:
            raise InvalidRequestError(f"{path}.format.type {kind!r} is not supported", param=f"{path}.format.type")
    else:
        parts.append("Call it with one argument `input`: raw text.")
    return "\n\n".join(parts)


def _function_tool(tool: Mapping[str, Any], path: str, proj: Projection, taken: Collection[str]) -> str:
    """Adds one Responses function tool; returns its name (which must not be in ``taken``)."""
    name = non_empty_str(tool.get("name"), f"{path}.name")
    schema = tool.get("parameters")
    if schema is not None and not isinstance(schema, dict):
        raise InvalidRequestError(f"{path}.parameters must be a JSON object", param=f"{path}.parameters")
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequestError(f"{path}.description must be a string", param=f"{path}.description")
    if name in taken:
        raise InvalidRequestError(f"{path}.name {name!r} is the name of an earlier tool: the function tools "
                                  "of a namespace are shown to the model under their own names",
                                  param=f"{path}.name")
    proj.add_tool(name, schema, description, path)
    return name


def _namespace_tools(tool: Mapping[str, Any], path: str, proj: Projection, namespaces: dict[str, str]) -> None:
    """Adds the function tools of a ``namespace`` tool, recording each one's namespace."""
    namespace = non_empty_str(tool.get("name"), f"{path}.name")
    children = require_list(tool.get("tools"), f"{path}.tools")
    for index, child in enumerate(children):
        child_path = f"{path}.tools[{index}]"
        require_object(child, child_path)
        if child.get("type") != "function":
            raise InvalidRequestError(f"{child_path}.type {child.get('type')!r} is not supported: a namespace "
                                      "is served with its function tools only", param=f"{child_path}.type")
        taken = {t["function"]["name"] for t in proj.tools}
        namespaces[_function_tool(child, child_path, proj, taken)] = namespace


def project_responses_tools(tools: Any, proj: Projection) -> tuple[frozenset[str], dict[str, str]]:
    """Projects a Responses ``tools`` list; returns the names of the custom (freeform) tools and
    the namespace of each function tool that came in a ``namespace`` tool.

    Raises:
        InvalidRequestError: not a list, a bad entry, a name two tools share, a namespace entry
            that is no function tool, or an unsupported custom format.
    """
    if tools is None:
        return frozenset(), {}
    require_list(tools, "tools")
    custom: set[str] = set()
    namespaces: dict[str, str] = {}
    for index, tool in enumerate(tools):
        path = f"tools[{index}]"
        require_object(tool, path)
        kind = tool.get("type")
        if kind == "function":
            _function_tool(tool, path, proj, namespaces)
        elif kind == "custom":
            name = non_empty_str(tool.get("name"), f"{path}.name")
            proj.add_tool(name, _custom_schema(), _custom_description(tool, path), path)
            custom.add(name)
        elif kind == "namespace":
            _namespace_tools(tool, path, proj, namespaces)
        else:  # hosted: run by OpenAI's servers, never by the agent; left out in either mode
            proj.ignored.append(IgnoredField(
                param=path, key=f"tools:{kind}", dropped=True, refused_when_strict=False,
                message=f"{path} ({kind}) is a hosted tool: the model cannot call it here; left out"))
    return frozenset(custom), namespaces


def custom_call_arguments(item: Mapping[str, Any], path: str) -> str:
    """The canonical arguments of a replayed ``custom_tool_call`` item (``{"input": text}``)."""
    text = item.get("input")
    if not isinstance(text, str):
        raise InvalidRequestError(f"{path}.input must be a string", param=f"{path}.input")
    return json.dumps({CUSTOM_INPUT_KEY: text}, ensure_ascii=False)


def custom_call_item(call: Mapping[str, Any], item_id: str) -> dict[str, Any]:
    """The ``custom_tool_call`` output item of a committed call to a custom tool."""
    arguments = json.loads(call["function"]["arguments"])
    text = arguments.get(CUSTOM_INPUT_KEY) if isinstance(arguments, dict) else None
    if not isinstance(text, str):  # the model wrote other arguments: hand over their JSON text
        text = call["function"]["arguments"]
    return {"id": item_id, "type": "custom_tool_call", "status": "completed", "call_id": call["id"],
            "name": call["function"]["name"], "input": text}
