"""Canonicalize only what is new: a Session's requests repeat their whole history every turn.

An agent sends turn ``n`` with the ``2n`` messages of the conversation so far; canonicalizing and
serializing all of them on every request makes a long Session quadratic. A
:class:`ConversationMemo` (one per Session, kept by the API) keeps the previous request's raw
messages with their canonical forms and JSON, and the :class:`Conversation` it built (with its
prefix hash states, which :meth:`SessionForest.match` reads). The result always equals
``Conversation.from_wire`` on the same input, errors included (an invalid message is always a
new one: every reused one was valid at the same index).

Two paths:

* **Extension** (the common case): the request starts with *all* of the previous request's
  messages (``new[:k] == old``, one comparison run in C) and the previous canonical list ended
  with a non-system message. Then nothing new can change an earlier canonical message (a
  leading system message is only leading before the first other message; a late system run can
  only grow while it is the last message), so the result is the previous conversation plus the
  canonical form of the new tail: only the tail is validated, canonicalized, serialized and
  hashed, and the per-request cost does not grow with the history (beyond C-speed list copies).
* **Reuse** (anything else: an edited or removed message, a shorter or branched history, a
  history ending in a system message): the longest run of leading messages that are identical
  is reused message by message, the rest is canonicalized, and the system-message rule is
  applied to the whole list, as ``from_wire`` does.

"Identical" must mean equal JSON, and Python's ``==`` says ``1 == 1.0 == True`` and
``0.0 == -0.0``; so a message holding anything but strings, ``None``, lists and dicts (a
*number message*) is never taken on ``==`` alone: the reuse path canonicalizes it afresh, and
the extension path compares it again with a type-exact comparison (a Python walk over those
messages only; chat messages rarely hold numbers).

The memo keeps references to the request's message objects (never copies of them, never
mutating them); callers must not mutate a request's messages after handing them over (the API
parses a fresh body per request).
"""

from __future__ import annotations

from typing import Any

from .._errors import InvalidRequestError
from ._canonical import (
    Conversation,
    _canonical_message,
    _encode,
    canonical_template_kwargs,
    canonical_tools,
    extend_prefix_states,
    place_system_messages,
)
from ._rules import NO_RULES, MessageRules
from ._shared import grown

__all__ = ["ConversationMemo"]

# Per message: (strings only, its system texts, canonical message or None (system), its JSON).
_Item = tuple[bool, list[str], dict[str, Any] | None, bytes | None]


def _strings_only(value: Any) -> bool:
    """Whether ``value`` is built from str, None, list and dict (str keys) alone."""
    if value is None or type(value) is str:
        return True
    if type(value) is dict:
        return all(type(k) is str and _strings_only(v) for k, v in value.items())
    if type(value) is list:
        return all(_strings_only(v) for v in value)
    return False


def _same_json(a: Any, b: Any) -> bool:
    """Whether two parsed JSON values serialize identically (``==`` with exact types)."""
    if a is b:  # the API's body memo hands over the previous body's very objects
        return True
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return a.keys() == b.keys() and all(_same_json(v, b[k]) for k, v in a.items())
    if type(a) is list:
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is float:
        return repr(a) == repr(b)  # 0.0 == -0.0, but their JSON differs
    return bool(a == b)


def _canonical_items(messages: list[Any], start: int, param: str, rules: MessageRules) -> list[_Item]:
    """Canonicalizes and serializes ``messages[start:]`` (errors name the request index;
    ``rules`` as :func:`~relaxtrio.forest._canonical.canonical_messages`).

    Raises:
        InvalidRequestError: an invalid message (the encoding errors' ``param`` is only
            ``messages``; callers re-raise through ``from_wire`` for the exact one).
    """
    items: list[_Item] = []
    for index in range(start, len(messages)):
        message = messages[index]
        chunks: list[str] = []
        canonical = _canonical_message(message, f"{param}[{index}]", chunks, rules=rules)
        encoded = None if canonical is None else _encode(canonical, "messages")
        items.append((_strings_only(message), chunks, canonical, encoded))
    return items


def _placed_json(out: list[dict[str, Any]], items: list[_Item], first_index: int) -> tuple[bytes, ...]:
    """The JSON of placed messages ``out``: a non-system one's from its item, a (fresh) system
    one encoded here (``first_index`` is the position of ``out[0]`` in the conversation)."""
    known = {id(canonical): enc for _, _, canonical, enc in items if canonical is not None and enc is not None}
    return tuple(known[id(m)] if id(m) in known else _encode(m, f"messages[{first_index + i}]")
                 for i, m in enumerate(out))


