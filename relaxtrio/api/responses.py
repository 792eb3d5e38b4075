"""OpenAI Responses: typed input items → :class:`ParsedRequest`, :class:`TurnResult` → response.

Request (https://platform.openai.com/docs/api-reference/responses/create), projected as
docs/agent-contract.md#responses describes:

* ``instructions`` (non-empty string) → a system message before the input;
* ``input`` string → one user message; ``input`` list → items:

  - ``message`` (or no ``type``) with role user / assistant / system / developer (developer →
    system); content a string or parts: ``input_text`` / ``output_text`` → text (joined with
    ``""``; non-empty except for assistants), user ``input_image`` with an ``image_url`` string →
    an ``image_url`` part; other part types are ignored;
  - ``reasoning`` → assistant ``reasoning_content`` (texts of ``summary``, else ``content``,
    joined with ``"\\n\\n"``);
  - ``function_call`` → an assistant tool call with the same ``call_id``;
  - assistant text, reasoning and calls in a row form **one** assistant message, closed by any
    other message or a ``function_call_output``;
  - ``function_call_output`` → a tool message with the same ``call_id``; its output is a string
    (``""`` allowed) or ``input_text`` / ``input_image`` parts (text only → joined with ``""``,
    with images → ``text`` / ``image_url`` parts); without ``previous_response_id`` its
    ``call_id`` must be that of an earlier ``function_call`` / ``custom_tool_call`` of the input (a
    400 naming ``input[i].call_id`` otherwise, as OpenAI refuses it);
  - any other role is a 400 naming ``input[i].role``, any other item type a 400 naming
    ``input[i].type`` and the value (:func:`.options.responses_item_type_error`; built-in tool
    calls and server-side state such as ``item_reference`` included), never dropped
    (docs/client-quirks.md#unknown-roles-and-items-are-refused);

  - ``custom_tool_call`` → an assistant tool call ``{"input": <raw text>}`` (the projection of
    a custom tool, :mod:`.responses_tools`); ``custom_tool_call_output`` → a tool message like
    ``function_call_output``;

* ``tools``: flat ``{"type": "function", "name", "parameters", "description"?}``; ``custom``
  (freeform) tools become one-string-argument function tools and a ``namespace`` tool its
  function tools, their calls rendered with the namespace (:mod:`.responses_tools`); hosted tool
  types are left out and reported; ``max_output_tokens`` is the turn limit; ``reasoning.effort`` ∈ {none,
  minimal, low, medium, high, xhigh, max} → ``chat_template_kwargs = {"enable_thinking": effort
  != "none"}`` (any other value → ``{}``). ``previous_response_id``, ``temperature``, ``top_p``,
  ``store``, ``parallel_tool_calls`` and other fields do not alter generation; options that ask
  for what relaxtrio does not do (``tool_choice`` other than ``auto``, a ``text.format`` schema,
  ``top_logprobs``) are ignored and reported on the parsed request, or 400s naming them under
  ``--agentic-strict-request-fields`` (:func:`.options.check_responses_options`).

Strict where it matters: a non-object item or content part is a 400 (it is not skipped); errors
name the exact item path (``input[3].call_id``) rather
than ``input``; ``parameters: null`` is accepted like Chat's (OpenAI's schema allows it).

Response (https://platform.openai.com/docs/api-reference/responses/object):
output items reasoning → message → one ``function_call`` per call (``call_id`` = committed id;
a call to a custom tool is a ``custom_tool_call`` with the raw ``input``);
``status`` ``incomplete`` with ``incomplete_details.reason = "max_output_tokens"`` for a
length-limited turn, else ``completed``; ``tools`` echoes the request's entries as sent (hosted
ones included, as OpenAI does).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

from .._errors import InvalidRequestError, RelaxError
from .._validate import require_object
from ..nursery.turns import TurnRequest, TurnResult
from .errors import openai_error_body
from .fields import (
    non_empty_str,
    optional_bool,
    optional_object,
    optional_positive_int,
    optional_str,
    thinking_switch,
)
from .options import check_responses_options, responses_item_type_error
from .projection import ElementMemo, Projection, Source, call_source, check_tool_results
from .session_memo import SessionMemo
from .responses_tools import (
    custom_call_arguments,
    custom_call_item,
    project_responses_tools,
)
from .wire import ParsedRequest, ProtocolAdapter, new_id, sse_comment, sse_event

EFFORTS: Final = frozenset({"none", "minimal", "low", "medium", "high", "xhigh", "max"})
_MESSAGE_ROLES: Final = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


class _Assistant:
    """Assistant text, reasoning and calls accumulating into one canonical message."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.texts: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.call_sources: list[dict[str, str]] = []
        self.first_path: str | None = None
        self.content_path: str | None = None
        self.empty_message_path: str | None = None

    def flush(self, proj: Projection) -> None:
        if not (self.texts or self.reasoning or self.calls):
            if self.empty_message_path is not None:
                path = self.empty_message_path
                raise InvalidRequestError(f"{path}.content projected to no supported content", param=f"{path}.content")
            return
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.texts)}
        if self.reasoning:
            message["reasoning_content"] = "\n\n".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = self.calls
        path = self.first_path or ""
        fields = {".content": self.content_path or path}
        proj.add_message(message, Source(path, fields=fields, calls=tuple(self.call_sources)))
        self._reset()

    def is_clean(self) -> bool:
        """Nothing accumulated: the next item starts from a fresh state."""
        return (self.first_path is None and self.empty_message_path is None
                and not (self.texts or self.reasoning or self.calls))

    def touch(self, path: str) -> None:
        if self.first_path is None:
            self.first_path = path


