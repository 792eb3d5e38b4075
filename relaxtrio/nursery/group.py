"""Group: the ``n_samples_per_prompt`` Sessions of one prompt, run in one trio nursery.

GRPO compares the Sessions of a Group, so the Group lives and dies as a unit: when one Session
fails (agent error, timeout, invalid output, export failure) the whole Group is dropped with a
logged reason and every sibling is cancelled (their agents terminated).

Generation gate: requests are committed as they arrive, but none is generated until the Group
holds its Runtime lease *and* every Session has sent its first request (the first-request
barrier of the reference, J-4).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .agent import AgentConfig, RolloutMode

if TYPE_CHECKING:
    from ..forest import TrainingSample
    from .session import Session, SessionRegistry

log = logging.getLogger(__name__)


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
    """

    group_id: str
    mode: RolloutMode = "train"
    prompt_index: int = 0
    sessions: list[Session] = attrs.field(factory=list)
    dropped_reason: str | None = None
    leased: bool = False
    _cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _requested: set[str] = attrs.field(factory=set)
    _generation_open: trio.Event = attrs.field(factory=trio.Event)

    @property
    def dropped(self) -> bool:
        """Whether the Group was dropped (its samples are not trained on)."""
        return self.dropped_reason is not None

    @property
    def barrier_passed(self) -> bool:
        """Whether every Session has sent at least one model request."""
        return len(self._requested) >= len(self.sessions)

    def note_request(self, session: Session) -> None:
        """Records that ``session`` sent a request (first-request barrier)."""
        self._requested.add(session.session_id)
        self._maybe_open()

    def lease(self) -> None:
        """Grants the Runtime lease: agent budgets start, held requests may generate."""
        self.leased = True
        for session in self.sessions:
            session.budget.resume()
        self._maybe_open()

    def _maybe_open(self) -> None:
        if self.leased and self.barrier_passed and not self._generation_open.is_set():
            self._generation_open.set()

    async def wait_generation_open(self) -> None:
        """Waits until this Group may generate (lease held and barrier passed).

        Cancellation:
            A plain wait; nothing to clean up.
        """
        await self._generation_open.wait()

    def session_failed(self, session: Session) -> None:
        """Drops the Group because ``session`` failed, cancelling every sibling."""
        if self.dropped_reason is None:
            self.dropped_reason = (
                f"session {session.index} ({session.session_id}) failed: {session.error}"
            )
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
) -> Group:
    """Runs every Session of ``group`` in one nursery and returns the finished Group.

    The Group is leased at once (capacity is managed by the caller). Afterwards either every
    Session completed, or ``group.dropped_reason`` says why the Group was dropped.

    Cancellation:
        Cancelling terminates every agent of the Group (shielded, bounded) before returning.
    """
    from .session import run_session

    start = functools.partial(
        run_session,
        agent=agent,
        base_url=base_url,
        registry=registry,
        server_template_kwargs=server_template_kwargs,
    )
    with group._cancel_scope:
        async with trio.open_nursery() as nursery:
            for session in group.sessions:
                await nursery.start(start, session)
            group.lease()
    if group.dropped_reason is None:
        incomplete = [s for s in group.sessions if s.status != "completed"]
        if incomplete:
            group.dropped_reason = f"session {incomplete[0].index} ended as {incomplete[0].status}"
    if group.dropped_reason is not None:
        log.warning("Dropped group %s: %s", group.group_id, group.dropped_reason)
    return group
