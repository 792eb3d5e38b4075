"""What the API remembers of a Session's previous model request, so the next one costs only what is new.

Every request of a Session repeats its whole history. Four layers each keep the previous
request's work and redo only the new tail:

* the body bytes and their decoded history elements (:class:`~.body_memo.BodyMemo`);
* how those elements projected onto Chat-shaped messages, for Responses and Messages
  (:class:`~.projection.ElementMemo`);
* the canonical conversation and its prefix hashes (:class:`~relaxtrio.forest.ConversationMemo`,
  the forest's own rules);
* the tool call ids the remembered messages made (:class:`~.projection.ToolScan`).

:class:`SessionMemo` holds the four for one Session and keeps the last two in step (a scan is
only reused for a request whose conversation extended exactly the scanned messages);
:class:`SessionMemos` maps live Sessions to theirs and forgets the memos of closed Sessions.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs

from ..forest import Conversation, ConversationMemo
from ..nursery.session import Session
from .body_memo import BodyMemo
from .projection import ElementMemo, ToolScan, check_tool_results

__all__ = ["SessionMemo", "SessionMemos"]

_MIN_PRUNE: Final = 64  # memos held before closed Sessions' memos are first looked for


@attrs.define(eq=False)
class SessionMemo:
    """The previous request of one Session, as each parsing layer saw it (module docstring).

    Not thread-safe (the API uses it on the trio thread). The request parsers take it in place
    of ``None`` (no memo: everything parsed afresh); results are always the same.

    Attributes:
        body: the previous request bodies' bytes and decoded elements.
        elements: how the previous history elements projected (Responses, Messages).
        canonical: the previous request's canonical messages.
    """

    body: BodyMemo
    elements: ElementMemo = attrs.field(factory=ElementMemo)
    canonical: ConversationMemo = attrs.field(factory=ConversationMemo)
    _tool_scan: ToolScan | None = None  # covers exactly ``canonical``'s remembered messages
    _resumable: ToolScan | None = None  # covers the leading messages the last request repeated

    @property
    def tool_scan(self) -> ToolScan | None:
        """The call ids of the remembered messages, or None when they were not scanned."""
        return self._tool_scan

    def conversation(self, messages: Any, tools: Any = None, template_kwargs: Any = None,
                     **options: Any) -> Conversation:
        """:meth:`ConversationMemo.conversation` with the same arguments (``options``: its
        keyword-only ones); the tool scan follows: kept for :meth:`check_tool_results` when
        this request extended exactly the scanned messages, dropped otherwise.

        Raises:
            InvalidRequestError: as :meth:`Conversation.from_wire` (the memo stays as it was).
        """
        conv = self.canonical.conversation(messages, tools, template_kwargs, **options)
        scan, self._tool_scan = self._tool_scan, None
        extended = scan is not None and self.canonical.extended_from == scan.num_messages
        self._resumable = scan if extended else None
        return conv

    def check_tool_results(self, messages: Sequence[Mapping[str, Any]], param_of: Callable[[int], str]) -> None:
        """:func:`~.projection.check_tool_results` for the ``messages`` just given to
        :meth:`conversation`, scanning only those the remembered scan does not cover.

        Raises:
            InvalidRequestError: ``param`` is the first unmatched call id's path.
        """
        resumed, self._resumable = self._resumable, None
        self._tool_scan = check_tool_results(messages, param_of, resumed)


@attrs.define(eq=False)
class SessionMemos:
    """One :class:`SessionMemo` per live Session, created on first use.

    A memo holds its Session's last bodies and history, so it is dropped once the Session is
    closed (no request can use it again): each time the number of memos doubles since the last
    look, those of closed Sessions are removed (amortized constant time per Session; at most
    about twice the live Sessions' memos are held). A Session that is garbage-collected takes
    its memo with it (weak keys).

    Attributes:
        new_body_memo: makes the body memo of a new Session.
    """

    new_body_memo: Callable[[], BodyMemo]
    _memos: weakref.WeakKeyDictionary[Session, SessionMemo] = attrs.field(factory=weakref.WeakKeyDictionary)
    _prune_at: int = _MIN_PRUNE

    def of(self, session: Session) -> SessionMemo:
        """The memo of ``session`` (created on first use)."""
        memo = self._memos.get(session)
        if memo is None:
            if len(self._memos) >= self._prune_at:
                self.prune()
            memo = self._memos[session] = SessionMemo(self.new_body_memo())
        return memo

    def prune(self) -> None:
        """Drops the memos of closed Sessions now."""
        for closed in [s for s in self._memos if s.closed]:
            del self._memos[closed]
        self._prune_at = max(_MIN_PRUNE, 2 * len(self._memos))

    def __len__(self) -> int:
        return len(self._memos)