def _text_part(part: Mapping[str, Any], path: str, *, allow_empty: bool) -> str:
    text = part.get("text")
    if not isinstance(text, str) or (not text and not allow_empty):
        raise InvalidRequestError(f"{path}.text must be a non-empty string", param=f"{path}.text")
    return text


def _message_content(content: Any, role: str, path: str) -> tuple[Any, tuple[str, ...]]:
    """Message content → (Chat content, per-part paths); ``""`` when nothing is supported."""
    if isinstance(content, str):
        return content, ()
    if not isinstance(content, list):
        raise InvalidRequestError(f"{path} must be a string or list", param=path)
    parts: list[dict[str, Any]] = []
    paths: list[str] = []
    for index, part in enumerate(content):
        part_path = f"{path}[{index}]"
        require_object(part, part_path)
        kind = part.get("type")
        if kind in ("input_text", "output_text"):
            text = _text_part(part, part_path, allow_empty=role == "assistant")
            parts.append({"type": "text", "text": text})
        elif kind == "input_image" and role == "user":
            url = non_empty_str(part.get("image_url"), f"{part_path}.image_url")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            continue
        paths.append(part_path)
    if not parts:
        return "", ()
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts), ()
    return parts, tuple(paths)


def _reasoning_text(item: Mapping[str, Any]) -> str:
    for key in ("summary", "content"):
        parts = item.get(key)
        if isinstance(parts, list):
            texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str) and p["text"]]
            if texts:
                return "\n\n".join(texts)
    return ""


def _call_output(output: Any, path: str) -> tuple[Any, tuple[str, ...]]:
    """A ``function_call_output``'s output → (tool message content, per-part paths).

    A string stays a string (``""`` allowed); a list keeps ``input_text`` and ``input_image``
    parts (Codex's ``view_image``): text only → joined with ``""``, with an image → ``text`` /
    ``image_url`` parts in order. Other part types are ignored.

    Raises:
        InvalidRequestError: not a string or list, a bad part, or a list with no text or image.
    """
    if isinstance(output, str):
        return output, ()
    if not isinstance(output, list):
        raise InvalidRequestError(f"{path} must be a string or a list of input_text / input_image parts",
                                  param=path)
    parts: list[dict[str, Any]] = []
    paths: list[str] = []
    for index, part in enumerate(output):
        part_path = f"{path}[{index}]"
        require_object(part, part_path)
        kind = part.get("type")
        if kind == "input_text":
            parts.append({"type": "text", "text": _text_part(part, part_path, allow_empty=False)})
        elif kind == "input_image":
            url = non_empty_str(part.get("image_url"), f"{part_path}.image_url")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            continue
        paths.append(part_path)
    if not parts:
        raise InvalidRequestError(f"{path} projected to no supported content", param=path)
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts), ()
    return parts, tuple(paths)


def _project_items(items: list[Any], proj: Projection, memo: ElementMemo | None = None) -> None:
    """Projects the ``input`` items; with ``memo``, only those after the last clean boundary
    of the leading run that are the previous body's own objects (:class:`ElementMemo`)."""
    pending = _Assistant()
    base = len(proj.messages)
    start = 0 if memo is None else memo.resume(items, proj)
    ends: list[int] = []
    clean: list[bool] = []
    for index in range(start, len(items)):
        _project_item(items[index], index, proj, pending)
        ends.append(len(proj.messages) - base)
        clean.append(pending.is_clean())
    pending.flush(proj)
    if memo is not None:
        memo.remember(items, start, ends, clean, proj, base)


