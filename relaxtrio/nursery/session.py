"""Session: one dataset sample's run — one agent process, one SessionForest, one active-time budget.

A Session owns a nursery for its in-flight model turns. The HTTP handler that received a request
only *waits* for the turn's result: if the client disconnects, the turn still completes and is
committed (docs/agent-contract.md#client-disconnects). When the Session ends, every turn still running is cancelled (the
engine request is aborted) and waiting handlers get a 404 ``session_discarded``.

The turn handler never gets the Session: each turn gets a :class:`SessionTurn`, the
:class:`~relaxtrio.nursery.turns.TurnContext` of its Session. A Session knows its Group only as a
:class:`GroupHandle` (what it may read and call there); :mod:`relaxtrio.nursery.group` builds
Sessions with :meth:`~relaxtrio.nursery.group.Group.create` and imports this module, never the
other way round.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Final, Literal, Protocol

import attrs
import trio

from .._errors import (
    AgentExecutionError,
    ExportError,
    InternalError,
    RelaxError,
    SessionAbortedError,
    UnknownSessionError,
)
from ..config import AgentConfig
from ..forest import LeafSelection, SessionForest, TrainingSample, export_samples, parse_session_output, select_leaves
from .agent import ActiveBudget, RolloutMode, SessionEnv, run_agent
from .partial import PartialRollout
from .retries import Generation, RetryKey, RetryLedger
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


@attrs.define(eq=False)
class _TurnCell:
    """One model request's wait for its turn, and the generation it is attached to."""

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
        num_dropped_branches: leaves of the trained subtree that implicit export left out
            (``--agentic-export-policy final``).
        num_side_leaves: leaves of other subtrees (side conversations) it left out (``final``).
        ignored_request_fields: request options that did not alter generation, by field key
            → requests that sent it (``relaxtrio.api.ignored``).
        partial: in-flight engine requests, aborts, pause and protection (partial rollout;
            docs/scheduling.md#protection).
        retries: generations a retried request may attach to (docs/agent-contract.md#retries).
        agent_pgid: process-group id of the running agent, once started.
        agent_return_code: the agent's exit code once it exited (negative: killed by that
            signal), else None.
        agent_active_s: active seconds the agent's budget consumed, once it exited.
        agent_log: the kept log file of a failed Session's agent
            (``AgentConfig.failed_log_dir``), else None.
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
    num_dropped_branches: int = 0
    num_side_leaves: int = 0
    ignored_request_fields: dict[str, int] = attrs.field(factory=dict)
    partial: PartialRollout = attrs.field(factory=PartialRollout)
    retries: RetryLedger = attrs.field(factory=RetryLedger)
    agent_pgid: int | None = None
    agent_return_code: int | None = None
    agent_active_s: float | None = None
    agent_log: str | None = None
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
        """Whether :func:`run_session` returned (``status`` is final)."""
        return self._ended.is_set()

    async def wait_ended(self) -> None:
        """Waits until :func:`run_session` returned for this Session (``status`` is final).

        Cancellation:
            A plain wait; nothing to clean up.
        """
        await self._ended.wait()

    def turn_context(self, cell: _TurnCell | None = None) -> SessionTurn:
        """The context one turn of this Session runs with (what the turn handler receives).

        A turn run through :meth:`run_turn` is bound to its request's wait; one started
        directly (tests) counts as always awaited, so it is never taken by a retry.
        """
        return SessionTurn(self, cell if cell is not None else _TurnCell())

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
        cell = _TurnCell()
        self._turns.start_soon(self._turn_task, handler, request, cell)
        return PendingTurn(self, cell)

    async def _turn_task(self, handler: TurnHandler, request: TurnRequest, cell: _TurnCell) -> None:
        try:
            cell.result = await handler.complete(self.turn_context(cell), request)
        except RelaxError as exc:
            exc.session_id = exc.session_id or self.session_id
            cell.error = exc
        except Exception:
            log.exception("turn failed for session %s", self.session_id)
            cell.error = InternalError(
                "Internal error while handling agentic request.", session_id=self.session_id
            )
        finally:
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
class PendingTurn:
    """A started turn that one model request waits for (:meth:`Session.start_turn`)."""

    _session: Session
    _cell: _TurnCell

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
        session, cell = self._session, self._cell
        if cell.result is not None:
            if cell.generation is not None:
                session.retries.deliver(cell.generation)
            return cell.result
        if cell.error is not None:
            raise cell.error
        raise SessionAbortedError(
            f"Unknown or discarded agentic session '{session.session_id}'.", session_id=session.session_id
        )


@attrs.frozen
class SessionTurn:
    """The :class:`~relaxtrio.nursery.turns.TurnContext` of one Session's turn."""

    _session: Session
    _cell: _TurnCell

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


@attrs.frozen
class _PgidRecorder:
    """Receives the agent's process-group id (the ``task_status`` protocol of run_agent)."""

    session: Session

    def started(self, value: int | None = None) -> None:  # the pgid; trio.TaskStatus' signature
        self.session.agent_pgid = value
        self.session._agent_started.set()


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


def _export_hint(exc: ExportError) -> str:
    """Plain words for an implicit export that found no answered leaf (``num_leaves == 0``);
    the message for several leaves says what happened and what to do itself."""
    if exc.num_leaves == 0:
        return (" (the agent got no model answer: it made no request, or every request failed or "
                "was abandoned before the reply)")
    return ""


def _note_unexported(session: Session, selection: LeafSelection, policy: str) -> None:
    """Counts and logs the leaves implicit export leaves out: ``final``'s other branches and side
    conversations, and answers that never reached the agent (docs/export-and-credit.md#export-policies)."""
    session.num_dropped_branches = len(selection.dropped_branches)
    session.num_side_leaves = len(selection.side_leaves) + len(selection.undelivered)
    if selection.num_unexported_leaves:
        log.info("session %s: export policy %s leaves out %d other branch(es) and %d side conversation "
                 "leaf(s) (%d of them answers the agent never received)", session.session_id, policy,
                 session.num_dropped_branches, session.num_side_leaves, len(selection.undelivered))


async def run_session(
    session: Session,
    *,
    agent: AgentConfig,
    base_url: str,
    registry: SessionRegistry,
    server_template_kwargs: Mapping[str, Any] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Runs a Session from agent start to exported samples; failures become Session state.

    On success ``session.status == "completed"`` and ``session.samples`` holds the exported
    samples. On an agent or export failure ``session.status == "failed"`` with
    ``session.error`` set, and the Group is told (it drops itself). Either way
    :meth:`Session.wait_ended` returns afterwards.

    Cancellation:
        Cancelling terminates the agent's process group (shielded), aborts in-flight turns and
        unregisters the Session; ``status`` becomes ``cancelled``.
    """
    try:
        await _run_session(session, agent=agent, base_url=base_url, registry=registry,
                           server_template_kwargs=server_template_kwargs, task_status=task_status)
    finally:
        _settle_agent_log(agent_log_path(agent, session), session)
        session._ended.set()


def agent_log_path(agent: AgentConfig, session: Session) -> Path | None:
    """Where the agent of ``session`` logs when failed logs are kept
    (``AgentConfig.failed_log_dir``), else None."""
    if agent.failed_log_dir is None:
        return None
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in session.group.group_id)
    return agent.failed_log_dir / f"{name}_session{session.index}.log"


def _settle_agent_log(path: Path | None, session: Session) -> None:
    """Keeps the agent log of a failed Session (and says where); removes any other."""
    if path is None or not path.exists():
        return
    if session.status == "failed":
        log.warning("session %d of %s failed; its agent log is kept: %s", session.index,
                    session.group.group_id, path)
        session.agent_log = str(path)
    else:
        path.unlink(missing_ok=True)


@attrs.define(eq=False)
class _FirstRequestWatch:
    """Stops an agent that sends no model request within ``timeout_s`` of its process start.

    Before its first request a Session is not in Runtime, so ``--agent-timeout`` does not run
    yet (docs/agent-contract.md#active-time-budget); without this watch, an agent stuck before
    its first request (a login prompt, a hung setup step) would hold its Group at the
    first-request barrier for ever. Expiry cancels the launch (the agent's process group is
    terminated) and the Session fails, so its Group is dropped like any other failed Group.
    ``timeout_s`` None: no limit.
    """

    session: Session
    timeout_s: float | None
    expired: bool = False

    async def run(self, launch_scope: trio.CancelScope) -> None:
        if self.timeout_s is None:
            return
        await self.session._agent_started.wait()  # a Ray actor's placement does not count
        with trio.move_on_after(self.timeout_s):
            await self.session._first_request.wait()
            return
        self.expired = True
        launch_scope.cancel()

    def message(self) -> str:
        return (f"Agent sent no model request within {self.timeout_s:g} s of starting "
                f"(--agent-first-request-timeout; a request refused with a 4xx does not count); "
                f"it was stopped.")


async def _run_session(
    session: Session,
    *,
    agent: AgentConfig,
    base_url: str,
    registry: SessionRegistry,
    server_template_kwargs: Mapping[str, Any] | None,
    task_status: trio.TaskStatus[None],
) -> None:
    registry.add(session)
    env = SessionEnv(
        session_id=session.session_id,
        group_id=session.group.group_id,
        base_url=base_url,
        mode=session.mode,
    )
    session.status = "running"
    run = None
    log_path = agent_log_path(agent, session)
    try:
        async with session.serving():
            task_status.started()
            launch = agent.launcher or run_agent  # --agent-executor ray: on a Ray node
            silent = _FirstRequestWatch(session, agent.first_request_timeout_s)
            async with trio.open_nursery() as watch:
                watch.start_soon(silent.run, watch.cancel_scope)
                try:
                    run = await launch(agent, env, session.input_payload, session.budget,
                                       log_path=log_path, task_status=_PgidRecorder(session))
                except AgentExecutionError as exc:
                    session.fail(str(exc))
                except OSError as exc:
                    session.fail(f"Agent could not be started: {exc}")
                finally:
                    watch.cancel_scope.cancel()
            if silent.expired:
                session.fail(silent.message())
    finally:
        registry.discard(session)
        if session.status == "running" and run is None:
            session.status = "cancelled"
    if run is None:
        session.group.session_failed(session)
        return
    session.agent_return_code, session.agent_active_s = run.return_code, run.active_s
    try:
        output = parse_session_output(run.output_text)
    except ExportError as exc:
        session.fail(f"Agent produced invalid output: {exc}\n{run.log_tail}".rstrip())
        session.group.session_failed(session)
        return
    try:
        session.samples = export_samples(
            session.forest,
            output,
            dataset_metadata=session.dataset_metadata,
            server_template_kwargs=server_template_kwargs,
            policy=agent.export_policy,
            undelivered=(undelivered := session.retries.undelivered_states()),
        )
        if output.is_implicit:
            _note_unexported(session, select_leaves(session.forest, agent.export_policy, undelivered),
                             agent.export_policy)
    except ExportError as exc:
        session.fail(f"Session export failed: {exc}{_export_hint(exc)}")
        session.group.session_failed(session)
        return
    session.status = "completed"


async def serve_external_session(
    session: Session,
    *,
    registry: SessionRegistry,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serves a Session whose agent runs outside relaxtrio (``python -m relaxtrio serve``).

    The Session is registered and accepts model turns until this task is cancelled; no agent
    process is started, no budget runs and nothing is exported: the caller reads the forest and
    exports afterwards. ``status`` is ``running`` while served and stays so on return, for the
    caller to settle.

    Cancellation:
        Runs until cancelled; then every turn still running is cancelled (its engine request
        aborted), the Session is unregistered and :meth:`Session.wait_ended` returns.
    """
    registry.add(session)
    session.status = "running"
    try:
        async with session.serving():
            task_status.started()
            await trio.sleep_forever()
    finally:
        registry.discard(session)
        session._ended.set()
