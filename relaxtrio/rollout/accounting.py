"""What a rollout step tells the operator while it runs: accounting lines, idle heartbeats and
the progress bar's postfix.

* ``AGENTIC ROLLOUT event=accounting_start`` opens a step and ``event=accounting_end`` closes it
  (Groups, rows, debt, resident and interrupted Groups; see :mod:`relaxtrio.rollout.pipeline`);
* :func:`wait_with_heartbeat` runs a step's wait for progress and calls back every
  ``interval_s`` seconds (trio clock) in which nothing happened, so a stuck step logs
  ``event=idle_heartbeat`` with a :class:`PipelineSnapshot` instead of going quiet;
* :class:`ChangeSignal` is what that wait waits on: a count of the pipeline's changes (a Group
  finished, the engine failed), so a change is never lost between two waits;
* :func:`progress_postfix` is the bar's ``scored=`` (and with prelaunch ``prepared=``) count.

The snapshot's keys follow the pipeline's own states: ``prepare`` (started, waiting for the
lease), ``runtime`` (leased, generating), ``interrupted`` (paused by partial rollout),
``finalized`` (finished, not yet accounted for), ``scored`` (accepted this step).

:func:`group_stages` counts the pipeline's Groups by stage once, for both views of it: the
heartbeat's :class:`PipelineSnapshot` and the operator's ``/debug_state`` pipeline keys
(:func:`relaxtrio.rollout.operator_view.pipeline_snapshot`) are built from its
:class:`GroupStages`, so the two cannot count a stage differently.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import trio

from ..nursery.group import Group


@attrs.frozen(kw_only=True)
class GroupStages:
    """How many of the pipeline's Groups are at each stage right now.

    Attributes:
        resident: Groups holding a capacity permit (started, not yet ended).
        prepare: resident Groups not leased yet (prelaunched).
        prepare_ready: prepare Groups whose Sessions all sent their first request.
        leased: resident Groups holding the Runtime lease (paused ones included).
        runtime: leased resident Groups that are not paused.
        interrupted: resident Groups paused by partial rollout.
        finished: Groups that ended and no step has accounted for yet.
    """

    resident: int
    prepare: int
    prepare_ready: int
    leased: int
    runtime: int
    interrupted: int
    finished: int


@attrs.define(eq=False)
class ChangeSignal:
    """A count of changes, and a wait for the count to pass a value read earlier.

    Waiting on "the current :class:`trio.Event`" loses a change that happens while the waiter is
    between two waits: a heartbeat cancels the wait, the Group that finishes meanwhile sets the
    old event and installs a new one, and the restarted wait blocks on the new one for good
    (seen as a step that logs idle heartbeats while its Groups are finished). A waiter that
    read :attr:`version` before checking its condition and waits with :meth:`wait_past` on that
    value returns at once for any change since.

    Attributes:
        version: changes notified so far.
    """

    version: int = 0
    _event: trio.Event = attrs.field(factory=trio.Event)

    def notify(self) -> None:
        """Counts a change and wakes every waiter."""
        self.version += 1
        self._event.set()
        self._event = trio.Event()

    async def wait_past(self, seen: int) -> None:
        """Returns once :attr:`version` is greater than ``seen`` (at once if it already is).

        Cancellation:
            A plain wait; nothing to clean up.
        """
        while self.version <= seen:
            await self._event.wait()


def group_stages(resident: Sequence[Group], finished: Sequence[Group]) -> GroupStages:
    """Counts ``resident`` (permit holders) and ``finished`` (ended, unaccounted) Groups by stage."""
    return GroupStages(
        resident=len(resident),
        prepare=sum(1 for g in resident if not g.leased),
        prepare_ready=sum(1 for g in resident if not g.leased and g.barrier_passed),
        leased=sum(1 for g in resident if g.leased),
        runtime=sum(1 for g in resident if g.leased and not g.paused),
        interrupted=sum(1 for g in resident if g.paused),
        finished=len(finished),
    )


@attrs.frozen(kw_only=True)
class PipelineSnapshot:
    """Where the Groups of a running step are (what ``event=idle_heartbeat`` logs).

    Attributes:
        active_rollout_id: the step being run.
        debt: Groups the step still needs.
        scored_group_count: Groups accepted this step.
        prepare_group_count: resident Groups not leased yet (prelaunched).
        runtime_group_count: leased resident Groups that are not paused.
        interrupted_group_count: resident Groups paused by partial rollout.
        finalized_group_count: finished Groups not yet accounted for.
        resident_group_count: Groups holding a capacity permit.
        idle_s: seconds (trio clock) since the step last made progress.
    """

    active_rollout_id: int
    debt: int
    scored_group_count: int
    prepare_group_count: int
    runtime_group_count: int
    interrupted_group_count: int
    finalized_group_count: int
    resident_group_count: int
    idle_s: float

    @classmethod
    def from_stages(cls, stages: GroupStages, *, active_rollout_id: int, target: int, scored: int,
                    idle_s: float = 0.0) -> PipelineSnapshot:
        """The snapshot of step ``active_rollout_id`` (``target`` Groups, ``scored`` accepted)."""
        return cls(
            active_rollout_id=active_rollout_id, debt=max(target - scored, 0), scored_group_count=scored,
            prepare_group_count=stages.prepare, runtime_group_count=stages.runtime,
            interrupted_group_count=stages.interrupted, finalized_group_count=stages.finished,
            resident_group_count=stages.resident, idle_s=idle_s)

    def fields(self) -> dict[str, Any]:
        """The snapshot as ``key=value`` fields of an ``AGENTIC`` line."""
        return {k: (f"{v:.1f}" if isinstance(v, float) else v) for k, v in attrs.asdict(self).items()}


async def wait_with_heartbeat(wait: Callable[[], Awaitable[None]], *, interval_s: float,
                              on_idle: Callable[[float], None]) -> None:
    """Runs ``wait()`` to its end, calling ``on_idle(idle_s)`` after every ``interval_s`` seconds
    (trio clock) it has been waiting.

    ``wait`` is restarted after each heartbeat, so it must be a wait for a condition that stays
    true once met (e.g. :meth:`ChangeSignal.wait_past` on a version read before the caller
    checked its state), not work that a cancel would lose, and not a wait on whichever event is
    current when it restarts (a change during the heartbeat would be lost).

    Args:
        wait: the wait for progress.
        interval_s: seconds without progress between heartbeats (> 0).
        on_idle: receives the seconds waited so far (``interval_s``, ``2 * interval_s``, ...).

    Cancellation:
        A plain wait; nothing to clean up.
    """
    started = trio.current_time()
    while True:
        with trio.move_on_after(interval_s):
            await wait()
            return
        on_idle(trio.current_time() - started)


def progress_postfix(*, scored_sessions: int, prepared_sessions: int, prelaunch: bool) -> dict[str, int]:
    """The progress bar's postfix: Sessions of accepted Groups, and with prelaunch the Sessions
    of Groups started and waiting for the lease."""
    postfix = {"scored": scored_sessions}
    if prelaunch:
        postfix["prepared"] = prepared_sessions
    return postfix