def _project_item(item: Any, index: int, proj: Projection, pending: _Assistant) -> None:
    path = f"input[{index}]"
    require_object(item, path)
    kind = item.get("type")
    if kind is None or kind == "message":
        role = _MESSAGE_ROLES.get(item["role"]) if isinstance(item.get("role"), str) else None
        if role is None:
            raise InvalidRequestError(f"{path}.role must be one of: assistant, developer, system, user, "
                                      f"got {item.get('role')!r}", param=f"{path}.role")
        content, part_paths = _message_content(item.get("content"), role, f"{path}.content")
        if role == "assistant":
            pending.touch(path)
            if content:
                pending.texts.append(content)
                pending.content_path = pending.content_path or f"{path}.content"
            else:
                pending.empty_message_path = pending.empty_message_path or path
            return
        pending.flush(proj)
        fields = {".content": f"{path}.content", ".role": f"{path}.role"}
        proj.add_message({"role": role, "content": content}, Source(path, fields=fields, parts=part_paths))
    elif kind == "reasoning":
        text = _reasoning_text(item)
        if text:
            pending.touch(path)
            pending.reasoning.append(text)
    elif kind == "function_call":
        call_id = non_empty_str(item.get("call_id"), f"{path}.call_id")
        name = non_empty_str(item.get("name"), f"{path}.name")
        arguments = item.get("arguments")
        if not isinstance(arguments, str):
            raise InvalidRequestError(f"{path}.arguments must be a JSON string", param=f"{path}.arguments")
        pending.touch(path)
        pending.calls.append({"id": call_id, "type": "function",
                              "function": {"name": name, "arguments": arguments}})
        pending.call_sources.append(call_source(path, id_key="call_id", name_key="name", arguments_key="arguments"))
    elif kind == "custom_tool_call":
        call_id = non_empty_str(item.get("call_id"), f"{path}.call_id")
        name = non_empty_str(item.get("name"), f"{path}.name")
        pending.touch(path)
        pending.calls.append({"id": call_id, "type": "function",
                              "function": {"name": name, "arguments": custom_call_arguments(item, path)}})
        pending.call_sources.append(call_source(path, id_key="call_id", name_key="name", arguments_key="input"))
    elif kind in ("function_call_output", "custom_tool_call_output"):
        pending.flush(proj)
        call_id = non_empty_str(item.get("call_id"), f"{path}.call_id")
        output, output_parts = _call_output(item.get("output"), f"{path}.output")
        fields = {".content": f"{path}.output", ".tool_call_id": f"{path}.call_id"}
        proj.add_message({"role": "tool", "tool_call_id": call_id, "content": output},
                         Source(path, fields=fields, parts=output_parts))
    else:  # refused, never dropped (docs/client-quirks.md#unknown-roles-and-items-are-refused)
        raise responses_item_type_error(kind, path)


def parse_responses_request(body: Mapping[str, Any], memo: SessionMemo | None = None) -> ParsedRequest:
    """Normalizes a Responses body; never mutates or aliases it.

    ``memo``: the Session's memo of its previous request, or None (see :mod:`.chat`).

    Raises:
        InvalidRequestError: any invalid field, with ``param`` set to its request path.
    """
    ignored = check_responses_options(body)
    proj = Projection(messages_field="input")
    instructions = body.get("instructions")
    if instructions is not None:
        non_empty_str(instructions, "instructions")
        proj.add_message({"role": "system", "content": instructions},
                         Source("instructions", fields={".content": "instructions"}))
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        if not raw_input:
            raise InvalidRequestError("input must not be empty", param="input")
        proj.add_message({"role": "user", "content": raw_input}, Source("input", fields={".content": "input"}))
    elif isinstance(raw_input, list):
        _project_items(raw_input, proj, None if memo is None else memo.elements)
    else:
        raise InvalidRequestError("input is required and must be a string or list", param="input")
    custom_tools, namespaces = project_responses_tools(body.get("tools"), proj)
    reasoning = optional_object(body, "reasoning")
    effort = reasoning.get("effort") if reasoning is not None else None
    kwargs = thinking_switch(effort, "reasoning.effort", EFFORTS, off="none")
    conversation = proj.conversation(kwargs, memo)
    if body.get("previous_response_id") is None:
        # With previous_response_id a client may send only the new items (relaxtrio keeps no
        # response state: their calls are not in the request), so only a self-contained input
        # is checked.
        check = check_tool_results if memo is None else memo.check_tool_results
        check(proj.messages, lambda i: proj.sources[i].wire_param(".tool_call_id"))
    turn = TurnRequest(
        conversation=conversation,
        max_new_tokens=optional_positive_int(body, "max_output_tokens"),
        protocol="responses",
    )
    return ParsedRequest(turn=turn, model=optional_str(body, "model"), stream=optional_bool(body, "stream"),
                         custom_tools=custom_tools, namespaces=namespaces, ignored=(*ignored, *proj.ignored),
                         echo_tools=tuple(body.get("tools") or ()))


