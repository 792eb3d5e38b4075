"""Anthropic Messages: ``system`` + ``messages`` blocks → :class:`ParsedRequest`, result → message.

Request (https://docs.anthropic.com/en/api/messages), projected as
docs/agent-contract.md#anthropic-messages describes:

* ``system`` string or text blocks (joined with ``"\\n\\n"``) → a system message;
* ``messages`` (required list); a ``system`` entry (string or text blocks joined with
  ``"\\n\\n"``; not part of the Messages API, but Claude Code sends one) → a system message at
  its position; any other role than user / assistant is a 400 naming ``messages[i].role``
  (docs/client-quirks.md#unknown-roles-and-items-are-refused);
  string content is kept; assistant blocks: ``text`` (joined with ``""``), ``thinking``
  (non-empty ones joined with ``"\\n\\n"`` into ``reasoning_content``; the signature is dropped),
  ``tool_use`` (``id``, ``name``, object ``input``) → one assistant message; user blocks: ``text``,
  ``image`` (``base64`` with an ``image/*`` media type → a ``data:`` URL, or ``url``) → parts of
  one user message (a string when all parts are text, joined with ``""``), ``tool_result`` →
  a tool message with the same ``tool_use_id`` (a non-empty string, ``""`` when absent and then
  refused by the canonical rules; or ``text`` and
  ``image`` blocks: text only → joined with ``""``, with images → ``text`` / ``image_url`` parts);
  tool search's blocks (``server_tool_use``, ``tool_search_tool_result``, a ``tool_reference``
  in a tool result) and a tool with ``defer_loading: true`` are 400s naming ENABLE_TOOL_SEARCH
  (docs/client-quirks.md#claude-codes-tool-search); other block types are ignored; a user message
  that projects to nothing is a 400;
* ``max_tokens`` is required; ``stop_sequences`` are the turn's stop strings; ``thinking.type`` ∈
  {disabled, enabled, adaptive} → ``chat_template_kwargs = {"enable_thinking": type !=
  "disabled"}``; tools with no ``type`` or ``type: "custom"`` (``name``, ``input_schema``,
  ``description``?) become function tools; server tools (``web_search_*``, ...,
  :func:`.options.anthropic_server_tool`) are left out and reported; any other tool type is a 400
  naming ``tools[i].type`` (:data:`OTHER_TOOL_TYPES_HINT` says why); a ``tool_search_tool_*``
  tool is a 400 naming ``ENABLE_TOOL_SEARCH`` (:func:`.options.check_tool_search`).
  ``temperature``, ``top_p``,
  ``top_k``, ``thinking.budget_tokens``, ``output_config.effort``, ``metadata`` do not alter
  generation; a ``tool_choice`` other than ``auto`` (or ``none`` without tools), an
  ``output_config.format`` schema and ``mcp_servers`` are ignored and reported on the parsed
  request, or 400s naming them under ``--agentic-strict-request-fields``
  (:func:`.options.check_messages_options`, docs/agent-contract.md#ignored-request-fields).

Strict where it matters: a non-object message or block is a 400 (it is not skipped); a
``tool_result`` whose block list holds no text and no image is a 400 naming the block, and so is
one whose ``tool_use_id`` is the id of no ``tool_use`` block of an earlier assistant message (the
API refuses it too; the 400 names ``messages[i].content[j].tool_use_id``); errors name exact paths.

Response (https://docs.anthropic.com/en/api/messages-streaming): content
blocks thinking (with a ``sig_<hex>`` signature) → text → ``tool_use`` (``id`` = committed call id,
``input`` = the parsed arguments); ``stop_reason`` end_turn / max_tokens / tool_use, or
``stop_sequence`` with ``stop_sequence`` naming the request's stop string that ended the turn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from .._errors import InvalidRequestError, RelaxError
from .._validate import require_object
from ..forest import Conversation
from ..nursery.turns import TurnRequest, TurnResult
from .errors import anthropic_error_body
from .fields import (
    non_empty_str,
    optional_bool,
    optional_object,
    optional_str,
    required_positive_int,
    stop_strings,
    thinking_switch,
)
from .options import (
    TOOL_SEARCH_HINT,
    IgnoredField,
    anthropic_server_tool,
    check_messages_options,
    check_tool_search,
)
from .projection import ElementMemo, Projection, Source, call_source, check_tool_results, project_flat_tools
from .session_memo import SessionMemo
from .wire import ParsedRequest, ProtocolAdapter, dumps, new_id, sse_event

THINKING_TYPES: Final = frozenset({"disabled", "enabled", "adaptive"})
STOP_REASONS: Final = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
PING_FRAME: Final = sse_event("ping", {"type": "ping"})
CUSTOM_TOOL_TYPES: Final = (None, "custom")
"""``tools[i].type`` values of a custom tool (docs/agent-contract.md#anthropic-messages)."""
OTHER_TOOL_TYPES_HINT: Final = (
    "only custom tools are served (no type, or type \"custom\", with name and input_schema); "
    "declare the tool as a custom tool with its own input_schema, or switch off the harness "
    "feature that adds it"
)
"""Why an Anthropic-defined client tool (``bash_*``, ``text_editor_*``, ``computer_*``) is refused
rather than rendered or dropped: it carries no ``input_schema`` (its schema is built into
Anthropic's models, versioned by the type's date, and is no contract the policy trained here was
given), and dropping it would train the policy on a prompt without a tool the agent answers.
Server tools (``web_search_*``, ...) differ: Anthropic's servers run them, not the agent, so they
are left out (refused with this hint under ``--agentic-strict-request-fields``).
"""


def _blocks_text(value: Any, path: str, *, separator: str, allow_empty_string: bool) -> str | None:
    """A string, or the texts of a list's ``text`` blocks joined; None when the list has none."""
    if isinstance(value, str):
        if not value and not allow_empty_string:
            raise InvalidRequestError(f"{path} must not be empty", param=path)
        return value
    if not isinstance(value, list):
        raise InvalidRequestError(f"{path} must be a string or a list of text blocks", param=path)
    texts = []
    for index, block in enumerate(value):
        block_path = f"{path}[{index}]"
        require_object(block, block_path)
        if block.get("type") == "text":
            texts.append(non_empty_str(block.get("text"), f"{block_path}.text"))
    return separator.join(texts) if texts else None


def _image_url(block: Mapping[str, Any], path: str) -> str:
    source = require_object(block.get("source"), f"{path}.source")
    kind = source.get("type")
    if kind == "base64":
        media_type = source.get("media_type")
        if not isinstance(media_type, str) or not media_type.startswith("image/"):
            raise InvalidRequestError(f"{path}.source.media_type must be an image type",
                                      param=f"{path}.source.media_type")
        data = non_empty_str(source.get("data"), f"{path}.source.data")
        return f"data:{media_type};base64,{data}"
    if kind == "url":
        return non_empty_str(source.get("url"), f"{path}.source.url")
    raise InvalidRequestError(f"{path}.source.type is not supported", param=f"{path}.source.type")


def _tool_result_content(value: Any, path: str) -> tuple[Any, tuple[str, ...]]:
    """A ``tool_result``'s content → (tool message content, per-part paths).

    A string stays a string (``""`` allowed); a block list keeps its ``text`` and ``image``
    blocks (a screenshot or an image file the tool read): all text → the texts joined with
    ``""``, with an image → ``text`` / ``image_url`` parts in block order. Other blocks are
    ignored.

    Raises:
        InvalidRequestError: not a string or list, a bad block, or a list with no text or image.
    """
    if isinstance(value, str):
        return value, ()
    if not isinstance(value, list):
        raise InvalidRequestError(f"{path} must be a string or a list of content blocks", param=path)
    parts: list[dict[str, Any]] = []
    paths: list[str] = []
    for index, block in enumerate(value):
        block_path = f"{path}[{index}]"
        require_object(block, block_path)
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": non_empty_str(block.get("text"), f"{block_path}.text")})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, block_path)}})
        else:
            _refuse_tool_search(kind, block_path)
            continue
        paths.append(block_path)
    if not parts:
        raise InvalidRequestError(f"{path} projected to no supported content", param=path)
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts), ()
    return parts, tuple(paths)


