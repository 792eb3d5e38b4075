"""Partial-rollout state of one Session: its in-flight engine requests, aborts, pause and protection.

At step close, partial rollout pauses the resident Groups: a paused Session's in-flight
generations are aborted (the engine returns their partial ids, which the turn parks), and its
turns wait at the generation gate until the next step resumes the Group. A Session whose request
was aborted ``--partial-rollout-max-aborted-count`` times becomes *protected* at the next resume:
later pauses no longer interrupt it, so it runs to its end.

:class:`PartialRollout` is the one place this state lives. A turn writes to it only through its
turn context (:meth:`PartialRollout.track`, :meth:`PartialRollout.note_aborted`), the Group
pauses and resumes it, and the rollout pipeline aborts through :meth:`PartialRollout.abort_all`
and reads :meth:`PartialRollout.statistics`.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Final

import attrs
import trio

ABORT_RESEND_S: Final = 1.0
"""Seconds between re-sent aborts of a generation that has not come back yet (a retry: an abort
can reach the engine before the request it names, and the engine then forgets it)."""


@attrs.frozen(kw_only=True)
class PartialRolloutStatistics:
    """A snapshot of one Session's partial-rollout state.

    Attributes:
        inflight_rids: engine request ids generating now, sorted.
        num_aborted: generations of this Session that came back aborted.
        num_abort_requests: abort calls sent for this Session (re-sends included).
        paused: whether the Session is paused (its Group paused and it is not protected).
        protected: whether pauses no longer interrupt the Session.
        protection_pending: a request reached the abort limit; protection starts at the next
            resume.
    """

    inflight_rids: tuple[str, ...]
    num_aborted: int
    num_abort_requests: int
    paused: bool
    protected: bool
    protection_pending: bool


@attrs.define(eq=False, kw_only=True)
class PartialRollout:
    """In-flight generations of one Session and what partial rollout does to them.

    Created with the Session; every method is synchronous except :meth:`abort_all`.
    """

    _inflight: set[str] = attrs.field(factory=set)
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _paused: bool = False
    _protected: bool = False
    _protection_pending: bool = False
    _num_aborted: int = 0
    _num_abort_requests: int = 0
    _idle_since: float | None = None

    @property
    def paused(self) -> bool:
        """Whether the Session is paused (its turns wait at the generation gate)."""
        return self._paused

    @property
    def protected(self) -> bool:
        """Whether pauses no longer interrupt the Session."""
        return self._protected

    @property
    def idle_since(self) -> float | None:
        """Trio clock time the Session's last generation returned, while none is in flight (it
        is off the engine: its agent, or a tool, works); None while one is, or before the first."""
        return None if self._inflight else self._idle_since

    @contextmanager
    def track(self, rid: str) -> Iterator[None]:
        """Registers engine request ``rid`` as in flight while inside (no checkpoint on entry).

        Leaving (the generate call returned, failed or was cancelled) wakes :meth:`abort_all`.
        """
        self._inflight.add(rid)
        try:
            yield
        finally:
            self._inflight.discard(rid)
            self._idle_since = trio.current_time()
            self._changed.set()
            self._changed = trio.Event()

    def note_aborted(self, *, protect: bool) -> None:
        """Records a generation that came back aborted.

        Args:
            protect: the request reached the abort limit: the Session becomes protected at the
                next :meth:`resume`.
        """
        self._num_aborted += 1
        if protect:
            self._protection_pending = True

    def pause(self) -> bool:
        """Pauses the Session unless it is protected; returns whether it paused."""
        if self._protected:
            return False
        self._paused = True
        return True

    def resume(self) -> None:
        """Ends a pause; a pending protection takes effect now."""
        if self._protection_pending:
            self._protected = True
        self._paused = False

    async def abort_all(self, abort_fn: Callable[[str], Awaitable[object]]) -> int:
        """Aborts every in-flight generation and waits until each one has returned.

        An abort is done only when the generate call it names returned (SGLang acknowledges an
        abort before acting on it and forgets a rid whose request is still on the wire), so an
        abort is re-sent every :data:`ABORT_RESEND_S` seconds while its generation is still in
        flight: a retry on a timer. The wait itself ends when the last tracked generation
        returns.

        Args:
            abort_fn: sends one abort, e.g. the engine client's ``abort``.

        Returns:
            How many distinct generations were aborted.

        Raises:
            BackendError: ``abort_fn`` could not reach the engine.

        Cancellation:
            The caller bounds the wait (``abort_wait_s`` at step close); a cancel leaves the
            generations tracked, and sent aborts stay sent.
        """
        aborted: set[str] = set()
        last_sent: dict[str, float] = {}
        while self._inflight:
            rids = sorted(self._inflight)
            now = trio.current_time()
            for rid in rids:
                if now - last_sent.get(rid, -math.inf) >= ABORT_RESEND_S:
                    last_sent[rid] = now
                    self._num_abort_requests += 1
                    await abort_fn(rid)
            aborted.update(rids)
            if not self._inflight:
                break
            resend_at = min(last_sent.get(rid, -math.inf) for rid in self._inflight) + ABORT_RESEND_S
            with trio.move_on_at(resend_at):
                await self._changed.wait()
        return len(aborted)

    def statistics(self) -> PartialRolloutStatistics:
        """The current state as a frozen record."""
        return PartialRolloutStatistics(
            inflight_rids=tuple(sorted(self._inflight)),
            num_aborted=self._num_aborted,
            num_abort_requests=self._num_abort_requests,
            paused=self._paused,
            protected=self._protected,
            protection_pending=self._protection_pending,
        )
