"""Group: the ``n_samples_per_prompt`` Sessions of one prompt, run in one trio nursery.

GRPO compares the Sessions of a Group, so the Group lives and dies as a unit: when one Session
fails (agent error, timeout, invalid output, export failure) the whole Group is dropped with a
logged reason and every sibling is cancelled (their agents terminated).

Generation gate. Requests are committed as they arrive, but a Session may generate only when
its Group

* holds the Runtime lease (:meth:`Group.lease`; the agents' active-time budgets start then),
* has passed the first-request barrier (every Session sent at least one request), and
* is not paused (partial rollout pauses resident Groups at step close).

A *protected* Session (one whose request was aborted ``--partial-rollout-max-aborted-count``
times) ignores pauses: it keeps generating and its budget keeps running until it finishes. Each
Session's pause and protection live in its :class:`~relaxtrio.nursery.partial.PartialRollout`;
the Group pauses and resumes them together.

Decision (docs/scheduling.md#runtime-lease): a lease may be granted before the barrier passes;
generation still waits for the barrier. Without prelaunch a Group is leased as soon as it starts,
so an agent that never sends its first request still runs down its budget and cannot hold
capacity forever.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from ..config import AgentConfig
from ..forest import SessionForest, TrainingSample
from .agent import ActiveBudget, RolloutMode
from .session import Session, SessionRegistry, new_session_id
from .session_task import run_session

log = logging.getLogger(__name__)


@attrs.define(eq=False)
class Gate:
    """A re-closable gate: tasks wait while it is closed."""

    _event: trio.Event = attrs.field(factory=trio.Event)

    @property
    def is_open(self) -> bool:
        """Whether waiters pass."""
        return self._event.is_set()

    def open(self) -> None:
        """Lets every waiter (and later caller) pass."""
        self._event.set()

    def close(self) -> None:
        """Makes later callers wait (tasks already past the gate are unaffected)."""
        if self._event.is_set():
            self._event = trio.Event()

    async def wait_open(self) -> None:
        """Waits until the gate is open.

        Cancellation:
            A plain wait; nothing to clean up.
        """
        while not self._event.is_set():
            await self._event.wait()


@attrs.define(eq=False, kw_only=True)
class Group:
    """Runtime state of one Group.

    Attributes:
        group_id: unique id, handed to agents as RELAX_GROUP_ID.
        mode: ``train`` or ``eval``.
        prompt_index: index of the dataset row the Group was built from.
        sessions: the Sessions, in sample order.
        dropped_reason: why the Group was dropped, or None.
        leased: whether the Group holds its Runtime lease.
        paused: whether generation is paused (partial rollout between steps).
        started_at: trio clock time the agents were started, or None.
        rollout_id: the step the Group generates for: set by the lease, and moved on when a
            resident Group enters a later step (:meth:`enter_step`); response nodes record it.

    Build one with :meth:`create` (or :meth:`unusable` for a prompt that cannot run).
    """

    group_id: str
    mode: RolloutMode = "train"
    prompt_index: int = 0
    sessions: list[Session] = attrs.field(factory=list)
    dropped_reason: str | None = None
    leased: bool = False
    paused: bool = False
    started_at: float | None = None
    rollout_id: int = 0
    _cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _requested: dict[str, float] = attrs.field(factory=dict)
    _gate: Gate = attrs.field(factory=Gate)
    _barrier: trio.Event = attrs.field(factory=trio.Event)
    _finished: trio.Event = attrs.field(factory=trio.Event)

    @classmethod
    def create(
        cls,
        group_id: str,
        *,
        num_sessions: int,
        input_payload: Mapping[str, Any],
        timeout_s: float,
        mode: RolloutMode = "train",
        prompt_index: int = 0,
        dataset_metadata: Mapping[str, Any] | None = None,
        max_context_tokens: int | None = None,
    ) -> Group:
        """A Group of ``num_sessions`` fresh Sessions of one prompt, not started.

        Args:
            group_id: the Group's id (RELAX_GROUP_ID).
            num_sessions: Sessions in the Group (``n_samples_per_prompt``).
            input_payload: the JSON object each agent reads (deep-copied per Session).
            timeout_s: each agent's active-time budget in seconds.
            mode: ``train`` or ``eval``.
            prompt_index: the dataset row the Group is built from.
            dataset_metadata: the row's metadata, copied into every exported sample.
            max_context_tokens: training-token limit of each Session's lineages, or None.
        """
        group = cls(group_id=group_id, mode=mode, prompt_index=prompt_index)
        for index in range(num_sessions):
            session_id = new_session_id()
            group.sessions.append(Session(
                session_id=session_id, group=group, index=index,
                input_payload=copy.deepcopy(dict(input_payload)),
                dataset_metadata=dict(dataset_metadata or {}),
                forest=SessionForest(session_id, max_context_tokens=max_context_tokens),
                budget=ActiveBudget(total_s=timeout_s),
            ))
        return group

    @classmethod
    def unusable(cls, group_id: str, reason: str, *, mode: RolloutMode = "train",
                 prompt_index: int = 0) -> Group:
        """A Group whose prompt cannot run (e.g. its image file disappeared): no Sessions,
        already dropped with ``reason``; the caller does not run it."""
        return cls(group_id=group_id, mode=mode, prompt_index=prompt_index, dropped_reason=reason)

    @property
    def dropped(self) -> bool:
        """Whether the Group was dropped (its samples are not trained on)."""
        return self.dropped_reason is not None

    @property
    def finished(self) -> bool:
        """Whether every Session has ended (completed, failed or cancelled)."""
        return self._finished.is_set()

    @property
    def barrier_passed(self) -> bool:
        """Whether every Session has sent at least one model request."""
        return len(self._requested) >= len(self.sessions)

    def missing_first_requests(self) -> list[Session]:
        """Sessions that have not sent their first request yet (barrier diagnostics)."""
        return [s for s in self.sessions if s.session_id not in self._requested]

    def _protected_sessions(self) -> list[Session]:
        return [s for s in self.sessions if s.partial.protected and s.status == "running"]

    @property
    def protected(self) -> bool:
        """Whether a still-running Session of this Group is protected from pauses."""
        return bool(self._protected_sessions())

    async def wait_unprotected(self) -> None:
        """Waits until no Session of this Group is both protected and still running.

        Cancellation:
            A plain wait; nothing to clean up.
        """
        while protected := self._protected_sessions():
            await protected[0].wait_ended()

    @property
    def waiting_for_lease(self) -> bool:
        """Whether the Group is prelaunched and idle: not leased, and every Session has sent its
        first request (held until the lease) or ended. Its agents then wait on a reply and
        compute nothing, so they leave the cores to whatever else runs (the update)."""
        requested = self._requested
        return not self.leased and all(s.session_id in requested or s.ended for s in self.sessions)

    @property
    def in_runtime(self) -> bool:
        """Whether the Sessions are in Runtime: the lease is held and the barrier has passed."""
        return self.leased and self.barrier_passed

    def note_request(self, session: Session) -> None:
        """Records that ``session`` sent a request (first-request barrier).

        The request that completes the barrier of a leased Group starts the agent budgets.
        """
        self._requested.setdefault(session.session_id, trio.current_time())
        if self.barrier_passed and not self._barrier.is_set():
            self._barrier.set()
            self._record("barrier")
        self._start_budgets()
        self._update_gate()

    async def wait_barrier_passed(self) -> None:
        """Waits until every Session has sent its first model request.

        Cancellation:
            A plain wait; nothing to clean up.
        """
        if not self.barrier_passed:
            await self._barrier.wait()

    def lease(self, rollout_id: int | None = None) -> None:
        """Grants the Runtime lease for step ``rollout_id`` (None: keep :attr:`rollout_id`): held
        requests may generate once the barrier has passed.

        The Sessions enter Runtime when both hold (the lease, and every Session's first request),
        and only then do their agent budgets start (docs/agent-contract.md#active-time-budget):
        agent start-up and the wait for the siblings' first requests never spend
        ``--agent-timeout``, with or without prelaunch.
        """
        self.leased = True
        if rollout_id is not None:
            self.rollout_id = rollout_id
        self._record("lease", self.rollout_id)
        self._start_budgets()
        self._update_gate()

    def _record(self, kind: str, *fields: object) -> None:
        """Adds one event to every Session's timeline (:mod:`relaxtrio.nursery.timeline`)."""
        for session in self.sessions:
            session.timeline.add(kind, *fields)

    def _start_budgets(self) -> None:
        """Starts every budget once the Group is in Runtime and not paused (idempotent)."""
        if self.in_runtime and not self.paused:
            for session in self.sessions:
                session.budget.resume()

    def pause(self) -> None:
        """Closes generation for non-protected Sessions and pauses their budgets."""
        self.paused = True
        for session in self.sessions:
            if session.partial.pause():
                session.budget.pause()
                session.timeline.add("pause", self.rollout_id)
        self._update_gate()

    def resume(self, rollout_id: int | None = None) -> None:
        """Reopens generation: pending protections take effect, budgets restart.

        See docs/scheduling.md#protection.
        """
        if rollout_id is not None:
            self.rollout_id = rollout_id
        for session in self.sessions:
            if session.partial.paused:
                session.timeline.add("resume", self.rollout_id)
            session.partial.resume()
        self.paused = False
        self._start_budgets()
        self._update_gate()

    def enter_step(self, rollout_id: int) -> None:
        """Carries a leased, resident Group into step ``rollout_id``: a paused Group resumes
        (partial rollout); one still generating (fully async) commits for the new step from now
        on."""
        if self.paused:
            self.resume(rollout_id)
        else:
            self.rollout_id = rollout_id

    def _update_gate(self) -> None:
        if self.leased and self.barrier_passed and not self.paused:
            self._gate.open()
        else:
            self._gate.close()

    async def wait_generation_allowed(self, session: Session) -> None:
        """Waits until ``session`` may generate (lease, barrier, and no pause unless protected).

        Cancellation:
            A plain wait; nothing to clean up.
        """
        while True:
            if self._gate.is_open:
                return
            if session.partial.protected and self.leased and self.barrier_passed:
                return
            await self._gate.wait_open()

    async def wait_finished(self) -> None:
        """Waits until every Session has ended.

        Cancellation:
            A plain wait; nothing to clean up.
        """
        await self._finished.wait()

    def session_failed(self, session: Session) -> None:
        """Drops the Group because ``session`` failed, cancelling every sibling. An eval Group
        is not trained on as a whole: it keeps its other Sessions (the failed one counts as past
        the first-request barrier), and the failed one is counted where the Group is scored."""
        if self.mode != "eval":
            self.drop(f"session {session.index} ({session.session_id}) failed: {session.error}")
        else:  # it will send no (more) requests: the barrier must not wait for it
            self.note_request(session)

    def drop(self, reason: str) -> None:
        """Drops the Group (first reason wins) and cancels every Session still running."""
        if self.dropped_reason is None:
            self.dropped_reason = reason
        self._cancel_scope.cancel()

    def samples(self) -> list[list[TrainingSample]]:
        """Exported samples per Session, in sample order (empty when dropped)."""
        if self.dropped:
            return []
        return [list(session.samples) for session in self.sessions]


async def run_group(
    group: Group,
    *,
    agent: AgentConfig,
    base_url: str,
    registry: SessionRegistry,
    server_template_kwargs: Mapping[str, Any] | None = None,
    lease: bool = True,
    max_response_tokens: int | None = None,
) -> Group:
    """Runs every Session of ``group`` in one nursery and returns the finished Group.

    Args:
        group: the Group to run.
        agent: how to start the agents.
        base_url: the API base URL handed to the agents.
        registry: where the Sessions are registered for bearer lookup.
        server_template_kwargs: server chat-template kwargs (for explicit export matching).
        lease: lease the Group as soon as its agents started; False leaves the lease to the
            caller (prelaunch: requests are held until :meth:`Group.lease`).
        max_response_tokens: the turn limit of a request that sets none, told to the agents
            (``RELAX_MAX_RESPONSE_TOKENS``), or None.

    Returns:
        The Group; either every Session completed or ``group.dropped_reason`` says why not.

    Cancellation:
        Cancelling terminates every agent of the Group (shielded, bounded) before returning.
    """
    start = functools.partial(
        run_session,
        agent=agent,
        base_url=base_url,
        registry=registry,
        server_template_kwargs=server_template_kwargs,
        max_response_tokens=max_response_tokens,
    )
    group.started_at = trio.current_time()
    try:
        with group._cancel_scope:
            async with trio.open_nursery() as nursery:
                for session in group.sessions:
                    await nursery.start(start, session)
                if lease:
                    group.lease()
        if group.dropped_reason is None and group.mode != "eval":
            incomplete = [s for s in group.sessions if s.status != "completed"]
            if incomplete:
                group.dropped_reason = f"session {incomplete[0].index} ended as {incomplete[0].status}"
        if group.dropped_reason is not None:
            log.warning("Dropped group %s: %s", group.group_id, group.dropped_reason)
    finally:
        group._finished.set()
    return group
