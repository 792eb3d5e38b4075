"""Canonical messages, tools and chat-template kwargs, and the state hash.

Every protocol (Chat Completions, Responses, Anthropic Messages) and every explicit export record
is projected onto one canonical triple ``(messages, tools, template_kwargs)``; a conversation
state is identified by the SHA-256 of its compact, key-sorted JSON. The rules
(docs/canonical-contract.md#messages and the sections after it):

* roles ``user``, ``assistant``, ``tool``, ``system``; every other role is rejected;
* string content must be non-empty, except for assistants that carry tool calls or non-empty
  ``reasoning_content``; ``None`` content only for such assistants (stored as ``""``); a ``tool``
  message with ``None`` or ``""`` content is rejected with the advice to send a stable non-empty
  value (:data:`EMPTY_TOOL_RESULT`; the contract's rule); an empty list is rejected; list items
  are kept verbatim (copied), only an empty ``text`` item is rejected;
* kept keys: ``role``, ``content``, ``reasoning_content`` (only when a non-empty string),
  ``tool_calls`` (assistant only, when non-empty), ``tool_call_id`` (tool only, when present,
  non-empty string; a protocol's :class:`~._rules.MessageRules` may make it required, as Chat
  Completions does, and limit the content-part types); all other keys are dropped;
* the ``system`` messages before the first other message are merged (texts joined with
  ``"\\n\\n"``) into one leading system message; a ``system`` message that comes later (Codex's
  ``developer`` message on a resumed thread, Claude Code's ``role: "system"`` entries) stays
  where it is, so earlier turns keep their canonical form; consecutive late ones are merged
  the same way (docs/canonical-contract.md#system-messages);
* tool-call arguments become compact sorted JSON object strings (see :func:`canonical_arguments`);
* tools keep only ``{"type": "function", "function": {...}}`` entries (others are dropped
  silently), with ``name``, ``parameters`` and ``description`` (when not None);
* template kwargs: keys sorted recursively; the reserved keys ``add_generation_prompt``,
  ``tokenize`` and ``tools`` are rejected.

Where we are stricter (docs/canonical-contract.md#where-we-are-stricter; each one only rejects or
unifies inputs that would otherwise hash inconsistently):

* A tool call is rebuilt as ``{"id"?, "type": "function", "function": {"name"?, "arguments"}}``:
  copying the whole call would let an echo carrying an extra key (a streaming ``index``) or
  missing ``type`` never match the committed state. A ``type`` other than ``function``
  is rejected.
* Every kept value must be plain JSON: non-string keys, sets and ``NaN``/``Infinity`` anywhere
  (content parts, tool schemas, template kwargs) are rejected instead of being hashed through
  ``default=str`` or as the non-JSON ``NaN`` token; text that cannot be encoded as UTF-8 (lone
  surrogates) is rejected instead of failing the hash with a 500. Template-kwargs keys must be
  strings (stringifying them could merge ``1`` and ``"1"``).

Kept lenient on purpose: ``reasoning_content`` is kept on any non-system role, tool results need
not reference an earlier call id, ``image_url`` parts are not reshaped, and tool schemas keep
their key order (the hash sorts keys anyway).

Every rejection is an :class:`~relaxtrio.InvalidRequestError` whose ``param`` is the field path
(``messages[3].content``, ``messages[2].tool_calls[0].function.arguments``); the message text
starts with the same path.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any, Final

import attrs

from .._errors import InvalidRequestError
from .._validate import require_list, require_object, type_name
from ._json import canonical_arguments, copy_json, dumps
from ._rules import NO_RULES, MessageRules
from ._shared import grown

ROLES: Final = frozenset({"assistant", "system", "tool", "user"})
RESERVED_TEMPLATE_KWARGS: Final = frozenset({"add_generation_prompt", "tokenize", "tools"})

EMPTY_TOOL_RESULT: Final = ('must not be empty: represent a tool result of None or "" with a stable '
                             'non-empty value (the same text every time, e.g. "(no output)")')

HASH_PREFIX: Final = b'{"messages":['
"""Start of the serialized state: with sorted keys ``messages`` comes first."""


def canonical_messages(messages: Any, *, param: str = "messages",
                       rules: MessageRules = NO_RULES) -> tuple[dict[str, Any], ...]:
    """Validates and canonicalizes a message list (see the module docstring for the rules).

    Args:
        messages: a list (or tuple) of message dicts; None means no messages.
        param: field path prefix of the list (``messages``; the Responses layer passes ``input``).
        rules: the checks the request's protocol adds (Chat Completions: ``tool_call_id``
            required, its content-part types only); the default adds none.

    Returns:
        Fresh canonical messages; the merged leading system message, if any, comes first, and
        later system messages keep their positions.

    Raises:
        InvalidRequestError: with ``param`` set to the offending field's path.
    """
    if messages is None:
        return ()
    require_list(messages, param)
    entries = []
    for index, message in enumerate(messages):
        chunks: list[str] = []
        entries.append((_canonical_message(message, f"{param}[{index}]", chunks, rules=rules), chunks))
    return tuple(place_system_messages(entries))


def place_system_messages(
    entries: Sequence[tuple[dict[str, Any] | None, Sequence[str]]],
    *,
    continued: bool = False,
) -> list[dict[str, Any]]:
    """The system-message rule: leading system texts merge into one first message; a later run
    of system messages stays in place as one message; a system message with no text is dropped.

    Args:
        entries: per message, ``(canonical, [])`` for a non-system message or ``(None, texts)``
            for a system one (what :func:`_canonical_message` returns and collects).
        continued: the entries continue a list whose placed form ends with a non-system
            message; then nothing in them is leading, and the result is what placing the whole
            list adds after that form (:class:`~relaxtrio.forest._memo.ConversationMemo`).

    Returns:
        The messages; non-system ones are the given objects, system ones are fresh dicts.
    """
    leading: list[str] = []
    out: list[dict[str, Any]] = []
    late_run = False  # out[-1] is a system message after the first non-system message
    for canonical, chunks in entries:
        if canonical is not None:
            out.append(canonical)
            late_run = False
        elif not out and not continued:
            leading.extend(chunks)
        elif chunks and late_run:
            out[-1]["content"] += "\n\n" + "\n\n".join(chunks)
        elif chunks:
            out.append({"role": "system", "content": "\n\n".join(chunks)})
            late_run = True
    if leading:
        out.insert(0, {"role": "system", "content": "\n\n".join(leading)})
    return out


def canonical_message(message: Any, *, param: str = "message") -> dict[str, Any]:
    """Canonicalizes one non-system message (e.g. a parsed assistant reply).

    Raises:
        InvalidRequestError: the message is invalid or is a system message.
    """
    chunks: list[str] = []
    canonical = _canonical_message(message, param, chunks)
    if canonical is None:
        raise InvalidRequestError.at(f"{param}.role", "must not be system here")
    return canonical


def _canonical_message(message: Any, where: str, system_chunks: list[str], *,
                       rules: MessageRules = NO_RULES) -> dict[str, Any] | None:
    """One message; a system message adds its text to ``system_chunks`` and returns None
    (``rules``: as :func:`canonical_messages`)."""
    require_object(message, where)
    if "role" not in message:
        raise InvalidRequestError(f"{where} must include role", param=f"{where}.role")
    role = message["role"]
    if not isinstance(role, str):
        raise InvalidRequestError.at(f"{where}.role", f"must be a string, got {type_name(role)}")
    if role not in ROLES:
        raise InvalidRequestError.at(f"{where}.role", f"must be one of: {', '.join(sorted(ROLES))}")
    tool_calls = _canonical_tool_calls(message.get("tool_calls"), where) if role == "assistant" else []
    reasoning = message.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
        raise InvalidRequestError.at(
            f"{where}.reasoning_content", f"must be a string, got {type_name(reasoning)}"
        )
    empty_content_ok = role == "assistant" and bool(tool_calls or reasoning)
    tool_call_id = None
    if role == "tool" and "tool_call_id" in message:
        tool_call_id = message["tool_call_id"]
        if not isinstance(tool_call_id, str) or not tool_call_id:
            raise InvalidRequestError.at(f"{where}.tool_call_id", "must be a non-empty string")
    elif role == "tool" and rules.require_tool_call_id:
        raise InvalidRequestError.at(f"{where}.tool_call_id",
                                     "is required (the id of the assistant tool call it answers)")
    if role == "tool" and message.get("content") in (None, ""):
        raise InvalidRequestError.at(f"{where}.content", EMPTY_TOOL_RESULT)
    if "content" not in message and not empty_content_ok:
        raise InvalidRequestError(f"{where} must include content", param=f"{where}.content")
    content = message.get("content")
    if content is None or content == "":
        if not empty_content_ok:
            raise InvalidRequestError.at(f"{where}.content", "must not be empty")
        content = ""
    elif isinstance(content, (list, tuple)):
        content = _canonical_parts(content, f"{where}.content", rules)
    elif not isinstance(content, str):
        raise InvalidRequestError.at(
            f"{where}.content", f"must be a list, string, or None, got {type_name(content)}"
        )
    if role == "system":
        if isinstance(content, str):
            system_chunks.append(content)
        else:
            system_chunks.extend(part["text"] for part in content if isinstance(part.get("text"), str))
        return None
    out: dict[str, Any] = {"role": role, "content": content}
    if reasoning:
        out["reasoning_content"] = reasoning
    if tool_calls:
        out["tool_calls"] = tool_calls
    if tool_call_id is not None:
        out["tool_call_id"] = tool_call_id
    return out


def _canonical_parts(parts: list[Any] | tuple[Any, ...], where: str, rules: MessageRules) -> list[dict[str, Any]]:
    if not parts:
        raise InvalidRequestError.at(where, "must not be empty")
    out = []
    for index, part in enumerate(parts):
        path = f"{where}[{index}]"
        require_object(part, path)
        rules.check_part(part, path)
        out.append(copy_json(part, path))
    return out


def _canonical_tool_calls(tool_calls: Any, where: str) -> list[dict[str, Any]]:
    if tool_calls is None:
        return []
    require_list(tool_calls, f"{where}.tool_calls")
    out = []
    for index, call in enumerate(tool_calls):
        path = f"{where}.tool_calls[{index}]"
        require_object(call, path)
        canonical: dict[str, Any] = {}
        call_id = call.get("id")
        if call_id is not None:
            if not isinstance(call_id, str) or not call_id:
                raise InvalidRequestError.at(f"{path}.id", "must be a non-empty string")
            canonical["id"] = call_id
        call_type = call.get("type")
        if call_type is not None and call_type != "function":
            raise InvalidRequestError.at(f"{path}.type", 'must be "function"')
        canonical["type"] = "function"
        function = require_object(call.get("function"), f"{path}.function")
        canonical_function: dict[str, Any] = {}
        name = function.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise InvalidRequestError.at(
                    f"{path}.function.name", f"must be a string, got {type_name(name)}"
                )
            canonical_function["name"] = name
        args_path = f"{path}.function.arguments"
        canonical_function["arguments"] = canonical_arguments(function.get("arguments"), param=args_path)
        canonical["function"] = canonical_function
        out.append(canonical)
    return out


def canonical_tools(tools: Any, *, param: str = "tools") -> tuple[dict[str, Any], ...]:
    """Normalizes tools to the nested function shape.

    Entries that are not ``{"type": "function", "function": {...}}`` are dropped
    (docs/canonical-contract.md#tools).

    Returns:
        ``({"type": "function", "function": {"name", "parameters", "description"?}}, ...)``.

    Raises:
        InvalidRequestError: not a list, an entry that is not an object, or non-JSON values.
    """
    if tools is None:
        return ()
    require_list(tools, param)
    out = []
    for index, tool in enumerate(tools):
        path = f"{param}[{index}]"
        require_object(tool, path)
        function = tool.get("function")
        if tool.get("type") != "function" or not isinstance(function, dict):
            continue
        canonical = {"name": function.get("name"), "parameters": function.get("parameters")}
        if function.get("description") is not None:
            canonical["description"] = function["description"]
        out.append({"type": "function", "function": copy_json(canonical, f"{path}.function")})
    return tuple(out)


def canonical_template_kwargs(
    template_kwargs: Any,
    *,
    base: Any = None,
    param: str = "chat_template_kwargs",
) -> dict[str, Any]:
    """Normalizes chat-template kwargs: ``base`` overlaid by ``template_kwargs``, keys sorted.

    Args:
        template_kwargs: the request's (or export record's) kwargs; None means ``{}``.
        base: server-wide kwargs (``--apply-chat-template-kwargs``) under the request's, or None.
        param: the field path for errors.

    Returns:
        A fresh dict whose keys (recursively) are sorted.

    Raises:
        InvalidRequestError: not an object, a reserved key, or a non-JSON value.
    """
    merged: dict[str, Any] = {}
    for value in (base, template_kwargs):
        if value is None:
            continue
        merged.update(require_object(value, param))
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(merged))
    if reserved:
        raise InvalidRequestError.at(param, f"cannot set reserved keys: {', '.join(reserved)}")
    kwargs: dict[str, Any] = _sorted_keys(copy_json(merged, param))
    return kwargs


def _sorted_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(item) for item in value]
    return value


def _encode(value: Any, param: str) -> bytes:
    try:
        return dumps(value).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequestError.at(param, "must be valid UTF-8 text") from None
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError.at(param, f"must contain only JSON values ({exc})") from None


def _dict_tuple(items: Iterable[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    return tuple(items)


@attrs.frozen
class Conversation:
    """One canonical conversation state: messages plus the tools and template kwargs they use.

    Build it with :meth:`from_wire`; the constructor trusts that its arguments are already
    canonical (it only serializes them). Two conversations are equal exactly when their canonical
    JSON is equal, i.e. when they have the same :func:`state_hash`. Treat the dicts as immutable.

    Attributes:
        messages: canonical messages, length ``n`` (a tuple, or for a conversation the
            Session's memo extended, an equal read-only :class:`~relaxtrio.forest._shared.SharedRun`).
        tools: canonical tools.
        template_kwargs: canonical chat-template kwargs (keys sorted).
    """

    messages: tuple[dict[str, Any], ...] = attrs.field(converter=_dict_tuple, eq=False)
    tools: tuple[dict[str, Any], ...] = attrs.field(converter=_dict_tuple, eq=False, factory=tuple)
    template_kwargs: dict[str, Any] = attrs.field(eq=False, factory=dict)
    # Serialized forms, computed once: ``[n]`` UTF-8 JSON per message and the constant tail
    # ``],"template_kwargs":K,"tools":T}`` that closes every prefix of this conversation.
    _message_json: tuple[bytes, ...] = attrs.field(init=False, repr=False)
    _suffix: bytes = attrs.field(init=False, repr=False)
    # ``[n + 1]`` running hash states of the message prefixes (see :meth:`_prefix_states`), or
    # None until first asked for.
    _states: Sequence[Any] | None = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        encoded = tuple(_encode(m, f"messages[{i}]") for i, m in enumerate(self.messages))
        suffix = b"".join(
            (
                b'],"template_kwargs":',
                _encode(self.template_kwargs, "chat_template_kwargs"),
                b',"tools":',
                _encode(list(self.tools), "tools"),
                b"}",
            )
        )
        object.__setattr__(self, "_message_json", encoded)
        object.__setattr__(self, "_suffix", suffix)
        object.__setattr__(self, "_states", None)

    @classmethod
    def from_wire(
        cls,
        messages: Any,
        tools: Any = None,
        template_kwargs: Any = None,
        *,
        base_template_kwargs: Any = None,
        messages_param: str = "messages",
        tools_param: str = "tools",
        template_kwargs_param: str = "chat_template_kwargs",
        rules: MessageRules = NO_RULES,
    ) -> Conversation:
        """Canonicalizes a request's history, tools and template kwargs. Never mutates its input.

        Args:
            messages: the message list (Chat-shaped dicts).
            tools: the tool list, or None.
            template_kwargs: the chat-template kwargs, or None.
            base_template_kwargs: server-wide kwargs the request's are merged over, or None.
            messages_param: field path prefix for message errors (``input`` for Responses).
            tools_param: field path prefix for tool errors.
            template_kwargs_param: field path for template-kwargs errors.
            rules: the checks the request's protocol adds to the canonical rules (Chat
                Completions: :class:`~._rules.MessageRules`); the default adds none.

        Returns:
            The canonical conversation.

        Raises:
            InvalidRequestError: an invalid field; ``param`` is its path.
        """
        return cls(
            canonical_messages(messages, param=messages_param, rules=rules),
            canonical_tools(tools, param=tools_param),
            canonical_template_kwargs(
                template_kwargs, base=base_template_kwargs, param=template_kwargs_param
            ),
        )


    @classmethod
    def _from_canonical(
        cls,
        messages: Sequence[dict[str, Any]],
        message_json: Sequence[bytes],
        tools: tuple[dict[str, Any], ...],
        template_kwargs: dict[str, Any],
        states: Sequence[Any] | None = None,
    ) -> Conversation:
        """A conversation from parts that are canonical already, ``message_json[i]`` being the
        serialization of ``messages[i]`` (the memo of :mod:`._memo` has them) and ``states``,
        when given, its prefix hash states (see :meth:`_prefix_states`)."""
        conv = cls.__new__(cls)
        object.__setattr__(conv, "messages", messages)
        object.__setattr__(conv, "tools", tuple(tools))
        object.__setattr__(conv, "template_kwargs", template_kwargs)
        object.__setattr__(conv, "_message_json", message_json)
        suffix = b"".join((b'],"template_kwargs":', _encode(template_kwargs, "chat_template_kwargs"),
                           b',"tools":', _encode(list(tools), "tools"), b"}"))
        object.__setattr__(conv, "_suffix", suffix)
        object.__setattr__(conv, "_states", states)
        return conv

    def with_template_kwargs(self, template_kwargs: dict[str, Any]) -> Conversation:
        """The same messages and tools under other (canonical) template kwargs, reusing the
        messages' serialized forms and prefix hash states (so O(1) in the history length)."""
        return Conversation._from_canonical(self.messages, self._message_json, self.tools,
                                            template_kwargs, self._states)

    def _prefix_states(self) -> Sequence[Any]:
        """``[n + 1]`` running SHA-256 states: entry ``k`` has been fed ``HASH_PREFIX`` and the
        JSON of the first ``k`` messages, comma-separated, so closing it with
        :func:`finish_hash` and this conversation's suffix gives the state hash of
        ``messages[:k]``. Computed once; the states are shared (copy one before updating it)."""
        states = self._states
        if states is None:
            states = extend_prefix_states((hashlib.sha256(HASH_PREFIX),), self._message_json)
            object.__setattr__(self, "_states", states)
        return states