def _assistant_blocks(blocks: list[Any], path: str, proj: Projection) -> None:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    call_sources: list[dict[str, str]] = []
    content_path: str | None = None
    for index, block in enumerate(blocks):
        block_path = f"{path}.content[{index}]"
        require_object(block, block_path)
        kind = block.get("type")
        if kind == "text":
            texts.append(non_empty_str(block.get("text"), f"{block_path}.text"))
            content_path = content_path or f"{block_path}.text"
        elif kind == "thinking":
            thinking = block.get("thinking")
            if not isinstance(thinking, str):
                raise InvalidRequestError(f"{block_path}.thinking must be a string", param=f"{block_path}.thinking")
            if thinking:
                reasoning.append(thinking)
        elif kind == "tool_use":
            call_id = non_empty_str(block.get("id"), f"{block_path}.id")
            name = non_empty_str(block.get("name"), f"{block_path}.name")
            arguments = require_object(block.get("input"), f"{block_path}.input")
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
            call_sources.append(call_source(block_path, id_key="id", name_key="name", arguments_key="input"))
        else:
            _refuse_tool_search(kind, block_path)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        message["reasoning_content"] = "\n\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    fields = {".content": content_path or f"{path}.content"}
    proj.add_message(message, Source(path, fields=fields, calls=tuple(call_sources)))


