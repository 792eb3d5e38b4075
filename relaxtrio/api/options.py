"""Request options outside the contract's field tables: ignored and reported, or refused on demand.

The contract: request fields outside its tables do not alter generation. A client that asks for
something relaxtrio does not do (several choices, alternative logprobs, a forced tool call, a
JSON-constrained answer, tools that run on the provider's side) gets the ordinary answer: each
such option becomes an :class:`IgnoredField` of the parsed request, which the app logs once per
Session and counts (docs/agent-contract.md#ignored-request-fields).
``--agentic-strict-request-fields`` (``ApiConfig.strict_request_fields``) turns each of them back
into a 400 ``invalid_request_error`` naming the field, with the message the
:class:`IgnoredField` carries. A value of the wrong JSON type (``n: "2"``, ``tool_choice: 3``) is
malformed, not ignored: a 400 in both modes. These checks run where each protocol module parses
its body.

Values that ask for what relaxtrio does anyway are not reported: ``n: 1``, ``tool_choice:
"auto"`` (Anthropic ``{"type": "auto"}``), ``"none"`` without tools, ``parallel_tool_calls``
(either value), ``response_format`` / ``text.format`` of type ``text``, ``top_logprobs: 0`` and
Codex's ``include: ["reasoning.encrypted_content"]``.

The Responses item types below are the members of the API's input item union
(https://platform.openai.com/docs/api-reference/responses/create; ``ResponseInputItemParam`` in
openai-python 3.57) that relaxtrio does not project.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from .._errors import InvalidRequestError
from .._validate import is_int, require_list, require_object, type_name
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

ANTHROPIC_SERVER_TOOL_PREFIXES: Final = ("web_search_", "web_fetch_", "code_execution_", "tool_search_tool_")
"""Messages ``tools[i].type`` prefixes of Anthropic server tools (``web_search_20250305``, ...): run
by Anthropic's servers, so no one would answer the model's call here; they are left out of the
prompt (``mcp_toolset``, the tools of ``mcp_servers``, too). Anthropic-defined *client* tools
(``bash_*``, ``text_editor_*``, ``computer_*``, ``memory_*``) are not among them: the agent runs
those, so leaving them out would hide a tool it answers; they stay a 400. The tool-search server tools are refused before this list is consulted
(:func:`check_tool_search`)."""

RESPONSES_STATE_ITEMS: Final = frozenset({"item_reference", "compaction", "compaction_trigger",
                                          "configuration_update"})
"""Responses input item types that refer to state kept by the server: relaxtrio stores no
responses and does not compact, so the full history must be sent as items."""


CODEX_COMPACTION_HINT: Final = (
    "remote compaction is not served (a server-side summary is no text the policy wrote, so it "
    "cannot be trained): Codex uses it only for its built-in openai and azure providers, so point "
    "Codex at relaxtrio through a provider of its own ([model_providers.relaxtrio] and "
    "model_provider = \"relaxtrio\", as examples/codex does) and it compacts locally with a summary "
    "request of its own"
)
"""Why ``POST /v1/responses/compact`` and ``compaction`` / ``compaction_trigger`` items are refused,
and the Codex setting that avoids them (docs/client-quirks.md#codex-compaction)."""
CODEX_COMPACTION_ITEMS: Final = frozenset({"compaction", "compaction_trigger"})


def responses_item_type_error(kind: Any, path: str) -> InvalidRequestError:
    """The 400 for a Responses input item whose ``type`` relaxtrio does not project.

    Args:
        kind: the item's ``type`` value.
        path: the item's path (``input[3]``).
    """
    param = f"{path}.type"
    if not isinstance(kind, str):
        return InvalidRequestError(f"{param} must be a string", param=param)
    if kind in CODEX_COMPACTION_ITEMS:
        why = CODEX_COMPACTION_HINT
    elif kind in RESPONSES_BUILTIN_ITEMS:
        why = "built-in tool items cannot be replayed: only function and custom tools are served"
    elif kind in RESPONSES_STATE_ITEMS:
        why = "it refers to server-side state: relaxtrio stores no responses, send the full history as items"
    else:
        why = "it is not a Responses input item type"
    return InvalidRequestError(f"{param} {kind!r} is not supported: {why}", param=param)


@attrs.frozen(kw_only=True)
class IgnoredField:
    """A request option that does not alter generation here (module docstring).

    Attributes:
        param: the field's path in the request (``n``, ``tool_choice.type``, ``tools[2]``).
        key: a stable name for counting and the once-per-Session log line (``n``,
            ``tool_choice``, ``tools:web_search_20250305``): paths without indices.
        message: what the option asks for and why it is not done; the text of the 400 under
            ``--agentic-strict-request-fields``, which starts with ``param``.
        dropped: it removed something the agent offered (a tool, an MCP server) from the
            prompt, so it is logged as a warning rather than an info line.
        refused_when_strict: strict mode refuses it (Responses hosted tools were always left
            out, so they are not).
    """

    param: str
    key: str
    message: str
    dropped: bool = False
    refused_when_strict: bool = True

    def error(self) -> InvalidRequestError:
        """The 400 strict mode answers with."""
        return InvalidRequestError(self.message, param=self.param)


def _has_tools(body: Mapping[str, Any]) -> bool:
    tools = body.get("tools")
    return isinstance(tools, list) and bool(tools)


def _tool_choice(value: Any, param: str, *, has_tools: bool, key: str = "tool_choice") -> list[IgnoredField]:
    """``auto`` is what relaxtrio does; ``none`` only holds when no tool is offered; any other
    string or object is ignored (the model decides whether to call the offered tools)."""
    if value is None or value == "auto" or (value == "none" and not has_tools):
        return []
    if not isinstance(value, (str, dict)):
        raise InvalidRequestError(f"{param} must be a string or an object, got {type_name(value)}", param=param)
    return [IgnoredField(param=param, key=key, message=(
        f"{param} {value!r} is not supported: the model decides whether to call the offered tools "
        "(send 'auto', or leave the tools out)"))]


def _top_logprobs(body: Mapping[str, Any]) -> list[IgnoredField]:
    value = body.get("top_logprobs")
    if value is None:
        return []
    if not is_int(value) or value < 0:
        raise InvalidRequestError("top_logprobs must be a non-negative integer", param="top_logprobs")
    if value == 0:
        return []
    return [IgnoredField(param="top_logprobs", key="top_logprobs",
                         message="top_logprobs must be 0: only the sampled token's logprob is returned")]


def _text_format(value: Any, param: str) -> list[IgnoredField]:
    """A ``response_format`` / ``text.format`` object; only plain text is produced."""
    fmt = require_object(value, param, optional=True)
    if fmt is None or fmt.get("type") == "text":
        return []
    return [IgnoredField(param=f"{param}.type", key=f"{param}.type", message=(
        f"{param}.type {fmt.get('type')!r} is not supported: generation is not constrained to a schema"))]


def _chat_tools(tools: Any) -> None:
    """Every Chat ``tools`` entry must be a function tool the model can be shown.

    ``tools`` is one of the contract's fields: the forest's canonical tools keep only
    ``{"type": "function", "function": {...}}`` entries, and anything else offered over Chat
    Completions (a ``custom`` tool the agent would answer) would vanish from the prompt while the
    agent believes the model has it, so it is refused in both modes.
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


def _choices(body: Mapping[str, Any]) -> list[IgnoredField]:
    """``n``: one choice is sampled per request whatever it says (several would be several
    generations, each a branch; send several requests for that)."""
    n = body.get("n")
    if n is None:
        return []
    if not is_int(n) or n < 1:
        raise InvalidRequestError("n must be a positive integer", param="n")
    if n == 1:
        return []
    return [IgnoredField(param="n", key="n", message=(
        f"n must be 1: relaxtrio samples one choice per request, got {n} (send n requests instead)"))]


def _legacy_functions(body: Mapping[str, Any]) -> list[IgnoredField]:
    """The legacy ``functions`` / ``function_call``: not rendered (send the functions as tools)."""
    ignored = []
    functions = body.get("functions")
    if functions is not None:
        require_list(functions, "functions")
        ignored.append(IgnoredField(param="functions", key="functions", dropped=bool(functions),
                                    message="functions is not supported: send the functions as tools"))
    call = body.get("function_call")
    if call is not None:
        if not isinstance(call, (str, dict)):
            raise InvalidRequestError(f"function_call must be a string or an object, got {type_name(call)}",
                                      param="function_call")
        ignored.append(IgnoredField(param="function_call", key="function_call",
                                    message="function_call is not supported: send the functions as tools"))
    return ignored


def check_chat_options(body: Mapping[str, Any]) -> tuple[IgnoredField, ...]:
    """The Chat Completions options that do not alter generation here.

    Returns:
        One :class:`IgnoredField` per option asking for what is not done: ``n`` above 1,
        ``top_logprobs`` above 0, ``tool_choice`` other than ``auto`` (or ``none`` without
        tools), a ``response_format`` other than ``text`` (``response_format.type``), the
        legacy ``functions`` / ``function_call``.

    Raises:
        InvalidRequestError: a malformed value (``n`` not a positive integer, ``top_logprobs``
            negative, ``tool_choice`` neither string nor object, ``response_format`` not an
            object, ``functions`` not a list, a non-boolean ``parallel_tool_calls``), or a
            ``tools`` entry that is not a named function tool (``tools[i].type``,
            ``tools[i].function``, ``tools[i].function.name``).
    """
    ignored = [*_choices(body), *_top_logprobs(body),
               *_tool_choice(body.get("tool_choice"), "tool_choice", has_tools=_has_tools(body)),
               *_text_format(body.get("response_format"), "response_format"), *_legacy_functions(body)]
    optional_bool(body, "parallel_tool_calls")
    _chat_tools(body.get("tools"))
    return tuple(ignored)


def check_responses_options(body: Mapping[str, Any]) -> tuple[IgnoredField, ...]:
    """The Responses options that do not alter generation here (hosted tools are reported by
    :func:`~.responses_tools.project_responses_tools`).

    Returns:
        One :class:`IgnoredField` per option asking for what is not done: ``top_logprobs``
        above 0, an ``include`` entry asking for ``message.output_text.logprobs``
        (``include[i]``), ``tool_choice`` other than ``auto`` (or ``none`` without tools),
        ``text.format`` other than ``text`` (``text.format.type``).

    Raises:
        InvalidRequestError: a malformed value (``include`` not a list, ``text`` or
            ``text.format`` not an object, ``tool_choice`` neither string nor object, a
            non-boolean ``parallel_tool_calls``).
    """
    ignored = _top_logprobs(body)
    include = body.get("include")
    if include is not None:
        for index, entry in enumerate(require_list(include, "include")):
            if entry == "message.output_text.logprobs":
                ignored.append(IgnoredField(param=f"include[{index}]", key=f"include:{entry}", message=(
                    f"include[{index}] {entry!r} is not supported: Responses answers carry no logprobs")))
    ignored += _tool_choice(body.get("tool_choice"), "tool_choice", has_tools=_has_tools(body))
    text = require_object(body.get("text"), "text", optional=True)
    if text is not None:
        ignored += _text_format(text.get("format"), "text.format")
    optional_bool(body, "parallel_tool_calls")
    return tuple(ignored)


def check_messages_options(body: Mapping[str, Any]) -> tuple[IgnoredField, ...]:
    """The Anthropic Messages options that do not alter generation here (server tools are
    reported by the tool projection, :func:`anthropic_server_tool`).

    ``output_config.effort`` (Claude Code sends ``high``) is not reported, like
    ``thinking.budget_tokens``: it selects nothing the template could show.

    Returns:
        One :class:`IgnoredField` per option asking for what is not done: a ``tool_choice``
        whose ``type`` is not ``auto`` (or ``none`` without tools; ``tool_choice.type``), a
        structured-output schema (``output_config.format``, or the beta ``output_format``), a
        non-empty ``mcp_servers`` (their tools run on Anthropic's side; left out).

    Raises:
        InvalidRequestError: a malformed value (``tool_choice`` not an object or without
            ``type``, ``output_config`` / its ``format`` / ``output_format`` not an object,
            ``mcp_servers`` not a list).
    """
    ignored: list[IgnoredField] = []
    choice = require_object(body.get("tool_choice"), "tool_choice", optional=True)
    if choice is not None:
        if choice.get("type") is None:
            raise InvalidRequestError("tool_choice.type is required", param="tool_choice.type")
        if not isinstance(choice["type"], str):
            raise InvalidRequestError("tool_choice.type must be a string", param="tool_choice.type")
        ignored += _tool_choice(choice["type"], "tool_choice.type", has_tools=_has_tools(body), key="tool_choice")
    output_config = require_object(body.get("output_config"), "output_config", optional=True)
    for param, value in (("output_config.format", None if output_config is None else output_config.get("format")),
                         ("output_format", body.get("output_format"))):
        if require_object(value, param, optional=True) is not None:
            ignored.append(IgnoredField(param=param, key=param, message=(
                f"{param} is not supported: generation is not constrained to a schema")))
    servers = body.get("mcp_servers")
    if servers is not None and require_list(servers, "mcp_servers"):
        ignored.append(IgnoredField(param="mcp_servers", key="mcp_servers", dropped=True, message=(
            "mcp_servers is not supported: their tools run on Anthropic's side; declare them as custom tools")))
    return tuple(ignored)


def anthropic_server_tool(kind: Any, path: str, hint: str) -> IgnoredField | None:
    """The report of a Messages tool of ``type`` ``kind`` at ``path`` that Anthropic's servers
    run (:data:`ANTHROPIC_SERVER_TOOL_PREFIXES`, ``mcp_toolset``), left out of the prompt; None
    for any other type. ``hint``: what the strict 400 tells the client to do."""
    if not isinstance(kind, str) or not (kind.startswith(ANTHROPIC_SERVER_TOOL_PREFIXES) or kind == "mcp_toolset"):
        return None
    return IgnoredField(param=f"{path}.type", key=f"tools:{kind}", dropped=True,
                        message=f"{path}.type {kind!r} is not supported: it is a server tool (Anthropic "
                                f"runs it, so nothing would answer the model's call here); {hint}")


TOOL_SEARCH_HINT: Final = (
    "Claude Code's tool search (deferred tools found by a server-side search) is not served: the "
    "policy would be trained on a prompt whose tools change behind its back; start Claude Code "
    "with ENABLE_TOOL_SEARCH=false (examples/claude_code does), which sends every tool up front"
)
"""Why deferred tools and the tool-search server tools are refused (docs/client-quirks.md#claude-code-tool-search)."""


def check_tool_search(tools: Any) -> None:
    """Refuses a Messages ``tools`` list that uses tool search: a tool with ``defer_loading: true``
    or a ``tool_search_tool_*`` server tool (rendering deferred tools, or leaving them out,
    would show the policy another tool list than the agent offered).

    Raises:
        InvalidRequestError: naming the tool's field and ``ENABLE_TOOL_SEARCH``.
    """
    if not isinstance(tools, list):
        return
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            continue
        kind = tool.get("type")
        if isinstance(kind, str) and kind.startswith("tool_search_tool_"):
            param = f"tools[{index}].type"
            raise InvalidRequestError(f"{param} {kind!r} is not supported: {TOOL_SEARCH_HINT}", param=param)
        if tool.get("defer_loading") is True:
            param = f"tools[{index}].defer_loading"
            raise InvalidRequestError(f"{param} is not supported: {TOOL_SEARCH_HINT}", param=param)
