"""Sessions without agent processes, for benchmarks and in-process agents.

:func:`open_bare_session` registers a Session in a :class:`~relaxtrio.nursery.session.SessionRegistry`
with a leased one-Session Group, so the agent API serves it exactly as it serves a Session whose
agent process runs; the caller (a benchmark's load driver, an in-process agent) plays the agent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ..forest import SessionForest
from ..nursery.agent import ActiveBudget
from ..nursery.group import Group
from ..nursery.session import Session, SessionRegistry, new_session_id

__all__ = ["open_bare_session"]


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
    group = Group(group_id=group_id)
    session_id = new_session_id()
    session = Session(session_id=session_id, group=group, index=0, input_payload={},
                      forest=SessionForest(session_id, max_context_tokens=max_context_tokens),
                      budget=ActiveBudget(total_s=budget_s))
    group.sessions.append(session)
    registry.add(session)
    try:
        async with session.serving():
            group.lease()
            group.note_request(session)
            yield session
    finally:
        registry.discard(session)