def _user_blocks(blocks: list[Any], path: str, proj: Projection) -> None:
    parts: list[dict[str, Any]] = []
    part_paths: list[str] = []
    start = len(proj.messages)

    def flush() -> None:
        if not parts:
            return
        if all(p["type"] == "text" for p in parts):
            content: Any = "".join(p["text"] for p in parts)
            source = Source(part_paths[0], fields={".content": part_paths[0]})
        else:
            content = list(parts)
            source = Source(part_paths[0], parts=tuple(part_paths))
        proj.add_message({"role": "user", "content": content}, source)
        parts.clear()
        part_paths.clear()

    for index, block in enumerate(blocks):
        block_path = f"{path}.content[{index}]"
        require_object(block, block_path)
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": non_empty_str(block.get("text"), f"{block_path}.text")})
            part_paths.append(block_path)
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, block_path)}})
            part_paths.append(block_path)
        elif kind == "tool_result":
            flush()
            call_id = non_empty_str(block.get("tool_use_id"), f"{block_path}.tool_use_id")
            output, output_parts = _tool_result_content(block.get("content", ""), f"{block_path}.content")
            fields = {".content": f"{block_path}.content", ".tool_call_id": f"{block_path}.tool_use_id"}
            proj.add_message({"role": "tool", "tool_call_id": call_id, "content": output},
                             Source(block_path, fields=fields, parts=output_parts))
        else:
            _refuse_tool_search(kind, block_path)
    flush()
    if len(proj.messages) == start:
        raise InvalidRequestError(f"{path}.content projected to no supported content", param=f"{path}.content")


def _project_messages(messages: Any, proj: Projection, memo: ElementMemo | None) -> None:
    """Projects ``messages[]``; each entry on its own, so with ``memo`` only the entries that
    are not the previous request's own objects (:class:`~.projection.ElementMemo`)."""
    if not isinstance(messages, list):
        raise InvalidRequestError("messages is required and must be a list", param="messages")
    if memo is not None:
        memo.project(messages, proj, _project_message)
        return
    for index, message in enumerate(messages):
        _project_message(message, index, proj)


