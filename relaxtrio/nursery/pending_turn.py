"""A model request's wait for its Session's turn.

The turn runs in the Session's own nursery (:meth:`~relaxtrio.nursery.session.Session.start_turn`);
the request holds a :class:`PendingTurn` and only waits. A request whose client goes away stops
waiting, the turn goes on and is committed, and a retry of the same request gets its answer
(docs/agent-contract.md#retries).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs
import trio

from .._errors import RelaxError, SessionAbortedError
from .retries import Generation, RetryLedger
from .turns import TurnResult

__all__ = ["PendingTurn", "TurnCell"]


@attrs.define(eq=False)
class TurnCell:
    """One model request's wait for its turn, and the generation it is attached to (written by
    the Session's turn task, read by the :class:`PendingTurn`)."""

    done: trio.Event = attrs.field(factory=trio.Event)
    prepared: trio.Event = attrs.field(factory=trio.Event)  # pre-generation checks passed (or done)
    failed_unprepared: bool = False  # the turn failed before it passed those checks
    result: TurnResult | None = None
    error: RelaxError | None = None
    waiting: bool = True  # the request still waits (its client has not gone away)
    generation: Generation | None = None
    owner: bool = False  # this request's turn samples ``generation`` (else it attached)
    on_done: Callable[[], object] | None = None  # called once ``done`` is set (PendingTurn.result_unless)

    def attach(self, generation: Generation, *, owner: bool) -> None:
        self.generation, self.owner = generation, owner
        generation.num_waiting += self.waiting

    def leave(self) -> None:
        """The request stopped waiting (its client went away)."""
        if self.waiting and self.generation is not None:
            self.generation.num_waiting -= 1
        self.waiting = False


@attrs.frozen
class PendingTurn:
    """A started turn that one model request waits for
    (:meth:`~relaxtrio.nursery.session.Session.start_turn`).

    Attributes:
        session_id: the Session's id (for the 404 when it ends before the turn did).
        retries: the Session's retry ledger (an answered generation counts as delivered).
    """

    session_id: str
    _retries: RetryLedger
    _cell: TurnCell

    async def wait_prepared(self) -> None:
        """Waits until the turn passed its pre-generation checks or ended.

        After it returns, :meth:`failed_early` tells whether the request can still get a plain
        error answer (a streamed request opens its stream only after this).

        Cancellation:
            Cancelling (the client went away) does not stop the turn; the request stops waiting.
        """
        answered = False
        try:
            await self._cell.prepared.wait()
            answered = True
        finally:
            if not answered:
                self._cell.leave()

    @property
    def failed_early(self) -> bool:
        """True when the turn failed before it passed its pre-generation checks (an error
        raised after them belongs in the stream, even if it came quickly)."""
        return self._cell.failed_unprepared

    async def result(self) -> TurnResult:
        """Waits for the turn's committed result.

        Raises:
            SessionAbortedError: the Session ended before the turn finished (404).
            RelaxError: whatever the turn handler raised (client mistakes, backend errors).

        Cancellation:
            Cancelling (the client went away) does not cancel the turn: it completes and is
            committed, and a retry of the same request gets its answer.
        """
        cell = self._cell
        answered = False
        try:
            await cell.done.wait()
            answered = True
        finally:
            if not answered:  # the caller was cancelled: its client went away
                cell.leave()
        return self._outcome()

    async def result_unless(self, gone: Callable[[], Awaitable[object]]) -> TurnResult | None:
        """Waits for the turn's committed result unless ``gone()`` returns first.

        One task does both waits: it waits in ``gone()`` (the agent API: for its request's
        ``http.disconnect``) and the turn's end cancels that wait, so no second task has to
        watch the client. Without a wait (the turn already ended) it is no checkpoint.

        Returns:
            The result, or None when ``gone()`` returned before the turn ended: the request
            stopped waiting and the turn goes on, committed for a retry of the same request.

        Raises:
            SessionAbortedError, RelaxError: as :meth:`result`.

        Cancellation:
            As :meth:`result`: cancelling leaves the turn, which goes on.
        """
        cell = self._cell
        if not cell.done.is_set():
            waited = False
            try:
                with trio.CancelScope() as wait:
                    cell.on_done = wait.cancel
                    await gone()
                waited = True
            finally:
                cell.on_done = None
                if not waited:  # cancelled from outside
                    cell.leave()
            if not cell.done.is_set():  # gone() returned first: the client went away
                cell.leave()
                return None
        return self._outcome()

    def _outcome(self) -> TurnResult:
        """The ended turn's result (the generation counts as delivered), or its error raised."""
        cell = self._cell
        if cell.result is not None:
            if cell.generation is not None:
                self._retries.deliver(cell.generation)
            return cell.result
        if cell.error is not None:
            raise cell.error
        raise SessionAbortedError(
            f"Unknown or discarded agentic session '{self.session_id}'.", session_id=self.session_id
        )
