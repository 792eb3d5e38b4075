"""Sessions and Groups for tests, assembled in one place (the pipeline builds them the same way).

Tests that drive turns or Groups without the rollout pipeline get their Sessions here, so a change
to how a Session or Group is built is made once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from relaxtrio.forest import SessionForest
from relaxtrio.nursery.agent import ActiveBudget
from relaxtrio.nursery.group import Group
from relaxtrio.nursery.session import Session, SessionRegistry, new_session_id

Payload = Mapping[str, Any] | Callable[[int], Mapping[str, Any]] | None


def add_session(
    group: Group,
    *,
    session_id: str | None = None,
    input_payload: Mapping[str, Any] | None = None,
    dataset_metadata: Mapping[str, Any] | None = None,
    max_context_tokens: int | None = None,
    budget_s: float = 60.0,
) -> Session:
    """Appends one Session (index = its position) to ``group`` and returns it.

    Args:
        group: the Group the Session belongs to.
        session_id: the id (default: a fresh unguessable one).
        input_payload: the RELAX_INPUT_JSON object (default ``{}``).
        dataset_metadata: the dataset row's metadata (default ``{}``).
        max_context_tokens: the forest's training-token limit, or None.
        budget_s: the active-time budget in seconds.
    """
    sid = session_id or new_session_id()
    session = Session(
        session_id=sid, group=group, index=len(group.sessions),
        input_payload=dict(input_payload or {}), dataset_metadata=dict(dataset_metadata or {}),
        forest=SessionForest(sid, max_context_tokens=max_context_tokens),
        budget=ActiveBudget(total_s=budget_s),
    )
    group.sessions.append(session)
    return session


def make_group(
    num_sessions: int = 0,
    *,
    group_id: str = "train:group_test",
    input_payload: Payload = None,
    session_ids: Callable[[int], str] | None = None,
    **session_fields: Any,
) -> Group:
    """A Group of ``num_sessions`` Sessions (see :func:`add_session` for ``session_fields``).

    Args:
        num_sessions: Sessions to add, in index order.
        group_id: the Group id (``train:`` or ``eval:`` prefix).
        input_payload: one payload for every Session, or ``fn(index) -> payload``.
        session_ids: ``fn(index) -> session id``, or None for fresh ids.
    """
    group = Group(group_id=group_id)
    for index in range(num_sessions):
        payload = input_payload(index) if callable(input_payload) else input_payload
        add_session(group, session_id=session_ids(index) if session_ids else None,
                    input_payload=payload, **session_fields)
    return group


def leased_session(**session_fields: Any) -> Session:
    """The only Session of a Group that holds its lease and passed its first-request barrier, so
    turns may generate at once (what a Session looks like mid-rollout)."""
    group = Group(group_id=session_fields.pop("group_id", "train:group_test"))
    session = add_session(group, **session_fields)
    group.lease()
    group.note_request(session)
    return session


@asynccontextmanager
async def open_session(registry: SessionRegistry, **session_fields: Any) -> AsyncIterator[Session]:
    """A registered, leased Session that accepts turns while the context is open.

    Cancellation:
        Exiting closes the Session (its turns are cancelled) and unregisters it.
    """
    group = Group(group_id=session_fields.pop("group_id", "train:group_test"))
    session = add_session(group, **session_fields)
    registry.add(session)
    try:
        async with session.serving():
            group.lease()
            group.note_request(session)
            yield session
    finally:
        registry.discard(session)