def output_items(result: TurnResult, custom_tools: frozenset[str] = frozenset(),
                 namespaces: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Output items in order: reasoning, message (only with text), one call item per call
    (``custom_tool_call`` for a custom tool, else ``function_call``, with its ``namespace`` when
    the tool came in a namespace tool)."""
    message = result.message
    items: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        items.append({
            "id": new_id("rs"), "type": "reasoning", "status": "completed", "summary": [],
            "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}],
        })
    if message.get("content"):
        items.append({
            "id": new_id("msg"), "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": message["content"], "annotations": []}],
        })
    for call in message.get("tool_calls") or ():
        if call["function"]["name"] in custom_tools:
            items.append(custom_call_item(call, new_id("ctc")))
            continue
        item = {"id": new_id("fc"), "type": "function_call", "status": "completed", "call_id": call["id"],
                "name": call["function"]["name"], "arguments": call["function"]["arguments"]}
        if namespaces and call["function"]["name"] in namespaces:
            item["namespace"] = namespaces[call["function"]["name"]]
        items.append(item)
    return items


def _response_shell(request: ParsedRequest | None, status: str) -> dict[str, Any]:
    return {
        "id": new_id("resp"), "object": "response", "created_at": int(time.time()), "status": status,
        "model": request.model if request is not None else None, "output": [],
        "error": None, "incomplete_details": None, "instructions": None, "metadata": {},
        "parallel_tool_calls": True, "temperature": None, "top_p": None, "tool_choice": "auto",
        "tools": list(request.echo_tools) if request is not None else [],
    }


def render_response(result: TurnResult, request: ParsedRequest) -> dict[str, Any]:
    """The ``response`` object of a committed turn (``completed`` or ``incomplete``)."""
    incomplete = result.finish_reason == "length"
    response = _response_shell(request, "incomplete" if incomplete else "completed")
    response["output"] = output_items(result, request.custom_tools, request.namespaces)
    if incomplete:
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    response["usage"] = {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": result.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }
    return response


def _created(response: Mapping[str, Any]) -> bytes:
    created = {**response, "status": "in_progress", "output": [], "incomplete_details": None, "error": None}
    created.pop("usage", None)
    return sse_event("response.created", {"type": "response.created", "sequence_number": 0, "response": created})


def render_responses_sse(result: TurnResult, request: ParsedRequest) -> bytes:
    """response.created, one response.output_item.done per item, response.completed/incomplete."""
    response = render_response(result, request)
    frames = [_created(response)]
    for index, item in enumerate(response["output"]):
        frames.append(sse_event("response.output_item.done", {
            "type": "response.output_item.done", "sequence_number": index + 1,
            "output_index": index, "item": item,
        }))
    terminal = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    frames.append(sse_event(terminal, {
        "type": terminal, "sequence_number": len(response["output"]) + 1, "response": response,
    }))
    return b"".join(frames)


def render_responses_sse_error(exc: RelaxError, request: ParsedRequest | None) -> bytes:
    """response.created, then response.failed (status failed, the OpenAI error, no output)."""
    failed = _response_shell(request, "failed")
    created = _created(failed)
    failed["error"] = openai_error_body(exc)["error"]
    return created + sse_event(
        "response.failed", {"type": "response.failed", "sequence_number": 1, "response": failed}
    )


RESPONSES: Final = ProtocolAdapter(
    name="responses",
    parse=parse_responses_request,
    render_json=render_response,
    render_sse=render_responses_sse,
    render_sse_error=render_responses_sse_error,
    connected_frame=sse_comment("connected"),
    heartbeat_frame=sse_comment("heartbeat"),
)
"""The Responses adapter."""