def _project_message(message: Any, index: int, proj: Projection) -> None:
    path = f"messages[{index}]"
    require_object(message, path)
    role = message.get("role")
    if role == "system":
        _system_entry(message.get("content"), path, proj)
        return
    if role not in ("user", "assistant"):  # refused (docs/client-quirks.md#unknown-roles-and-items-are-refused)
        raise InvalidRequestError(f"{path}.role must be one of: assistant, system, user, got {role!r}",
                                  param=f"{path}.role")
    content = message.get("content")
    if isinstance(content, str):
        proj.add_message({"role": role, "content": content}, Source(path, fields={".content": f"{path}.content"}))
    elif not isinstance(content, list):
        raise InvalidRequestError(f"{path}.content must be a string or list", param=f"{path}.content")
    elif role == "assistant":
        _assistant_blocks(content, path, proj)
    else:
        _user_blocks(content, path, proj)


def _system_entry(content: Any, path: str, proj: Projection) -> None:
    """A ``role: "system"`` entry inside ``messages[]`` (Claude Code sends one on every request).

    The Messages API has no such role, but dropping it would hide its text from the model: it
    becomes a system message at its position (the canonical rule merges it into the leading
    system message when nothing but system text precedes it, else keeps it in place).

    Raises:
        InvalidRequestError: content that is not a non-empty string or a list of text blocks.
    """
    text = _blocks_text(content, f"{path}.content", separator="\n\n", allow_empty_string=False)
    if text is None:
        raise InvalidRequestError(f"{path}.content projected to no supported content", param=f"{path}.content")
    proj.add_message({"role": "system", "content": text}, Source(path, fields={".content": f"{path}.content"}))


TOOL_SEARCH_BLOCKS: Final = frozenset({"server_tool_use", "tool_search_tool_result", "tool_reference"})
"""Content blocks of tool search (docs/client-quirks.md#claude-codes-tool-search): a 400 naming ENABLE_TOOL_SEARCH."""


def _refuse_tool_search(kind: Any, path: str) -> None:
    """Raises the 400 naming ENABLE_TOOL_SEARCH for a block of tool search's types."""
    if isinstance(kind, str) and kind in TOOL_SEARCH_BLOCKS:  # a type of any JSON kind is possible
        raise InvalidRequestError(f"{path}.type {kind!r} is not supported: {TOOL_SEARCH_HINT}", param=f"{path}.type")


def _project_tools(tools: Any, proj: Projection) -> None:
    check_tool_search(tools)
    project_flat_tools(tools, proj, function_types=CUSTOM_TOOL_TYPES, schema_key="input_schema",
                       schema_required=True, other_types_hint=OTHER_TOOL_TYPES_HINT,
                       server_tool=anthropic_server_tool)


def _conversation(body: Mapping[str, Any],
                  memo: SessionMemo | None = None) -> tuple[Conversation, tuple[IgnoredField, ...]]:
    """``system``, ``messages``, ``tools`` and ``thinking`` of a Messages body, canonical
    (through the Session's ``memo`` when given; see :mod:`.chat`), and the server tools left out."""
    proj = Projection(messages_field="messages")
    system = body.get("system")
    if system is not None:
        text = _blocks_text(system, "system", separator="\n\n", allow_empty_string=False)
        if text is not None:
            proj.add_message({"role": "system", "content": text}, Source("system", fields={".content": "system"}))
    _project_messages(body.get("messages"), proj, None if memo is None else memo.elements)
    _project_tools(body.get("tools"), proj)
    thinking = optional_object(body, "thinking")
    kind = thinking.get("type") if thinking is not None else None
    conversation = proj.conversation(thinking_switch(kind, "thinking.type", THINKING_TYPES, off="disabled"), memo)
    check = check_tool_results if memo is None else memo.check_tool_results
    check(proj.messages, lambda i: proj.sources[i].wire_param(".tool_call_id"))
    return conversation, tuple(proj.ignored)


