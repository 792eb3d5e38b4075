"""Projection of typed protocol input (Responses items, Messages blocks) onto Chat-shaped messages.

The Responses and Messages normalizers build Chat-shaped messages and tools here, then
:meth:`Projection.conversation` hands them to :meth:`Conversation.from_wire`, which owns every
canonical rule (system merge, argument canonicalization, content checks). When the forest
rejects something it names the Chat-shaped path (``messages[2].tool_calls[0].function.arguments``);
each projected message remembers which request field it came from, so the error is reported at
the path the client actually sent (``input[5].arguments``) with
:meth:`~relaxtrio.RelaxError.at_param`: the forest's errors keep their path and problem apart,
so no message text is rewritten.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

import attrs

from .._errors import InvalidRequestError
from .._validate import require_list, require_object
from ..forest import Conversation
from .fields import non_empty_str
from .options import IgnoredField

_MESSAGE_PARAM: Final = re.compile(r"messages\[(\d+)\](.*)", re.DOTALL)
_TOOL_PARAM: Final = re.compile(r"tools\[(\d+)\](.*)", re.DOTALL)
_INDEXED: Final = re.compile(r"\.(tool_calls|content)\[(\d+)\](.*)", re.DOTALL)


@attrs.frozen
class Source:
    """Where one projected message came from in the request.

    Attributes:
        path: the item or message path (``input[3]``, ``messages[1].content[2]``).
        fields: Chat field suffix → wire path (``{".content": "input[3].output"}``); a suffix
            not listed maps to ``path``.
        parts: wire path of each content part, in canonical part order.
        calls: per tool call, Chat suffix → wire path (``""`` is the call's own path).
    """

    path: str
    fields: Mapping[str, str] = attrs.field(factory=dict)
    parts: tuple[str, ...] = ()
    calls: tuple[Mapping[str, str], ...] = ()

    def wire_param(self, rest: str) -> str:
        """The wire path for the Chat-side suffix ``rest`` of this message."""
        indexed = _INDEXED.fullmatch(rest)
        if indexed is not None:
            kind, index, tail = indexed.group(1), int(indexed.group(2)), indexed.group(3)
            if kind == "tool_calls" and index < len(self.calls):
                call = self.calls[index]
                return call.get(tail, call[""])
            if kind == "content" and index < len(self.parts):
                return self.parts[index] + tail
        for suffix in sorted(self.fields, key=len, reverse=True):
            if rest.startswith(suffix):
                return self.fields[suffix] + rest[len(suffix):]
        return self.path


def call_source(path: str, *, id_key: str, name_key: str, arguments_key: str) -> dict[str, str]:
    """The suffix map of one tool call that came from the item/block at ``path``."""
    return {
        "": path,
        ".id": f"{path}.{id_key}",
        ".function.name": f"{path}.{name_key}",
        ".function.arguments": f"{path}.{arguments_key}",
    }


class Canonicalizer(Protocol):
    """Builds canonical conversations as :meth:`Conversation.from_wire` does, reusing what an
    earlier request already canonicalized (:class:`~.session_memo.SessionMemo`)."""

    def conversation(self, messages: Any, tools: Any = None, template_kwargs: Any = None) -> Conversation:
        """``Conversation.from_wire(messages, tools, template_kwargs)``.

        Raises:
            InvalidRequestError: as :meth:`Conversation.from_wire`.
        """
        ...


@attrs.define
class Projection:
    """Chat-shaped messages and tools under construction, with their request sources.

    Attributes:
        messages_field: the request field holding the history (``input`` or ``messages``); used
            for the "projected to zero supported messages" error.
        messages: Chat-shaped messages (fresh objects; never the request's).
        sources: ``sources[i]`` is where ``messages[i]`` came from.
        tools: Chat-shaped function tools.
        tool_sources: wire path of each tool.
        ignored: tools left out of the prompt (provider-side tools the model cannot call here).
    """

    messages_field: str
    messages: list[dict[str, Any]] = attrs.field(factory=list)
    sources: list[Source] = attrs.field(factory=list)
    tools: list[dict[str, Any]] = attrs.field(factory=list)
    tool_sources: list[str] = attrs.field(factory=list)
    ignored: list[IgnoredField] = attrs.field(factory=list)

    def add_message(self, message: dict[str, Any], source: Source) -> None:
        """Appends a projected message."""
        self.messages.append(message)
        self.sources.append(source)

    def add_tool(self, name: str, parameters: Any, description: Any, path: str) -> None:
        """Appends a function tool in the canonical nested shape."""
        function: dict[str, Any] = {"name": name, "parameters": parameters}
        if description is not None:
            function["description"] = description
        self.tools.append({"type": "function", "function": function})
        self.tool_sources.append(path)

    def conversation(
        self, template_kwargs: Mapping[str, Any], memo: Canonicalizer | None = None
    ) -> Conversation:
        """Canonicalizes the projection (through the Session's ``memo`` when given).

        Raises:
            InvalidRequestError: a canonical rule failed (``param`` is the request's own path),
                or nothing was projected (``<field> projected to zero supported messages``).
        """
        try:
            build = Conversation.from_wire if memo is None else memo.conversation
            conv = build(self.messages, self.tools, dict(template_kwargs))
        except InvalidRequestError as exc:
            raise self._remapped(exc) from exc
        if not conv.messages:
            raise InvalidRequestError(
                f"{self.messages_field} projected to zero supported messages", param=self.messages_field
            )
        return conv

    def _remapped(self, exc: InvalidRequestError) -> InvalidRequestError:
        param = exc.param or ""
        new_param = None
        message_match = _MESSAGE_PARAM.fullmatch(param)
        tool_match = _TOOL_PARAM.fullmatch(param)
        if message_match is not None and int(message_match.group(1)) < len(self.sources):
            new_param = self.sources[int(message_match.group(1))].wire_param(message_match.group(2))
        elif tool_match is not None and int(tool_match.group(1)) < len(self.tool_sources):
            new_param = self.tool_sources[int(tool_match.group(1))]
        elif param == "messages":
            new_param = self.messages_field
        if new_param is None:
            return exc
        return exc.at_param(new_param)


@attrs.define(eq=False)
class ToolScan:
    """What :func:`check_tool_results` found in a list of messages: the first ``num_messages``
    make the tool calls ``call_ids``."""

    num_messages: int
    call_ids: set[str]


def check_tool_results(messages: Sequence[Mapping[str, Any]], param_of: Callable[[int], str],
                       resumed: ToolScan | None = None) -> ToolScan:
    """Refuses a tool message answering a call that no earlier assistant message made.

    The APIs refuse it too (a Chat ``tool`` message's ``tool_call_id``, a Messages
    ``tool_result``'s ``tool_use_id``); relaxtrio would otherwise render a result the model never
    asked for. Any earlier assistant message counts, not only the one just before. With
    ``resumed`` (the scan of a request whose messages these repeat, kept by the Session's
    :class:`~.session_memo.SessionMemo`) only the messages after its ``num_messages`` are read,
    so a 1,000-turn history costs what a short one does.

    Args:
        messages: Chat-shaped messages already validated by the canonical rules (the request's
            own Chat ``messages``, or a :class:`Projection`'s).
        param_of: the request path of message ``i``'s call id, for the error.
        resumed: the scan of ``messages[:resumed.num_messages]``, or None (scan everything).
            Its ``call_ids`` are taken over (and grown), not copied.

    Returns:
        The scan of all of ``messages``.

    Raises:
        InvalidRequestError: ``param`` is the first unmatched call id's path.
    """
    start, call_ids = (0, set()) if resumed is None else (resumed.num_messages, resumed.call_ids)
    for index in range(start, len(messages)):
        message = messages[index]
        role = message.get("role")
        if role == "assistant":
            call_ids.update(call["id"] for call in message.get("tool_calls") or () if call.get("id"))
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if call_id is not None and call_id not in call_ids:
                raise InvalidRequestError.at(
                    param_of(index), f"{call_id!r} answers no tool call of an earlier assistant message")
    return ToolScan(len(messages), call_ids)


@attrs.define(eq=False)
class ElementMemo:
    """How the previous request's history elements projected, so that a repeated leading run
    of elements is not projected again.

    "Repeated" means the very same object: the API's body memo (:mod:`.body_memo`) hands over
    the previous body's objects for an unchanged leading run of the history, so one identity
    comparison per element (run in C) finds it, and no equality question (``1 == True``) arises.
    A projection may carry state from one element to the next (Responses items accumulate into
    one assistant message): reuse stops at the last *clean* boundary of the repeated run, after
    which the projection starts from a fresh state. Kept per Session by
    :class:`~.session_memo.SessionMemo`.

    Attributes:
        raw: the previous request's elements.
        ends: ``ends[i]`` is the number of messages projected once ``raw[:i + 1]`` was seen.
        clean: ``clean[i]``: the projection carried no state past ``raw[i]``.
        messages: the projected messages of ``raw`` (``ends[i] <= len(messages)``).
        sources: their sources, ``len(sources) == len(messages)``.
    """

    raw: list[Any] = attrs.field(factory=list)
    ends: list[int] = attrs.field(factory=list)
    clean: list[bool] = attrs.field(factory=list)
    messages: list[dict[str, Any]] = attrs.field(factory=list)
    sources: list[Source] = attrs.field(factory=list)

    def resume(self, elements: list[Any], proj: Projection) -> int:
        """Adds the previous projection of the longest repeated, clean leading run of
        ``elements`` to ``proj``; returns its length ``k`` (project ``elements[k:]`` next)."""
        n = min(len(self.raw), len(elements))
        same = list(map(operator.is_, elements[:n], self.raw[:n]))
        try:
            k = same.index(False)
        except ValueError:
            k = n
        while k and not self.clean[k - 1]:
            k -= 1
        cut = self.ends[k - 1] if k else 0
        proj.messages.extend(self.messages[:cut])
        proj.sources.extend(self.sources[:cut])
        return k

    def remember(self, elements: list[Any], k: int, ends: list[int], clean: list[bool],
                 proj: Projection, base: int) -> None:
        """Moves on to ``elements`` (projected into ``proj`` from message ``base`` on): the
        first ``k`` were resumed, ``ends`` and ``clean`` describe the rest (counts from ``base``)."""
        self.raw = list(elements)
        self.ends = self.ends[:k] + ends
        self.clean = self.clean[:k] + clean
        self.messages, self.sources = proj.messages[base:], proj.sources[base:]

    def project(self, elements: list[Any], proj: Projection,
                project_one: Callable[[Any, int, Projection], None]) -> None:
        """Adds the projection of ``elements`` to ``proj`` when each element projects on its
        own (``project_one(element, index, proj)``; Anthropic ``messages``).

        Raises:
            InvalidRequestError: as ``project_one`` (the memo then stays as it was).
        """
        base = len(proj.messages)
        k = self.resume(elements, proj)
        ends = []
        for index in range(k, len(elements)):
            project_one(elements[index], index, proj)
            ends.append(len(proj.messages) - base)
        self.remember(elements, k, ends, [True] * len(ends), proj, base)


def project_flat_tools(
    tools: Any,
    proj: Projection,
    *,
    function_types: tuple[Any, ...],
    schema_key: str,
    schema_required: bool,
    other_types_hint: str,
    server_tool: Callable[[Any, str, str], IgnoredField | None] | None = None,
) -> None:
    """Projects flat tool definitions (the Anthropic shape) into canonical tools.

    Only tools that run on the provider's side are skipped (``server_tool`` says which; each is
    added to ``proj.ignored``): a client tool the model could not be shown would be missing from
    the prompt while the agent believes it offered it, so it is refused.

    Args:
        tools: the request's ``tools`` value.
        proj: the projection collecting the canonical request.
        function_types: ``type`` values that mean a function tool.
        schema_key: where the JSON schema lives (``parameters`` or ``input_schema``).
        schema_required: whether the schema must be present.
        other_types_hint: what the 400 for any other ``type`` tells the client to do.
        server_tool: ``(type, path, hint)`` → the report of a provider-side tool to leave
            out, or None for a type that is refused.

    Raises:
        InvalidRequestError: not a list, an entry that is not an object, a ``type`` outside
            ``function_types`` (``param`` ``tools[i].type``), a missing name, a schema that is
            not an object, or a description that is not a string.
    """
    if tools is None:
        return
    require_list(tools, "tools")
    for index, tool in enumerate(tools):
        path = f"tools[{index}]"
        require_object(tool, path)
        kind = tool.get("type")
        if kind not in function_types:
            server = None if server_tool is None else server_tool(kind, path, other_types_hint)
            if server is not None:
                proj.ignored.append(server)
                continue
            raise InvalidRequestError(f"{path}.type {kind!r} is not supported: {other_types_hint}",
                                      param=f"{path}.type")
        name = non_empty_str(tool.get("name"), f"{path}.name")
        schema = tool.get(schema_key)
        if (schema is not None or schema_required) and not isinstance(schema, dict):
            raise InvalidRequestError(f"{path}.{schema_key} must be a JSON object",
                                      param=f"{path}.{schema_key}")
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise InvalidRequestError(f"{path}.description must be a string", param=f"{path}.description")
        proj.add_tool(name, schema, description, path)