def extend_prefix_states(states: Sequence[Any], message_json: Sequence[bytes]) -> Sequence[Any]:
    """``states`` (prefix hash states of some messages, see :meth:`Conversation._prefix_states`)
    followed by the states after each message of ``message_json`` in turn.

    One hash copy and update per new message; ``states`` is not copied when it is the longest
    view of its :class:`~relaxtrio.forest._shared.SharedRun` (the result extends it in place;
    neither the given states nor any view of them change).
    """
    hasher = states[-1]
    new: list[Any] = []
    for encoded in message_json:
        hasher = hasher.copy()
        if len(states) + len(new) > 1:
            hasher.update(b",")
        hasher.update(encoded)
        new.append(hasher)
    return grown(states, new)


def finish_hash(hasher: Any, suffix: bytes) -> str:
    """Closes a running hash with a subtree's constant tail; does not modify ``hasher``."""
    closed = hasher.copy()
    closed.update(suffix)
    digest: str = closed.hexdigest()
    return digest


def state_hash(conv: Conversation) -> str:
    """SHA-256 hex of the compact, key-sorted JSON of ``{messages, tools, template_kwargs}``.

    Equal to ``sha256(json.dumps({"messages": M, "tools": T, "template_kwargs": K},
    ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()).hexdigest()``
    (docs/canonical-contract.md#the-state-hash); key order never matters, array order always does.
    """
    hasher = hashlib.sha256(HASH_PREFIX)
    hasher.update(b",".join(conv._message_json))
    return finish_hash(hasher, conv._suffix)