def parse_messages_request(body: Mapping[str, Any], memo: SessionMemo | None = None) -> ParsedRequest:
    """Normalizes an Anthropic Messages body; never mutates or aliases it.

    ``memo``: the Session's memo of its previous request, or None (see :mod:`.chat`).

    Raises:
        InvalidRequestError: any invalid field, with ``param`` set to its request path.
    """
    ignored = check_messages_options(body)
    conversation, dropped_tools = _conversation(body, memo)
    turn = TurnRequest(
        conversation=conversation,
        max_new_tokens=required_positive_int(body, "max_tokens"),
        stop=stop_strings(body, "stop_sequences", allow_string=False),
        protocol="messages",
    )
    return ParsedRequest(turn=turn, model=optional_str(body, "model"), stream=optional_bool(body, "stream"),
                         ignored=(*ignored, *dropped_tools))


def parse_count_tokens_request(body: Mapping[str, Any]) -> tuple[TurnRequest, tuple[IgnoredField, ...]]:
    """Normalizes a ``POST /v1/messages/count_tokens`` body
    (https://docs.anthropic.com/en/api/messages-count-tokens): the conversation fields of a
    Messages request (``model``, ``system``, ``messages``, ``tools``, ``thinking``); there is no
    ``max_tokens``, and fields that do not shape the prompt (``tool_choice``) are ignored.
    Returns the turn and the server tools left out of its prompt (as for a model request).

    Raises:
        InvalidRequestError: any invalid field, with ``param`` set to its request path.
    """
    optional_str(body, "model")
    conversation, dropped_tools = _conversation(body)
    return TurnRequest(conversation=conversation, protocol="messages"), dropped_tools


def content_blocks(result: TurnResult) -> list[dict[str, Any]]:
    """Blocks in order: thinking (signed), text (only when non-empty), one tool_use per call."""
    message = result.message
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": new_id("sig")})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                       "input": json.loads(call["function"]["arguments"])})
    return blocks


def render_message(result: TurnResult, request: ParsedRequest) -> dict[str, Any]:
    """The ``message`` object of a committed turn."""
    stop_reason = "stop_sequence" if result.stop_sequence is not None else STOP_REASONS[result.finish_reason]
    return {
        "id": new_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": content_blocks(result),
        "stop_reason": stop_reason,
        "stop_sequence": result.stop_sequence,
        "usage": {"input_tokens": result.prompt_tokens, "output_tokens": result.completion_tokens},
    }


def _block_events(index: int, block: Mapping[str, Any]) -> list[bytes]:
    kind = block["type"]
    if kind == "thinking":
        start: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                  {"type": "signature_delta", "signature": block["signature"]}]
    elif kind == "text":
        start = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": block["text"]}]
    else:
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": dumps(block["input"])}]
    events = [sse_event("content_block_start", {"type": "content_block_start", "index": index, "content_block": start})]
    events += [sse_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
               for d in deltas]
    events.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def render_messages_sse(result: TurnResult, request: ParsedRequest) -> bytes:
    """message_start, every block's start/delta/stop events, message_delta, message_stop."""
    message = render_message(result, request)
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 0}}
    frames = [sse_event("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        frames += _block_events(index, block)
    frames.append(sse_event("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
        "usage": {"output_tokens": message["usage"]["output_tokens"]},
    }))
    frames.append(sse_event("message_stop", {"type": "message_stop"}))
    return b"".join(frames)


def render_messages_sse_error(exc: RelaxError, request: ParsedRequest | None) -> bytes:
    """An in-stream failure: ``event: error`` with the Anthropic envelope."""
    return sse_event("error", anthropic_error_body(exc))


MESSAGES: Final = ProtocolAdapter(
    name="messages",
    parse=parse_messages_request,
    render_json=render_message,
    render_sse=render_messages_sse,
    render_sse_error=render_messages_sse_error,
    connected_frame=PING_FRAME,
    heartbeat_frame=PING_FRAME,
)
"""The Anthropic Messages adapter."""
