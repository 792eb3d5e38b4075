"""``--agent-executor ray``: Sessions' agents run on Ray nodes, in a pool of long-lived actors.

A :class:`RayAgentPool` belongs to one driver run (:func:`open_ray_agent_pool`); its
:meth:`~RayAgentPool.run_agent` is the run's :attr:`AgentConfig.launcher
<relaxtrio.config.AgentConfig.launcher>`. Each actor
(:data:`~relaxtrio.cluster._agent_actor.AgentActor`) reserves ``--agent-num-cpus`` CPUs on
whichever node has them free (Ray's default placement) and runs one Session's agent at a
time. Actors are created lazily, when a Session starts and
no actor is idle, so the pool grows to the number of Sessions in flight and is reused after
that: a Session pays an actor's placement and start-up (7-24 s on a loaded 2-core machine)
only while the pool grows. Leaving the context kills every actor and waits until Ray reports
each one dead, however the run ends.

The agent contract is the local one (:func:`relaxtrio.nursery.agent.run_agent`), carried out
on the actor's node: the input JSON is shipped in the call and written there, the seven
``RELAX_*`` variables are set there (``RELAX_BASE_URL`` is the URL the driver advertises, see
``--agentic-api-advertise-url``), the agent runs as ``bash -lc`` in ``--agent-cwd`` (which,
with relaxtrio itself, must exist on every node) as the leader of its own process group, its
output JSON (or JSONL) comes back as text, and errors end with the last 8 KiB of its output.
The agent's log stays on its node (in that node's temp dir), so a failed
Session keeps no ``agent_logs/`` file in the run directory, only the tail in its reason; the
process-group id the Session records (shown by the dashboard) is one on the agent's node.

The Session's active-time budget stays in the driver (it pauses and resumes with generation).
It starts when the Session enters Runtime, which needs the agent's first request, so an actor's
placement and start-up never spend it. When it runs out the driver *expires* the run: the
agent's process group is terminated on its node and the usual "timed out"
:class:`~relaxtrio.AgentExecutionError` (with the output tail) comes back. When the Session is
cancelled (run stopped, Group dropped) the driver *cancels* the run: the group is terminated
there too, shielded and bounded. An actor whose run ended (either way, confirmed) goes back to
the pool; one that did not confirm in time is killed and replaced by a fresh one when needed.

A node lost under an agent (the actor dies mid-run: ``RayActorError``) fails the Session with
an :class:`~relaxtrio.AgentExecutionError` naming the node; its Group is dropped with that
reason and refilled like any agent failure, and the dead actor leaves the pool. The agent's
processes on a lost node die with their reaper shim, whose parent was the actor.

Every Ray call is made from a worker thread (``trio.to_thread.run_sync``) under the pool's own
unbounded :class:`trio.CapacityLimiter`: each Session in flight keeps one thread blocked on its
run's result, and those must not use up the driver's default limiter (40 threads), which the
rest of the run shares.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import ray
import trio

from .._errors import AgentExecutionError
from ..config import AgentConfig
from ..nursery.agent import KILL_GRACE_S, ActiveBudget, AgentRun, SessionEnv
from ._agent_actor import AgentActor, Outcome, StartState

__all__ = ["AgentPoolStatistics", "RayAgentPool", "open_ray_agent_pool"]

log = logging.getLogger(__name__)

_KILL_MARGIN_S: Final = 10.0
"""Seconds on top of the kill sequence for the Ray round trips that ask for it and confirm it."""

START_WAIT_S: Final = 600.0
"""Seconds a Session waits for its actor to be placed and its agent process to start."""

_DEATH_WAIT_S: Final = 30.0
"""Seconds :meth:`RayAgentPool.aclose` waits for Ray to report the killed actors dead."""


@attrs.define(eq=False)
class _Member:
    """One actor of the pool."""

    handle: Any
    number: int
    node: str = "?"
    num_runs: int = 0

    @property
    def where(self) -> str:
        """The node for messages (``?`` before the actor answered once)."""
        return self.node if self.node != "?" else "(unknown: its actor had not answered yet)"


@attrs.frozen(kw_only=True)
class AgentPoolStatistics:
    """A snapshot of a :class:`RayAgentPool`.

    Attributes:
        num_actors: live actors (idle + busy).
        num_idle: actors waiting for a Session.
        num_busy: actors running a Session's agent.
        num_created: actors created since the pool opened.
        num_lost: actors that died under a run (their node or process was lost).
        num_runs: agent runs started.
    """

    num_actors: int
    num_idle: int
    num_busy: int
    num_created: int
    num_lost: int
    num_runs: int


@attrs.define(eq=False, kw_only=True)
class RayAgentPool:
    """Long-lived Ray actors running Sessions' agents (module docstring); open with
    :func:`open_ray_agent_pool`.

    Attributes:
        num_cpus: CPUs each actor reserves on its node (``--agent-num-cpus``).
    """

    num_cpus: float
    _idle: list[_Member] = attrs.field(factory=list)
    _busy: set[_Member] = attrs.field(factory=set)
    _limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(math.inf))
    _closed: bool = False
    _num_created: int = 0
    _num_lost: int = 0
    _num_runs: int = 0

    def statistics(self) -> AgentPoolStatistics:
        """The pool's counts now."""
        return AgentPoolStatistics(
            num_actors=len(self._idle) + len(self._busy), num_idle=len(self._idle),
            num_busy=len(self._busy), num_created=self._num_created, num_lost=self._num_lost,
            num_runs=self._num_runs)

    async def run_agent(
        self,
        config: AgentConfig,
        session: SessionEnv,
        input_payload: Mapping[str, object],
        budget: ActiveBudget,
        *,
        log_path: Path | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> AgentRun:
        """:func:`~relaxtrio.nursery.agent.run_agent`, with the agent on a pool actor's node.

        Args:
            config: command, cwd, env and timeout (``cwd`` must exist on the node).
            session: the identity and base URL handed to the agent (the advertised URL).
            input_payload: JSON object written to ``RELAX_INPUT_JSON`` on the node.
            budget: the Session's pausable active-time budget, enforced here in the driver.
            log_path: accepted for the launcher signature and not used: the agent's log stays
                on its node, and only its last 8 KiB reach the driver (in the failure reason).
            task_status: receives the agent's process-group id on its node.

        Returns:
            The finished run (``active_s`` measured by the driver's budget).

        Raises:
            AgentExecutionError: timed out, exited non-zero, wrote unparsable output, did not
                start within :data:`START_WAIT_S`, or its node was lost.
            OSError: the agent could not be started on its node.

        Cancellation:
            Cancelling terminates the agent's process group on its node (shielded, at most
            ``term_grace_s`` + 5 s + a margin); the actor returns to the pool when its node
            confirmed, else it is killed. Then the Cancelled propagates.
        """
        if self._closed:
            raise trio.ClosedResourceError("the Ray agent pool is closed")
        member = await self._acquire()
        member.num_runs += 1
        self._num_runs += 1
        call = _Call(pool=self, member=member, run_id=member.num_runs, session_id=session.session_id,
                     wait_s=config.term_grace_s + KILL_GRACE_S + _KILL_MARGIN_S)
        outcome: Outcome | None = None  # set once the run's end is confirmed: the actor is free
        try:
            outcome, active_s = await call.run(config, session, input_payload, budget, task_status)
        finally:
            with trio.CancelScope(shield=True):  # bounded inside: call.wait_s
                if outcome is None:
                    outcome = await self._thread(call.cancel, call.ref)
                await self._release(member, reusable=outcome is not None)
        return _result(outcome, active_s, session.session_id)

    async def _acquire(self) -> _Member:
        """An idle actor, or a new one (its placement happens while its first run waits)."""
        if self._idle:
            member = self._idle.pop()
        else:
            self._num_created += 1
            number = self._num_created
            # Not abandoned on cancel: a handle created in an abandoned thread would be lost.
            handle = await trio.to_thread.run_sync(_new_actor, self.num_cpus, limiter=self._limiter)
            if self._closed:  # closed meanwhile: this actor was not among those it killed
                await trio.to_thread.run_sync(_kill, handle, limiter=self._limiter)
                raise trio.ClosedResourceError("the Ray agent pool is closed")
            member = _Member(handle=handle, number=number)
            log.info("Ray agent pool: actor %d created (%g CPUs)", member.number, self.num_cpus)
        self._busy.add(member)
        return member

    async def _release(self, member: _Member, *, reusable: bool) -> None:
        self._busy.discard(member)
        if reusable and not self._closed:
            self._idle.append(member)
            return
        await trio.to_thread.run_sync(_kill, member.handle, limiter=self._limiter)

    def _note_lost(self, member: _Member) -> None:
        self._num_lost += 1
        log.warning("Ray agent pool: actor %d on node %s died under a run; it will be replaced",
                    member.number, member.where)

    async def _thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True, limiter=self._limiter)

    async def aclose(self) -> None:
        """Kills every actor and waits (at most 30 s) until Ray reports each one dead.

        Cancellation:
            Shielded; bounded.
        """
        self._closed = True
        handles = [m.handle for m in (*self._idle, *self._busy)]
        self._idle.clear()
        self._busy.clear()
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(_kill_all, handles, _DEATH_WAIT_S, limiter=self._limiter)
        log.info("Ray agent pool closed: %d actors killed (%d created, %d lost, %d runs)",
                 len(handles), self._num_created, self._num_lost, self._num_runs)


