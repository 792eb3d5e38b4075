"""Sessions without agent processes, for benchmarks and in-process agents.

:func:`open_bare_session` registers a Session in a :class:`~relaxtrio.nursery.session.SessionRegistry`
with a leased one-Session Group, so the agent API serves it exactly as it serves a Session whose
agent process runs; the caller (a benchmark's load driver, an in-process agent) plays the agent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from ..nursery.group import Group
from ..nursery.session import Session, SessionRegistry

__all__ = ["open_bare_session", "serve_bare_sessions"]


@asynccontextmanager
async def open_bare_session(
    registry: SessionRegistry,
    *,
    group_id: str = "train:bare",
    max_context_tokens: int | None = None,
    budget_s: float = 3600.0,
) -> AsyncIterator[Session]:
    """A registered Session whose Group holds the Runtime lease; it takes turns while open.

    Args:
        registry: where the API server looks Sessions up by bearer token.
        group_id: the id of the Session's own Group.
        max_context_tokens: the forest's context limit in tokens, or None.
        budget_s: the active-time budget in seconds (informational: nothing runs it down).

    Yields:
        The Session (its ``session_id`` is the bearer token).

    Cancellation:
        Leaving (normally or cancelled) closes the Session: turns still running are cancelled
        and it is unregistered.
    """
    group = Group.create(group_id, num_sessions=1, input_payload={}, timeout_s=budget_s,
                         max_context_tokens=max_context_tokens)
    session = group.sessions[0]
    registry.add(session)
    try:
        async with session.serving():
            group.lease()
            group.note_request(session)
            yield session
    finally:
        registry.discard(session)


async def serve_bare_sessions(
    registry: SessionRegistry,
    num_sessions: int,
    *,
    task_status: trio.TaskStatus[list[Session]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep ``num_sessions`` bare Sessions open (each in its own task) until cancelled.

    Args:
        registry: where the Sessions are registered.
        num_sessions: how many.
        task_status: receives the Sessions, in creation order, once all are open.

    Cancellation:
        Cancelling closes every Session (see :func:`open_bare_session`).
    """

    async def hold(index: int, *, task_status: trio.TaskStatus[Session]) -> None:
        async with open_bare_session(registry, group_id=f"train:bare{index}") as session:
            task_status.started(session)
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        sessions = [await nursery.start(hold, i) for i in range(num_sessions)]
        task_status.started(sessions)
