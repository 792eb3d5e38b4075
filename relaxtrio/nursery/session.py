"""Session: one dataset sample's run — one agent process, one SessionForest, one active-time budget.

A Session owns a nursery for its in-flight model turns. The HTTP handler that received a request
only *waits* for the turn's result: if the client disconnects, the turn still completes and is
committed (docs/agent-contract.md#client-disconnects). When the Session ends, every turn still running is cancelled (the
engine request is aborted) and waiting handlers get a 404 ``session_discarded``.

The turn handler never gets the Session: each turn gets a :class:`SessionTurn`, the
:class:`~relaxtrio.nursery.turns.TurnContext` of its Session. A Session knows its Group only as a
:class:`GroupHandle` (what it may read and call there); :mod:`relaxtrio.nursery.group` builds
Sessions with :meth:`~relaxtrio.nursery.group.Group.create` and imports this module, never the
other way round. The task that runs a Session's agent to its end is
:mod:`relaxtrio.nursery.session_task`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, asynccontextmanager
from typing import Any, Final, Literal, Protocol

import attrs
import trio

from .._errors import (
    ContextLengthExceededError,
    InternalError,
    RelaxError,
    SessionAbortedError,
    UnknownSessionError,
)
from ..forest import SessionForest, TrainingSample
from ..tracing import current_tracing, set_attributes
from .agent import ActiveBudget, RolloutMode
from .partial import PartialRollout
from .pending_turn import PendingTurn, TurnCell
from .retries import RetryKey, RetryLedger
from .timeline import Timeline
from .turns import TurnHandler, TurnRequest, TurnResult

log = logging.getLogger(__name__)

SessionStatus = Literal["pending", "running", "completed", "failed", "cancelled"]


def new_session_id() -> str:
    """A fresh, unguessable Session id (also the agent's bearer credential)."""
    return "session-" + secrets.token_hex(16)


class GroupHandle(Protocol):
    """What a Session may read and call on its Group (:class:`~relaxtrio.nursery.group.Group`)."""

    @property
    def group_id(self) -> str:
        """The Group's id (RELAX_GROUP_ID)."""
        ...

    @property
    def mode(self) -> RolloutMode:
        """``train`` or ``eval``."""
        ...

    @property
    def rollout_id(self) -> int:
        """The rollout step the Group generates for now."""
        ...

    def note_request(self, session: Session) -> None:
        """Records that ``session`` sent a model request (first-request barrier)."""
        ...

    async def wait_generation_allowed(self, session: Session) -> None:
        """Waits until ``session`` may generate.

        Cancellation:
            A plain wait; nothing to clean up.
        """
        ...

    def session_failed(self, session: Session) -> None:
        """Drops the Group because ``session`` failed."""
        ...


@attrs.define(eq=False, kw_only=True)
class Session:
    """Runtime state of one Session.

    Attributes:
        session_id: unique id; the agent's ``Authorization: Bearer`` token.
        group: the Group this Session belongs to.
        index: position of the Session within its Group (sample order).
        input_payload: the JSON object written to RELAX_INPUT_JSON.
        dataset_metadata: the dataset row's metadata, copied into every exported sample.
        forest: every committed conversation state of this Session.
        budget: the agent's active-time budget.
        status: lifecycle state; failures are state, not exceptions.
        samples: exported training samples once completed (export order).
        error: why the Session failed, when it did.
        num_requests: model requests received so far.
        num_cancelled_turns: model turns the Session's close cut off (their engine requests
            aborted, nothing committed; e.g. a request in flight at ``serve``'s Ctrl-C).
        num_dropped_branches: leaves of the trained subtree that implicit export left out
            (``--agentic-export-policy final``).
        num_side_leaves: leaves of other subtrees (side conversations) it left out (``final``).
        ignored_request_fields: request options that did not alter generation, by field key
            → requests that sent it (``relaxtrio.api.ignored``).
        context_overflows: requests refused because the context was full.
        overflowed_last: the Session's latest turn ended in such a refusal (a Session that
            ended with it set was ended by the overflow; counted per step).
        images_as_text: images its requests sent that the text-only policy was shown as a text
            marker (``--agentic-text-only-images marker``; counted per step).
        partial: in-flight engine requests, aborts, pause and protection (partial rollout;
            docs/scheduling.md#protection).
        retries: generations a retried request may attach to (docs/agent-contract.md#retries).
        agent_pgid: process-group id of the running agent, once started.
        agent_return_code: the agent's exit code once it exited (negative: killed by that
            signal), else None.
        agent_active_s: active seconds the agent's budget consumed, once it exited.
        agent_log: the kept log file of a failed Session's agent
            (``AgentConfig.failed_log_dir``), else None.
        timeline: its recent events for the operator dashboard (bounded ring buffer).
    """

    session_id: str
    group: GroupHandle
    index: int
    input_payload: dict[str, Any]
    dataset_metadata: dict[str, Any] = attrs.field(factory=dict)
    forest: SessionForest
    budget: ActiveBudget
    status: SessionStatus = "pending"
    samples: list[TrainingSample] = attrs.field(factory=list)
    error: str | None = None
    num_requests: int = 0
    num_cancelled_turns: int = 0
    num_dropped_branches: int = 0
    num_side_leaves: int = 0
    ignored_request_fields: dict[str, int] = attrs.field(factory=dict)
    context_overflows: int = 0
    overflowed_last: bool = False
    images_as_text: int = 0
    partial: PartialRollout = attrs.field(factory=PartialRollout)
    retries: RetryLedger = attrs.field(factory=RetryLedger)
    agent_pgid: int | None = None
    agent_return_code: int | None = None
    agent_active_s: float | None = None
    agent_log: str | None = None
    timeline: Timeline = attrs.field(factory=Timeline)
    _turns: trio.Nursery | None = None
    _closed: bool = False
    _ended: trio.Event = attrs.field(factory=trio.Event)
    _agent_started: trio.Event = attrs.field(factory=trio.Event)
    _first_request: trio.Event = attrs.field(factory=trio.Event)

    @property
    def mode(self) -> RolloutMode:
        """``train`` or ``eval`` (the Group's mode)."""
        return self.group.mode

    @property
    def closed(self) -> bool:
        """Whether the Session stopped accepting model requests."""
        return self._closed

    @property
    def ended(self) -> bool:
        """Whether :func:`~relaxtrio.nursery.session_task.run_session` returned (``status`` is final)."""
        return self._ended.is_set()

    async def wait_ended(self) -> None:
        """Waits until :func:`~relaxtrio.nursery.session_task.run_session` returned for this
        Session (``status`` is final).

        Cancellation:
            A plain wait; nothing to clean up.
        """
        await self._ended.wait()

    def mark_ended(self) -> None:
        """Called once by the Session task on its way out: ``status`` is final from now on."""
        self._ended.set()

    def note_agent_started(self, pgid: int | None) -> None:
        """Records the running agent's process-group id (its placement, e.g. on a Ray node, is
        over: the first-request clock starts)."""
        self.agent_pgid = pgid
        self.timeline.add("agent_start", pgid)
        self._agent_started.set()

    async def wait_agent_started(self) -> None:
        """Waits until :meth:`note_agent_started`.

        Cancellation:
            A plain wait; nothing to clean up.
        """
        await self._agent_started.wait()

    async def wait_first_request(self) -> None:
        """Waits until the agent's first model request was accepted (a request refused with a
        4xx does not count).

        Cancellation:
            A plain wait; nothing to clean up.
        """
        await self._first_request.wait()

    def turn_context(self, cell: TurnCell | None = None) -> SessionTurn:
        """The context one turn of this Session runs with (what the turn handler receives).

        A turn run through :meth:`run_turn` is bound to its request's wait; one started
        directly (tests) counts as always awaited, so it is never taken by a retry.
        """
        return SessionTurn(self, cell if cell is not None else TurnCell())

    async def run_turn(self, handler: TurnHandler, request: TurnRequest) -> TurnResult:
        """Runs one model turn in the Session's own nursery and waits for its result.

        Raises:
            SessionAbortedError: the Session ended before the turn finished (404).
            RelaxError: whatever the turn handler raised (client mistakes, backend errors).

        Cancellation:
            Cancelling the *caller* (e.g. a client disconnect) does not cancel the turn: it
            completes and is committed to the forest, and a retry of the same request gets
            its answer (docs/agent-contract.md#retries). Only the Session's end cancels turns.
        """
        return await self.start_turn(handler, request).result()

    def start_turn(self, handler: TurnHandler, request: TurnRequest) -> PendingTurn:
        """Starts one model turn in the Session's own nursery; wait on the returned handle.

        Raises:
            SessionAbortedError: the Session is closed (404).
        """
        if self._closed or self._turns is None:
            raise SessionAbortedError(
                f"Unknown or discarded agentic session '{self.session_id}'.",
                session_id=self.session_id,
            )
        self.num_requests += 1
        self._first_request.set()
        self.group.note_request(self)
        cell = TurnCell()
        self._turns.start_soon(self._turn_task, handler, request, cell)
        return PendingTurn(self.session_id, self.retries, cell)

    async def _turn_task(self, handler: TurnHandler, request: TurnRequest, cell: TurnCell) -> None:
        try:
            attributes = {"relaxtrio.session.index": self.index, "relaxtrio.rollout_id": self.group.rollout_id}
            with current_tracing().request_span(self.session_id, attributes) as span:
                cell.result = result = await handler.complete(self.turn_context(cell), request)
                set_attributes(span, {"relaxtrio.request.prompt_tokens": result.prompt_tokens,
                                      "relaxtrio.request.completion_tokens": result.completion_tokens,
                                      "relaxtrio.request.finish_reason": result.finish_reason})
            self.overflowed_last = False
        except RelaxError as exc:
            exc.session_id = exc.session_id or self.session_id
            cell.error = exc
            self.overflowed_last = isinstance(exc, ContextLengthExceededError)
            self.context_overflows += self.overflowed_last
        except Exception:
            log.exception("turn failed for session %s", self.session_id)
            cell.error = InternalError(
                "Internal error while handling agentic request.", session_id=self.session_id
            )
        finally:
            if cell.result is None and cell.error is None:  # cancelled: only the close cancels turns
                self.num_cancelled_turns += 1
            if cell.owner and cell.generation is not None:
                self.retries.finish(cell.generation, result=cell.result, error=cell.error)
            cell.failed_unprepared = cell.error is not None and not cell.prepared.is_set()
            cell.done.set()
            cell.prepared.set()
            if cell.on_done is not None:
                cell.on_done()

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Accepts model turns while inside; on exit closes the Session.

        Cancellation:
            On exit (normal or cancelled) every turn still running is cancelled — its engine
            request aborted — and its waiting HTTP handler answers 404 ``session_discarded``.
        """
        async with trio.open_nursery() as turns:
            self._turns = turns
            try:
                yield
            finally:
                self._closed = True
                turns.cancel_scope.cancel()

    async def wait_generation_allowed(self) -> None:
        """Waits until this Session may generate (see :meth:`Group.wait_generation_allowed`).

        Cancellation:
            A plain wait; nothing to clean up.
        """
        await self.group.wait_generation_allowed(self)

    def fail(self, reason: str) -> None:
        """Marks the Session failed with ``reason`` (the first reason wins)."""
        if self.status not in ("failed", "cancelled"):
            self.status = "failed"
            self.error = reason


@attrs.frozen
class SessionTurn:
    """The :class:`~relaxtrio.nursery.turns.TurnContext` of one Session's turn."""

    _session: Session
    _cell: TurnCell

    @property
    def session_id(self) -> str:
        """The Session's id."""
        return self._session.session_id

    @property
    def forest(self) -> SessionForest:
        """The Session's forest."""
        return self._session.forest

    @property
    def session_index(self) -> int:
        """The Session's position in its Group."""
        return self._session.index

    @property
    def rollout_id(self) -> int:
        """The step the Session's Group generates for now."""
        return self._session.group.rollout_id

    async def wait_generation_allowed(self) -> None:
        """Waits until the Session may generate (see :meth:`Session.wait_generation_allowed`).

        Cancellation:
            A plain wait; nothing to clean up.
        """
        await self._session.wait_generation_allowed()

    def mark_prepared(self) -> None:
        """Opens the way for a streamed request's stream (:meth:`TurnContext.mark_prepared`)."""
        self._cell.prepared.set()

    def track(self, rid: str) -> AbstractContextManager[None]:
        """Registers ``rid`` as in flight while inside (:meth:`PartialRollout.track`)."""
        return self._session.partial.track(rid)

    def note_aborted(self, *, protect: bool) -> None:
        """Records an aborted generation (:meth:`PartialRollout.note_aborted`)."""
        self._session.partial.note_aborted(protect=protect)

    def record(self, kind: str, *fields: Any) -> None:
        """Adds an event to the Session's timeline (:meth:`Timeline.add`)."""
        self._session.timeline.add(kind, *fields)

    def note_images_as_text(self, count: int) -> None:
        """Counts images shown to a text-only policy as text (``Session.images_as_text``)."""
        self._session.images_as_text += count

    async def join_undelivered(self, parent_hash: str, sampling_digest: str) -> TurnResult | None:
        """An orphaned generation's answer, or None after registering this turn as the
        generation of the key (see :mod:`relaxtrio.nursery.retries`).

        Raises:
            RelaxError: the attached generation failed with it.

        Cancellation:
            Waits only when attached to a generation still running; that generation goes on.
        """
        ledger = self._session.retries
        key = RetryKey(parent_hash, sampling_digest)
        earlier = ledger.orphan(key)
        if earlier is None:
            self._cell.attach(ledger.open(key), owner=True)
            return None
        self._cell.attach(earlier, owner=False)
        ledger.note_attached()
        log.info("session %s: a retried request attached to %s (%s)", self._session.session_id,
                 "its committed answer" if earlier.done.is_set() else "its generation in flight",
                 parent_hash[:12])
        return await earlier.wait_result()


SHOWN_TOKEN_CHARS: Final = 64
"""The most characters of an unknown bearer token that an error message or log line repeats
(a Session id has 40; a client that sends a 10 KB token gets its first 64 back)."""


def shown_token(token: str) -> str:
    """``token`` as errors and logs repeat it: whole up to :data:`SHOWN_TOKEN_CHARS`, else its
    start and its length (``"abc...(10000 chars)"``)."""
    if len(token) <= SHOWN_TOKEN_CHARS:
        return token
    return f"{token[:SHOWN_TOKEN_CHARS]}...({len(token)} chars)"


@attrs.define(eq=False)
class SessionRegistry:
    """Maps bearer tokens to live Sessions for the API server."""

    _sessions: dict[str, Session] = attrs.field(factory=dict)

    def get(self, session_id: str) -> Session:
        """The live Session with this id.

        Raises:
            UnknownSessionError: unknown, finished or discarded Session (401 ``session_discarded``).
        """
        session = self._sessions.get(session_id)
        if session is None or session.closed:
            shown = shown_token(session_id)
            raise UnknownSessionError(f"Unknown or discarded agentic session '{shown}'.", session_id=shown)
        return session

    def add(self, session: Session) -> None:
        """Registers a Session (its id must be new)."""
        if session.session_id in self._sessions:
            raise InternalError(f"duplicate session id {session.session_id}")
        self._sessions[session.session_id] = session

    def discard(self, session: Session) -> None:
        """Forgets a Session; later requests with its id get 404."""
        self._sessions.pop(session.session_id, None)

    def __len__(self) -> int:
        return len(self._sessions)


