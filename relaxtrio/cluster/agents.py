"""``--agent-executor ray``: each Session's agent runs in a Ray actor on a node with free CPUs.

The contract stays the one of :func:`relaxtrio.nursery.agent.run_agent`, because the actor runs
that very function (in its own trio loop) on its node: the input JSON is shipped in the call and
written there, the seven ``RELAX_*`` variables are set there (``RELAX_BASE_URL`` is the URL the
driver advertises, see ``--agentic-api-advertise-url``), the agent runs as ``bash -lc`` in
``--agent-cwd`` (which must exist on every node) as the leader of its own process group, its
output JSON (or JSONL) comes back as text, and errors end with the last 8 KiB of its output.

The Session's active-time budget stays in the driver (it pauses and resumes with generation).
When it runs out the driver tells the actor to *expire* its run: the agent's process group is
terminated on its node and the usual "timed out" :class:`~relaxtrio.AgentExecutionError` (with
the output tail) comes back. When the Session is cancelled (run stopped, Group dropped) the
driver tells the actor to *cancel*: the process group is terminated there too, shielded and
bounded, before the actor is killed. A node lost under an agent (``RayActorError``) fails the
Session with an :class:`~relaxtrio.AgentExecutionError` naming the node; its Group is dropped
with that reason and refilled like any agent failure.

Each actor reserves ``--agent-num-cpus`` CPUs on whichever node has them free (Ray's default placement).
Every Ray call is made from a worker thread (``trio.to_thread.run_sync``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import ray
import trio

from .._errors import AgentExecutionError
from ..config import AgentConfig
from ..nursery.agent import KILL_GRACE_S, ActiveBudget, AgentRun, SessionEnv, run_agent

__all__ = ["ray_agent_launcher", "run_agent_on_ray"]

log = logging.getLogger(__name__)

_KILL_MARGIN_S: Final = 10.0
"""Seconds on top of the kill sequence for the Ray round trips that ask for it and confirm it."""

_START_WAIT_S: Final = 600.0
"""Seconds to wait for an actor to be placed and its agent started (the cluster may be busy)."""


@ray.remote(max_concurrency=3)  # run() blocks while started()/expire()/cancel() are answered
class _AgentActor:
    """Runs one Session's agent on this actor's node with :func:`run_agent`."""

    def __init__(self) -> None:
        self._started = threading.Event()
        self._pgid = 0
        self._node = ray.util.get_node_ip_address()
        self._token: trio.lowlevel.TrioToken | None = None
        self._outer: trio.CancelScope | None = None
        self._budget: ActiveBudget | None = None

    def run(self, config: AgentConfig, session: SessionEnv, payload: Mapping[str, Any]) -> tuple[str, Any]:
        """``("ok", AgentRun)``, ``("error", message)`` or ``("cancelled", None)``."""
        return trio.run(self._main, config, session, payload)

    async def _main(self, config: AgentConfig, session: SessionEnv, payload: Mapping[str, Any]) -> tuple[str, Any]:
        # Paused for ever: the driver owns the active-time budget and expires this one on timeout.
        self._budget = ActiveBudget(total_s=config.timeout_s)
        with trio.CancelScope() as outer:
            self._outer, self._token = outer, trio.lowlevel.current_trio_token()
            try:
                run = await run_agent(config, session, payload, self._budget, task_status=self)
            except AgentExecutionError as exc:
                return "error", str(exc)
            except OSError as exc:
                return "oserror", str(exc)
            finally:
                self._started.set()
            return "ok", run
        return "cancelled", None

    def started(self, pgid: int) -> None:
        """``task_status`` of :func:`run_agent`: the agent's process group id."""
        self._pgid = pgid
        self._started.set()

    def wait_started(self, timeout_s: float) -> tuple[int, str]:
        """``(pgid, node IP)`` once the agent process started (or failed to)."""
        self._started.wait(timeout_s)
        return self._pgid, self._node

    def expire(self) -> None:
        """The driver's budget ran out: end the agent as a timeout (group terminated, tail kept)."""
        self._in_loop(lambda: self._budget.scope.cancel() if self._budget else None)

    def cancel(self) -> None:
        """The Session was cancelled: terminate the agent's process group and return."""
        self._in_loop(lambda: self._outer.cancel() if self._outer else None)

    def _in_loop(self, fn: Any) -> None:
        if self._token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(fn, trio_token=self._token)


def ray_agent_launcher(num_cpus: float) -> Any:
    """A ``launcher`` for :class:`~relaxtrio.config.AgentConfig`: :func:`run_agent_on_ray`
    with each actor reserving ``num_cpus`` CPUs."""
    return functools.partial(run_agent_on_ray, num_cpus=num_cpus)


