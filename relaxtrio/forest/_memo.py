"""Canonicalize only what is new: a Session's requests repeat their whole history every turn.

An agent sends turn ``n`` with the ``2n`` messages of the conversation so far; canonicalizing and
serializing all of them on every request makes a long Session quadratic. A
:class:`ConversationMemo` (one per Session, on its forest) keeps the previous request's raw
messages with their canonical forms and JSON; the next request reuses them for the longest run of
leading messages that are *identical*, and runs :func:`canonical_messages`' per-message rule only
on the rest. The result equals ``Conversation.from_wire`` on the same input, errors included
(an invalid message is always a new one: every reused one was valid at the same index).

"Identical" must mean equal JSON, and Python's ``==`` says ``1 == 1.0 == True``; so a message is
reused only when it equals the remembered one and the remembered one holds nothing but strings,
``None``, lists and dicts (then equality is exact). Messages with numbers or booleans anywhere are
canonicalized afresh each time; chat messages rarely have them.
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
    place_system_messages,
)

__all__ = ["ConversationMemo"]


def _strings_only(value: Any) -> bool:
    """Whether ``value`` is built from str, None, list and dict (str keys) alone."""
    if value is None or type(value) is str:
        return True
    if type(value) is dict:
        return all(type(k) is str and _strings_only(v) for k, v in value.items())
    if type(value) is list:
        return all(_strings_only(v) for v in value)
    return False


class ConversationMemo:
    """The previous request's messages of one Session, for :meth:`conversation`.

    Not thread-safe (the API uses it on the trio thread); never mutates a request.
    """

    def __init__(self) -> None:
        self._raw: list[Any] = []  # previous request's messages (the parsed dicts, not copied)
        # per message: (reusable, its system texts, canonical message or None (system), its JSON)
        self._items: list[tuple[bool, list[str], dict[str, Any] | None, bytes | None]] = []
        # JSON of the system messages the previous request placed, by their text: the merged
        # system message is a fresh dict on every request, but usually the same text.
        self._system_json: dict[str, bytes] = {}
        self.num_reused = 0
        """Messages taken from the memo so far (for tests and benchmarks)."""

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
    ) -> Conversation:
        """``Conversation.from_wire(...)`` with the same arguments, reusing leading messages.

        Raises:
            InvalidRequestError: as :meth:`Conversation.from_wire`.
        """
        if not isinstance(messages, list):  # None, tuples and wrong types: the plain path
            return Conversation.from_wire(
                messages, tools, template_kwargs, base_template_kwargs=base_template_kwargs,
                messages_param=messages_param, tools_param=tools_param,
                template_kwargs_param=template_kwargs_param,
            )
        raw, items = self._raw, self._items
        same = 0
        limit = min(len(raw), len(messages))
        while same < limit and items[same][0] and messages[same] == raw[same]:
            same += 1
        new_items = items[:same]
        try:
            for index in range(same, len(messages)):
                message = messages[index]
                chunks: list[str] = []
                canonical = _canonical_message(message, f"{messages_param}[{index}]", chunks)
                encoded = None if canonical is None else _encode(canonical, "messages")
                new_items.append((_strings_only(message), chunks, canonical, encoded))
        except InvalidRequestError:
            # The plain path raises the very same error (its encoding errors name the index
            # after the system merge, which only it knows).
            return Conversation.from_wire(
                messages, tools, template_kwargs, base_template_kwargs=base_template_kwargs,
                messages_param=messages_param, tools_param=tools_param,
                template_kwargs_param=template_kwargs_param,
            )
        self.num_reused += same
        # Only now (everything valid) does the memo move on to this request.
        self._raw, self._items = messages, new_items
        out = place_system_messages([(canonical, chunks) for _, chunks, canonical, _ in new_items])
        reused = {id(canonical): enc for _, _, canonical, enc in new_items if canonical is not None}
        previous_system, system_json = self._system_json, {}
        encoded: list[bytes] = []
        for i, m in enumerate(out):
            enc = reused.get(id(m))
            if enc is None:  # a system message placed by place_system_messages
                text = m["content"]
                enc = previous_system.get(text)
                if enc is None:
                    enc = _encode(m, f"messages[{i}]")
                system_json[text] = enc
            encoded.append(enc)
        self._system_json = system_json
        encoded_all = tuple(encoded)
        return Conversation._from_canonical(
            tuple(out), encoded_all,
            canonical_tools(tools, param=tools_param),
            canonical_template_kwargs(template_kwargs, base=base_template_kwargs,
                                      param=template_kwargs_param),
        )
