"""The Session task: one Session from its agent's start to its exported samples
(:func:`run_session`), or a Session served for an agent run by hand (:func:`serve_external_session`).

Failures are Session state: an agent that fails, sends no first request in time, writes invalid
output or exports nothing marks its Session ``failed`` and tells the Group; only bugs propagate.
:mod:`relaxtrio.nursery.group` starts one task per Session in the Group's nursery.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from .._errors import AgentExecutionError, ExportError
from ..config import AgentConfig
from ..forest import LeafSelection, export_samples, parse_session_output, select_leaves
from ..tracing import current_tracing
from .agent import SessionEnv, run_agent
from .session import Session, SessionRegistry

log = logging.getLogger(__name__)

__all__ = ["agent_log_path", "run_session", "serve_external_session"]


@attrs.frozen
class _PgidRecorder:
    """Receives the agent's process-group id (the ``task_status`` protocol of run_agent)."""

    session: Session

    def started(self, value: int | None = None) -> None:  # the pgid; trio.TaskStatus' signature
        self.session.note_agent_started(value)


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
    max_response_tokens: int | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Runs a Session from agent start to exported samples; failures become Session state.

    On success ``session.status == "completed"`` and ``session.samples`` holds the exported
    samples. On an agent or export failure ``session.status == "failed"`` with
    ``session.error`` set, and the Group is told (it drops itself). Either way
    :meth:`Session.wait_ended` returns afterwards. The agent is told the Session's context
    window and ``max_response_tokens`` (docs/agent-contract.md#environment-variables).

    Cancellation:
        Cancelling terminates the agent's process group (shielded), aborts in-flight turns and
        unregisters the Session; ``status`` becomes ``cancelled``.
    """
    tracing = current_tracing()  # a relaxtrio.session span, ended with the Session's status
    tracing.start_session(session.session_id, group_id=session.group.group_id, index=session.index)
    try:
        await _run_session(session, agent=agent, base_url=base_url, registry=registry,
                           server_template_kwargs=server_template_kwargs,
                           max_response_tokens=max_response_tokens, task_status=task_status)
    finally:
        _settle_agent_log(agent_log_path(agent, session), session)
        session.mark_ended()
        tracing.end_session(session.session_id, status=session.status)


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
        await self.session.wait_agent_started()  # a Ray actor's placement does not count
        with trio.move_on_after(self.timeout_s):
            await self.session.wait_first_request()
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
    max_response_tokens: int | None,
    task_status: trio.TaskStatus[None],
) -> None:
    registry.add(session)
    env = SessionEnv(
        session_id=session.session_id,
        group_id=session.group.group_id,
        base_url=base_url,
        mode=session.mode,
        max_context_tokens=session.forest.max_context_tokens,
        max_response_tokens=max_response_tokens,
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
    session.timeline.add("agent_exit", run.return_code)
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
        session.timeline.add("export", len(session.samples))
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
    tracing = current_tracing()
    tracing.start_session(session.session_id, group_id=session.group.group_id, index=session.index)
    try:
        async with session.serving():
            task_status.started()
            await trio.sleep_forever()
    finally:
        registry.discard(session)
        session.mark_ended()
        tracing.end_session(session.session_id, status=session.status)