class ConversationMemo:
    """The previous request's messages of one Session, for :meth:`conversation`.

    Not thread-safe (the API uses it on the trio thread); never mutates a request.
    """

    def __init__(self) -> None:
        self._raw: list[Any] = []  # previous request's messages (a copy of the list, not of them)
        self._items: list[_Item] = []  # per message of ``_raw``
        self._number_messages: list[int] = []  # indices in ``_raw`` of messages not strings-only
        self._conv: Conversation | None = None  # built from ``_raw``; its prefix states are set
        self._extensible = False  # ``_conv``'s messages end with a non-system message
        self.num_reused = 0
        """Messages taken from the memo so far (for tests and benchmarks)."""
        self.num_extended = 0
        """Requests answered by the extension path (for tests and benchmarks)."""
        self.extended_from: int | None = None
        """After :meth:`conversation`: how many leading messages of that request repeated the
        remembered ones exactly (the extension path), or None when it took another path."""

    def conversation(
        self,
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
        """``Conversation.from_wire(...)`` with the same arguments, reusing leading messages.

        Reused messages were validated by an earlier request, possibly of another protocol and
        under other ``rules``: those protocols' projections always name the call id of a tool
        message and make only ``text`` and ``image_url`` parts, so a repeated message is valid
        under the Chat Completions rules too.

        Raises:
            InvalidRequestError: as :meth:`Conversation.from_wire`.
        """

        def plain() -> Conversation:  # from_wire itself, also for raising its exact errors
            return Conversation.from_wire(
                messages, tools, template_kwargs, base_template_kwargs=base_template_kwargs,
                messages_param=messages_param, tools_param=tools_param,
                template_kwargs_param=template_kwargs_param,
                rules=rules,
            )

        self.extended_from = None
        if not isinstance(messages, list):  # None, tuples and wrong types: the plain path
            return plain()
        try:
            tools_c = canonical_tools(tools, param=tools_param)
            kwargs_c = canonical_template_kwargs(template_kwargs, base=base_template_kwargs,
                                                 param=template_kwargs_param)
            conv = self._extended(messages, tools_c, kwargs_c, messages_param, rules)
            if conv is None:
                conv = self._reused(messages, tools_c, kwargs_c, messages_param, rules)
        except InvalidRequestError:
            # The plain path raises the very same error (its encoding errors name the index
            # after the system merge, which only it knows); the memo stays as it was.
            return plain()
        return conv

    def _extended(self, messages: list[Any], tools: tuple[dict[str, Any], ...],
                  template_kwargs: dict[str, Any], param: str, rules: MessageRules) -> Conversation | None:
        """The extension path (module docstring), or None when it does not apply."""
        raw, prev = self._raw, self._conv
        k = len(raw)
        if prev is None or not self._extensible or len(messages) < k or messages[:k] != raw:
            return None
        if not all(_same_json(messages[i], raw[i]) for i in self._number_messages):
            return None
        items = _canonical_items(messages, k, param, rules)
        out = place_system_messages([(canonical, chunks) for _, chunks, canonical, _ in items],
                                    continued=True)
        tail_json = _placed_json(out, items, len(prev.messages))
        conv = Conversation._from_canonical(
            grown(prev.messages, out), grown(prev._message_json, tail_json), tools, template_kwargs,
            extend_prefix_states(prev._prefix_states(), tail_json),
        )
        self.num_reused += k
        self.num_extended += 1
        self.extended_from = k
        # The memo's own lists grow in place (no copies of the history): the repeated messages
        # are equal to the remembered ones, exactly so for the number messages.
        self._raw.extend(messages[k:])
        self._items.extend(items)
        self._number_messages.extend(k + i for i, item in enumerate(items) if not item[0])
        self._set_conversation(conv)
        return conv

    def _reused(self, messages: list[Any], tools: tuple[dict[str, Any], ...],
                template_kwargs: dict[str, Any], param: str, rules: MessageRules) -> Conversation:
        """The reuse path (module docstring)."""
        raw, items = self._raw, self._items
        same = 0
        limit = min(len(raw), len(messages))
        while same < limit and items[same][0] and messages[same] == raw[same]:
            same += 1
        new_items = items[:same] + _canonical_items(messages, same, param, rules)
        out = place_system_messages([(canonical, chunks) for _, chunks, canonical, _ in new_items])
        conv = Conversation._from_canonical(tuple(out), _placed_json(out, new_items, 0), tools,
                                            template_kwargs)
        conv._prefix_states()  # computed now, so the next extension only adds to them
        self.num_reused += same
        self._raw, self._items = list(messages), new_items
        self._number_messages = [i for i, item in enumerate(new_items) if not item[0]]
        self._set_conversation(conv)
        return conv

    def _set_conversation(self, conv: Conversation) -> None:
        """Moves the memo on to a request whose conversation was built (everything valid)."""
        self._conv = conv
        self._extensible = bool(conv.messages) and conv.messages[-1]["role"] != "system"
