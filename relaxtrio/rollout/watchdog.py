"""The first-request barrier watchdog: a stuck Group is a log line, never a silent hang.

A Group generates only once every Session sent its first model request. When an agent never gets
that far (for example an external executor with too few slots to start it), its siblings wait at
the barrier forever. :class:`BarrierWatchdog` watches each Group the rollout pipeline runs and,
every ``barrier_warn_s`` seconds it waits, logs an ``event=barrier_wait`` line naming the
Sessions that have not sent their first request and how long the Group has run.
"""

from __future__ import annotations

import logging

import attrs
import trio

from ..nursery.group import Group
from .step import agentic_event

log = logging.getLogger(__name__)


@attrs.define(eq=False, kw_only=True)
class BarrierWatchdog:
    """Warns about Groups waiting at the first-request barrier.

    Attributes:
        warn_s: seconds a Group may wait at the barrier before each warning.
    """

    warn_s: float
    _num_warnings: int = 0
    _warned: trio.Event = attrs.field(factory=trio.Event)

    @property
    def num_warnings(self) -> int:
        """Warnings logged so far."""
        return self._num_warnings

    async def watch(self, group: Group) -> None:
        """Warns every ``warn_s`` seconds while ``group`` waits at the barrier.

        Returns once the barrier passed, or at the first deadline after the Group finished.

        Cancellation:
            A plain wait; nothing to clean up.
        """
        watching_since = trio.current_time()
        while not group.finished:
            with trio.move_on_after(self.warn_s):
                await group.wait_barrier_passed()
                return
            if not group.finished:
                self._warn(group, watching_since)

    def _warn(self, group: Group, watching_since: float) -> None:
        now = trio.current_time()
        waited = now - (group.started_at if group.started_at is not None else watching_since)
        self._num_warnings += 1
        self._warned.set()
        self._warned = trio.Event()
        missing = ", ".join(
            f"session {s.index} {s.session_id} (running {waited:.1f} s, no request yet)"
            for s in group.missing_first_requests()
        )
        log.warning(agentic_event(
            "rollout", "barrier_wait", group=group.group_id, mode=group.mode,
            waited_s=f"{waited:.1f}", leased=group.leased) + f" missing: {missing}")

    async def wait_warnings(self, count: int) -> None:
        """Waits until at least ``count`` warnings were logged in total.

        Cancellation:
            A plain wait; nothing to clean up.
        """
        while self._num_warnings < count:
            await self._warned.wait()
