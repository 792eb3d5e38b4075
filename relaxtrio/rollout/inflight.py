"""Aborting the in-flight generations of paused Sessions at a partial-rollout step close."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import trio

from .._errors import BackendError
from ..nursery.group import Group
from ..nursery.partial import PartialRollout

__all__ = ["abort_inflight"]


async def abort_inflight(groups: Sequence[Group], abort: Callable[[str], Awaitable[object]],
                         wait_s: float) -> int:
    """Aborts the in-flight generations of the paused Sessions of ``groups`` and waits for them
    to return.

    Each Session's :meth:`~relaxtrio.nursery.partial.PartialRollout.abort_all` re-sends its
    aborts until its generations returned; all of them together get ``wait_s`` seconds.

    Args:
        groups: the Groups paused at the step close.
        abort: the engine abort of one request id (the turn handler's).
        wait_s: seconds all aborted generations together may take to return.

    Returns:
        Generations aborted.

    Raises:
        BackendError: generations still in flight after ``wait_s``, or an abort could not reach
            the engine.
    """
    sessions = [s for g in groups for s in g.sessions if s.partial.paused]
    counts: list[int] = []

    async def abort_session(partial: PartialRollout) -> None:
        counts.append(await partial.abort_all(abort))

    with trio.move_on_after(wait_s):
        async with trio.open_nursery() as nursery:
            for session in sessions:
                nursery.start_soon(abort_session, session.partial)
    left = sorted(rid for s in sessions for rid in s.partial.statistics().inflight_rids)
    if left:
        raise BackendError(f"engine did not return {len(left)} aborted generations within {wait_s:g} s: {left[:4]}")
    return sum(counts)