@contextlib.asynccontextmanager
async def open_ray_agent_pool(num_cpus: float) -> AsyncIterator[RayAgentPool]:
    """A :class:`RayAgentPool` for the body; every actor is killed on the way out.

    Ray must be connected (:func:`relaxtrio.cluster.runtime.connect`).

    Args:
        num_cpus: CPUs each actor reserves on its node (``--agent-num-cpus``).

    Cancellation:
        The pool is closed shielded (bounded) whichever way the body ends.
    """
    pool = RayAgentPool(num_cpus=num_cpus)
    try:
        yield pool
    finally:
        await pool.aclose()


@attrs.define(eq=False, kw_only=True)
class _Call:
    """One Session's run on one actor: the driver side of the actor's protocol."""

    pool: RayAgentPool
    member: _Member
    run_id: int
    session_id: str
    wait_s: float
    ref: Any = None

    async def run(self, config: AgentConfig, session: SessionEnv, payload: Mapping[str, object],
                  budget: ActiveBudget, task_status: trio.TaskStatus[int]) -> tuple[Outcome, float]:
        """Starts the run, waits for its end under ``budget``; ``(outcome, active seconds)``."""
        remote_config = attrs.evolve(config, launcher=None)
        actor = self.member.handle
        # Not abandoned on cancel: the ref must be known to cancel the run it names.
        self.ref = await trio.to_thread.run_sync(
            functools.partial(actor.run.remote, self.run_id, remote_config, session, dict(payload)),
            limiter=self.pool._limiter)
        asked = time.monotonic()
        state, pgid, node = await self.pool._thread(self._wait_started)
        self.member.node = node
        log.info("session %s: agent %s on node %s after %.1f s (actor %d, run %d)", self.session_id,
                 state, node, time.monotonic() - asked, self.member.number, self.run_id)
        if state in ("waiting", "stale"):
            raise AgentExecutionError(f"Agent did not start on Ray node {node} within {START_WAIT_S:g} s.",
                                      session_id=self.session_id)
        if pgid is not None:
            task_status.started(pgid)
        used_before = budget.total_s - budget.remaining_s()
        outcome = None
        with budget.scope:
            outcome = await self.pool._thread(self._get, self.ref, None)
        if outcome is None:  # the driver's budget ran out: expire the run there, keep its tail
            with trio.CancelScope(shield=True):
                outcome = await self.pool._thread(self._expire)
            if outcome is None:
                raise AgentExecutionError(f"Agent timed out after {config.timeout_s:g} s of active time "
                                          f"(its node {node} did not confirm the kill).",
                                          session_id=self.session_id, timed_out=True)
        return outcome, budget.total_s - budget.remaining_s() - used_before

    def _wait_started(self) -> tuple[StartState, int | None, str]:
        """The actor's ``wait_started`` answer (blocking; a lost actor fails the Session)."""
        ref = self.member.handle.wait_started.remote(self.run_id, START_WAIT_S)
        return self._get(ref, START_WAIT_S + _KILL_MARGIN_S)

    def _get(self, ref: Any, wait_s: float | None) -> Any:
        """``ray.get``, a lost actor turned into the Session's agent failure (blocking)."""
        try:
            return ray.get(ref, timeout=wait_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise AgentExecutionError(
                f"Agent did not start within {START_WAIT_S:g} s: no Ray node had "
                f"{self.pool.num_cpus:g} CPUs free for its actor, or the actor did not start.",
                session_id=self.session_id) from exc
        except ray.exceptions.RayActorError as exc:
            self.pool._note_lost(self.member)
            raise AgentExecutionError(
                f"Agent's Ray node {self.member.where} was lost ({type(exc).__name__}: its actor "
                "died); the Session cannot finish.", session_id=self.session_id) from exc

    def _expire(self) -> Outcome | None:
        """Expires the run on its node; its outcome, or None when unconfirmed (blocking)."""
        with contextlib.suppress(ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            ray.get(self.member.handle.expire.remote(self.run_id), timeout=self.wait_s)
            return ray.get(self.ref, timeout=self.wait_s)
        return None

    def cancel(self, ref: Any) -> Outcome | None:
        """Cancels a run still going (its group is terminated on its node) and waits for its
        end; the outcome, or None when it did not confirm or was never started (blocking)."""
        if ref is None:
            return None
        with contextlib.suppress(Exception):
            ray.get(self.member.handle.cancel.remote(self.run_id), timeout=self.wait_s)
            return ray.get(ref, timeout=self.wait_s)
        return None


def _result(outcome: Outcome, active_s: float, session_id: str) -> AgentRun:
    """The run's :class:`AgentRun`, or its failure raised as the local executor raises it."""
    if outcome.kind == "ok":
        assert outcome.run is not None
        return attrs.evolve(outcome.run, active_s=active_s)
    if outcome.kind == "oserror":
        raise OSError(outcome.message)
    if outcome.kind == "cancelled":  # cancelled on its node without the driver asking: a bug
        raise AgentExecutionError("Agent run was cancelled on its node.", session_id=session_id)
    raise AgentExecutionError(outcome.message, session_id=session_id, timed_out=outcome.timed_out,
                              return_code=outcome.return_code)


def _new_actor(num_cpus: float) -> Any:
    return AgentActor.options(num_cpus=num_cpus).remote()


def _kill(handle: Any) -> None:
    with contextlib.suppress(Exception):
        ray.kill(handle)


def _kill_all(handles: list[Any], wait_s: float) -> None:
    """Kills every actor, then waits until each call to it fails as dead (at most ``wait_s``)."""
    for handle in handles:
        _kill(handle)
    deadline = time.monotonic() + wait_s
    for handle in handles:
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            log.error("Ray agent pool: %d actors not confirmed dead after %g s", len(handles), wait_s)
            return
        with contextlib.suppress(Exception):  # RayActorError: dead, as wanted
            ray.get(handle.node.remote(), timeout=left_s)
            log.error("Ray agent pool: an actor still answers after ray.kill")