async def run_agent_on_ray(
    config: AgentConfig,
    session: SessionEnv,
    input_payload: Mapping[str, object],
    budget: ActiveBudget,
    *,
    num_cpus: float = 1.0,
    log_path: Path | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> AgentRun:
    """:func:`~relaxtrio.nursery.agent.run_agent`, with the agent on a Ray node (module docstring).

    Args:
        config: command, cwd, env and timeout (``cwd`` must exist on the node).
        session: the identity and base URL handed to the agent (the advertised URL).
        input_payload: JSON object written to ``RELAX_INPUT_JSON`` on the node.
        budget: the Session's pausable active-time budget, enforced here in the driver.
        num_cpus: CPUs the agent's actor reserves.
        log_path: accepted for the launcher signature and not used: the agent's log stays on its
            node, and only its last 8 KiB reach the driver (in the failure reason).
        task_status: receives the agent's process-group id on its node.

    Returns:
        The finished run (``active_s`` measured by the driver's budget).

    Raises:
        AgentExecutionError: timed out, exited non-zero, wrote unparsable output, or its node
            was lost.
        OSError: the agent could not be started on its node.

    Cancellation:
        Cancelling terminates the agent's process group on its node (shielded, at most
        ``term_grace_s`` + 5 s + a margin) and kills the actor before the Cancelled propagates.
    """
    remote_config = attrs.evolve(config, launcher=None)
    kill_wait_s = config.term_grace_s + KILL_GRACE_S + _KILL_MARGIN_S
    actor = await trio.to_thread.run_sync(_new_actor, num_cpus)
    finished = False
    ref = None
    try:
        ref = actor.run.remote(remote_config, session, dict(input_payload))
        pgid, node = await trio.to_thread.run_sync(_get, actor.wait_started.remote(_START_WAIT_S),
                                                   session.session_id, "?", abandon_on_cancel=True)
        task_status.started(pgid)
        used_before = budget.total_s - budget.remaining_s()
        with budget.scope:
            kind, value = await trio.to_thread.run_sync(_get, ref, session.session_id, node,
                                                        abandon_on_cancel=True)
            finished = True
        if not finished:  # the driver's budget ran out: expire the run there, keep its tail
            with trio.CancelScope(shield=True):
                kind, value = await trio.to_thread.run_sync(_expire, actor, ref, kill_wait_s, session.session_id, node)
                finished = kind != "unconfirmed"
            if not finished:
                raise AgentExecutionError(f"Agent timed out after {config.timeout_s:g} s of active time "
                                          f"(its node {node} did not confirm the kill).",
                                          session_id=session.session_id)
        active_s = budget.total_s - budget.remaining_s() - used_before
    finally:
        with trio.CancelScope(shield=True):  # bounded inside: kill_wait_s
            await trio.to_thread.run_sync(_end_actor, actor, None if finished else ref, kill_wait_s)
    if kind == "ok":
        return attrs.evolve(value, active_s=active_s)
    if kind == "oserror":
        raise OSError(value)
    raise AgentExecutionError(str(value), session_id=session.session_id)


def _new_actor(num_cpus: float) -> Any:
    return _AgentActor.options(num_cpus=num_cpus).remote()


def _get(ref: Any, session_id: str, node: str) -> Any:
    """``ray.get`` with a lost node turned into the Session's agent failure."""
    return _get_within(ref, None, session_id, node)  # type: ignore[arg-type]


def _expire(actor: Any, ref: Any, wait_s: float, session_id: str, node: str) -> tuple[str, Any]:
    """Expires the run on its node and returns its outcome, or ``("unconfirmed", None)``."""
    ray.get(actor.expire.remote(), timeout=wait_s)
    try:
        return _get_within(ref, wait_s, session_id, node)
    except ray.exceptions.GetTimeoutError:
        return "unconfirmed", None


def _get_within(ref: Any, wait_s: float, session_id: str, node: str) -> Any:
    try:
        return ray.get(ref, timeout=wait_s)
    except ray.exceptions.RayActorError as exc:
        raise AgentExecutionError(
            f"Agent's Ray node {node} was lost ({type(exc).__name__}); the Session cannot finish.",
            session_id=session_id,
        ) from exc


def _end_actor(actor: Any, unfinished: Any, wait_s: float) -> None:
    """Cancels a still-running agent (its group is terminated there), then kills the actor."""
    if unfinished is not None:
        with contextlib.suppress(Exception):
            ray.get(actor.cancel.remote(), timeout=wait_s)
            ray.get(unfinished, timeout=wait_s)
    with contextlib.suppress(Exception):
        ray.kill(actor)
