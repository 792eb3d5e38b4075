"""The Ray actor behind ``--agent-executor ray``: runs one Session's agent at a time on its node.

An :data:`AgentActor` (an :class:`AgentRunner` in a Ray actor) is long-lived: the driver's :class:`~relaxtrio.cluster.agents.RayAgentPool`
creates it once and hands it one Session after another. Each *run* (numbered by the driver,
1, 2, ... per actor) calls :func:`relaxtrio.nursery.agent.run_agent` inside a fresh
``trio.run`` on one of the actor's threads, so the agent contract is the local one, carried out
on this node: the input JSON written here, the seven ``RELAX_*`` variables, ``bash -lc`` in
``--agent-cwd``, the agent leading its own process group under the reaper shim (whose parent
is this actor process: if the actor dies, the shim takes the group down), the output text and
the 8 KiB log tail sent back.

The other methods run on the actor's other threads while ``run`` blocks (a threaded actor:
the class has no ``async def``, or Ray would make it an asyncio actor running every plain
method on one event-loop thread, where a blocking ``wait_started`` and ``run`` wait for each
other for ever): ``wait_started``
answers once the agent process exists, ``expire`` ends it as a timeout (the driver owns the
budget) and ``cancel`` ends it as cancelled. Both requests may arrive before the run's loop
exists (Ray does not order calls on a threaded actor); they are then applied when it starts.
Requests reach the loop through ``TrioToken.run_sync_soon``, which never waits on the loop.

Import weight matters: every actor start imports this module (and through it only
:mod:`relaxtrio.nursery.agent`, :mod:`relaxtrio.config`, trio and attrs), never torch or
transformers (tests/test_layering.py checks it).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs
import ray
import trio

from .._errors import AgentExecutionError
from ..config import AgentConfig
from ..nursery.agent import ActiveBudget, AgentRun, SessionEnv, run_agent

__all__ = ["AgentActor", "AgentRunner", "Outcome", "StartState"]

_ACTOR_THREADS: Final = 8
"""Threads per actor: ``run`` blocks one; ``wait_started``, ``expire``, ``cancel`` and ``node``
take others (a stale ``wait_started`` abandoned by a cancelled Session may hold one for a while)."""

OutcomeKind = Literal["ok", "error", "oserror", "cancelled"]
StartState = Literal["started", "ended", "waiting", "stale"]


@attrs.frozen(kw_only=True)
class Outcome:
    """What one run sent back to the driver.

    Attributes:
        kind: ``ok`` (``run`` is set), ``error`` (an :class:`~relaxtrio.AgentExecutionError`:
            ``message``, ``timed_out``, ``return_code``), ``oserror`` (the agent could not be
            started: ``message``) or ``cancelled``.
    """

    kind: OutcomeKind
    run: AgentRun | None = None
    message: str = ""
    timed_out: bool = False
    return_code: int | None = None


@attrs.define(eq=False)
class _RunState:
    """One run's state, shared by the actor's threads (guarded by the actor's condition)."""

    pgid: int | None = None
    done: bool = False
    token: trio.lowlevel.TrioToken | None = None
    outer: trio.CancelScope | None = None
    budget: ActiveBudget | None = None
    requests: list[str] = attrs.field(factory=list)


@attrs.frozen
class _Started:
    """The ``task_status`` of :func:`run_agent` for one run: records the process group id."""

    cond: threading.Condition
    state: _RunState

    def started(self, pgid: int) -> None:
        with self.cond:
            self.state.pgid = pgid
            self.cond.notify_all()


def _apply(state: _RunState, request: str) -> None:
    """Carries out ``expire`` or ``cancel`` inside the run's trio loop."""
    if request == "expire" and state.budget is not None:
        state.budget.scope.cancel()
    elif request == "cancel" and state.outer is not None:
        state.outer.cancel()


async def _run_agent_in_loop(cond: threading.Condition, state: _RunState, config: AgentConfig,
                             session: SessionEnv, payload: Mapping[str, Any]) -> Outcome:
    """One run inside its own trio loop: :func:`run_agent`, its failures turned into an Outcome.

    A module function, not a method: one ``async def`` on the actor class would make Ray run it
    as an asyncio actor, whose plain methods all run on one event-loop thread, so a blocking
    ``wait_started`` and ``run`` would wait for each other for ever.

    Cancellation:
        ``cancel`` cancels the outer scope: the agent's process group is terminated (shielded,
        bounded, inside :func:`run_agent`) and the outcome is ``cancelled``.
    """
    # Paused for ever: the driver owns the active-time budget and expires this one on timeout.
    budget = ActiveBudget(total_s=config.timeout_s)
    with trio.CancelScope() as outer:
        with cond:
            state.token, state.outer, state.budget = trio.lowlevel.current_trio_token(), outer, budget
            early = list(state.requests)
        for request in early:
            _apply(state, request)
        try:
            run = await run_agent(config, session, payload, budget, task_status=_Started(cond, state))
        except AgentExecutionError as exc:
            return Outcome(kind="error", message=str(exc), timed_out=exc.timed_out,
                           return_code=exc.return_code)
        except OSError as exc:
            return Outcome(kind="oserror", message=str(exc))
        return Outcome(kind="ok", run=run)
    return Outcome(kind="cancelled")


class AgentRunner:
    """Runs the agents of one Session after another on this node (module docstring).

    The body of :data:`AgentActor`; a plain class, so that its protocol can be tested without Ray.

    Args:
        node: this node's IP address, for the driver's messages.
    """

    def __init__(self, node: str | None = None) -> None:
        self._cond = threading.Condition()
        self._runs: dict[int, _RunState] = {}
        self._newest = 0
        self._node = node or ray.util.get_node_ip_address()

    def node(self) -> str:
        """This actor's node IP (answers once the actor is placed and started)."""
        return self._node

    def _state(self, run_id: int) -> _RunState | None:
        """The state of run ``run_id`` (created on first touch), None for a finished older run."""
        state = self._runs.get(run_id)
        if state is None and run_id >= self._newest:
            state = self._runs[run_id] = _RunState()
        return state

    def run(self, run_id: int, config: AgentConfig, session: SessionEnv,
            payload: Mapping[str, Any]) -> Outcome:
        """Runs one agent to its end; never raises for the agent's own failures."""
        with self._cond:
            self._newest = max(self._newest, run_id)
            for old in [k for k in self._runs if k < run_id]:
                self._runs.pop(old).done = True
            state = self._state(run_id)
            self._cond.notify_all()
        assert state is not None
        try:
            return trio.run(_run_agent_in_loop, self._cond, state, config, session, payload)
        finally:
            with self._cond:
                state.done = True
                self._cond.notify_all()

    def wait_started(self, run_id: int, timeout_s: float) -> tuple[StartState, int | None, str]:
        """``(state, pgid, node IP)``: ``started`` once the agent process exists, ``ended`` when
        the run finished without starting one, ``waiting`` after ``timeout_s`` seconds of
        neither, ``stale`` for a run older than the current one."""
        with self._cond:
            state = self._state(run_id)
            if state is None:
                return "stale", None, self._node
            self._cond.wait_for(lambda: state.pgid is not None or state.done, timeout_s)
            if state.pgid is not None:
                return "started", state.pgid, self._node
            return ("ended" if state.done else "waiting"), None, self._node

    def expire(self, run_id: int) -> None:
        """The driver's budget ran out: end the agent as a timeout (group terminated, tail kept)."""
        self._request(run_id, "expire")

    def cancel(self, run_id: int) -> None:
        """The Session was cancelled: terminate the agent's process group and end the run."""
        self._request(run_id, "cancel")

    def _request(self, run_id: int, request: str) -> None:
        with self._cond:
            state = self._state(run_id)
            if state is None or state.done:
                return
            state.requests.append(request)
            token = state.token
        if token is not None:
            try:
                token.run_sync_soon(_apply, state, request)
            except trio.RunFinishedError:
                pass


AgentActor: Final = ray.remote(max_concurrency=_ACTOR_THREADS)(AgentRunner)
"""The Ray actor class: an :class:`AgentRunner` in its own worker process, several threads."""
