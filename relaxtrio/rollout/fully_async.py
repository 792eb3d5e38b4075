"""Fully async: weight versions, the staleness bound, and Groups waiting for weights.

With ``--fully-async`` Groups keep generating across steps, so a context may carry tokens
sampled by older weights than the policy that trains it. This module owns what bounds that
(docs/scheduling.md#fully-async):

* **Weight versions.** The engines run version ``n`` after ``n`` updates (labels
  ``step-<n>``, :func:`~relaxtrio.run.checkpoint.weight_version_name`); the weights they started
  with are the run's first version. :class:`WeightWindow` knows the version loaded now.
* **Staleness.** A sample's staleness is the version loaded when its step accepts it minus the
  oldest version that sampled any of its tokens. With ``--max-staleness S`` a Group with a
  sample staler than ``S`` is dropped (it is new demand) and counted in the step's
  ``stale_groups`` and ``stale_samples``.
* **Waiting for weights.** Between steps (from a step's close, through the update and the
  weight push, until the next step starts) a leased Group will be trained at step ``d`` or
  later (``d``: the step it was leased for, or the next step once its own has closed). Its
  tokens would be at least ``d - v`` versions stale when sampled by version ``v``, so it
  generates only while ``v >= d - S``; otherwise it is paused
  (:meth:`~relaxtrio.nursery.group.Group.pause`: its gate closed, its Sessions'
  ``--agent-timeout`` budgets paused) until newer weights load or the next step starts.
* **Running ahead.** :meth:`WeightWindow.steps_ahead`: after a step closes the rollout leases
  the demand of up to ``S + 1`` further steps (one without a bound), so it runs more than one
  step ahead of the trainer while Groups kept from earlier steps go on.
* **The weight push.** While the engines load new weights every request waits for them, so
  :meth:`WeightWindow.pushing` pauses the budgets of every leased Group for the push.
* **Closing short, carried debt.** A step need not wait for its stragglers: when a Group
  finishes, or at an idle heartbeat, and the Groups it still owes (with those an earlier
  partition owes) are no more than its straggling Groups (:func:`straggling`: leased, and
  every unfinished Session off the engine for ``straggler_s``, e.g. running a tool), it
  closes short (:func:`may_close_short`). The rollout moves on to the next partition, and the
  next Groups that finish pay the short one first
  (:class:`~relaxtrio.rollout.step_book.Partitions`); the trainer waits only for them
  (:meth:`~relaxtrio.rollout.pipeline.RolloutPipeline.settle`), not for the stragglers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

import attrs
import trio

from ..forest import TrainingSample
from ..nursery.group import Group

__all__ = ["WeightWindow", "backfill_ahead", "may_close_short", "straggling", "version_index"]

_STEP_VERSION = re.compile(r"step-(\d+)")


def version_index(label: str, start: int = 0) -> int:
    """The weight version a label names: ``step-<n>`` is ``n`` (updates applied); any other
    label is the weights the engines started with, version ``start``."""
    match = _STEP_VERSION.fullmatch(label)
    return int(match.group(1)) if match else start


@attrs.define(eq=False, kw_only=True)
class WeightWindow:
    """The weight version the engines run and the staleness bound the run keeps.

    Attributes:
        max_staleness: the most weight versions a trained sample may lag the policy
            (``--max-staleness``); None: no bound.
        start: the version the engines started with (the run's first step: 0, or the step a
            resumed run starts at).
        loaded: the version the engines run now (moved by :meth:`loaded_version`).
        gate: whether Groups wait for weights (``--fully-async``); otherwise only the
            staleness drop applies (partial rollout carries tokens across versions too).
    """

    max_staleness: int | None = None
    gate: bool = False
    start: int = 0
    loaded: int = 0

    def restart(self, version: int) -> None:
        """The engines start with version ``version`` (a resumed run's first step)."""
        self.start = self.loaded = version

    def oldest_version(self, sample: TrainingSample) -> int | None:
        """The oldest version that sampled a token of ``sample``; None when no span says."""
        versions = [version_index(span.version, self.start) for span in sample.weight_versions]
        return min(versions) if versions else None

    def staleness(self, sample: TrainingSample) -> int:
        """Versions between the oldest that sampled ``sample`` and the one loaded now (>= 0)."""
        oldest = self.oldest_version(sample)
        return 0 if oldest is None else max(self.loaded - oldest, 0)

    def stale_samples(self, group: Group) -> list[TrainingSample]:
        """The Group's samples staler than the bound (none without one)."""
        if self.max_staleness is None:
            return []
        return [s for session in group.sessions for s in session.samples
                if self.staleness(s) > self.max_staleness]

    def may_generate(self, due_step: int) -> bool:
        """Whether a Group to be trained at step ``due_step`` or later may sample now."""
        return self.max_staleness is None or self.loaded >= due_step - self.max_staleness

    def steps_ahead(self, steps_left: int | None) -> int:
        """How many steps past the one just closed the rollout leases Groups for: one more
        than the staleness bound (Groups further ahead could only wait for weights), one
        without a bound, never past the run's last step (``steps_left`` after the closed one;
        None: unbounded)."""
        ahead = 1 if self.max_staleness is None else self.max_staleness + 1
        return ahead if steps_left is None else max(min(ahead, steps_left), 0)

    def apply(self, groups: Iterable[Group], *, next_step: int) -> None:
        """Pauses the leased Groups that must wait for newer weights and resumes the others.

        Args:
            groups: resident train Groups (unleased and finished ones are left alone).
            next_step: the first step not yet closed: a Group leased for an earlier step is
                trained at this one at the earliest.
        """
        if not self.gate:
            return
        for group in groups:
            if not group.leased or group.finished:
                continue
            wait = not self.may_generate(max(group.rollout_id, next_step))
            if wait and not group.paused:
                group.pause()
            elif not wait and group.paused:
                group.resume()

    def release(self, groups: Iterable[Group]) -> None:
        """A step starts: every leased Group waiting for weights may generate again (a step's
        rollout never waits; what it accepts is still checked against the bound)."""
        if not self.gate:
            return
        for group in groups:
            if group.leased and group.paused and not group.finished:
                group.resume()

    @contextmanager
    def pushing(self, groups: Sequence[Group]) -> Iterator[None]:
        """Pauses the running budgets of the leased Groups' Sessions while new weights load
        (every request waits for them then) and restarts those afterwards unless their Group
        was paused meanwhile. Gates are not touched: the engines hold the requests themselves."""
        held = [(g, s) for g in groups if g.leased and not g.finished
                for s in g.sessions if s.budget.running]
        for _, session in held:
            session.budget.pause()
        try:
            yield
        finally:
            for group, session in held:
                if not group.paused or session.partial.protected:
                    session.budget.resume()

    def loaded_version(self, version: int, groups: Iterable[Group], *, next_step: int) -> None:
        """The engines now run ``version``: Groups it brings within the bound resume."""
        self.loaded = version
        self.apply(groups, next_step=next_step)


class Backfills(Protocol):
    """What :func:`backfill_ahead` needs of :class:`~relaxtrio.rollout.pipeline.RolloutPipeline`."""

    weights: WeightWindow

    def backfill(self, rollout_id: int, *, ahead: int = 1, final: bool = False) -> int: ...


def backfill_ahead(pipeline: Backfills, closed_id: int, *, steps_left: int | None) -> int:
    """Right after step ``closed_id`` closed, leases or starts the demand of the next
    :meth:`WeightWindow.steps_ahead` steps (``pipeline.backfill`` for each, nearest
    first; the run's last step as a final backfill), so the rollout runs that many steps ahead
    of the trainer.

    Args:
        pipeline: the run's pipeline (``--fully-async``).
        closed_id: the step that just closed.
        steps_left: steps the run has after ``closed_id`` (None: unbounded).

    Returns:
        Groups leased or started.
    """
    ahead = pipeline.weights.steps_ahead(steps_left)
    return sum(pipeline.backfill(closed_id + k, ahead=k, final=k == steps_left)
               for k in range(1, ahead + 1))


def straggling(group: Group, *, after_s: float) -> bool:
    """Whether a Group counts towards closing a step short: leased, in Runtime and generating
    for it (not paused, so it needs no newer weights to go on), not dropped or finished, and
    every Session still running has been off the engine for at least ``after_s`` seconds (trio
    clock; no generation in flight and not protected): its agent, or a tool, is working, and
    not merely between two requests or exiting."""
    if not group.in_runtime or group.paused or group.dropped or group.finished:
        return False
    since = [None if s.partial.protected else s.partial.idle_since for s in group.sessions if not s.ended]
    if not since or None in since:
        return False
    return trio.current_time() - max(t for t in since if t is not None) >= after_s


def may_close_short(debt: int, groups: Iterable[Group], weights: WeightWindow, *, next_step: int,
                    straggler_s: float) -> int:
    """Whether a fully async step may close before its target: the Groups still owed
    (``debt``: the step's and an earlier short partition's) are no more than the straggling
    ones among ``groups`` (:func:`straggling` after ``straggler_s`` seconds), and the Groups
    that will pay them may sample with the weights loaded now (they will be trained at
    ``next_step`` at the latest; with ``--max-staleness 0`` they wait for the update, which
    waits for them, so no step closes short).

    Returns:
        The straggling Groups when the step may close short, else 0.
    """
    if debt <= 0 or not weights.may_generate(next_step):
        return 0
    stragglers = sum(1 for g in groups if straggling(g, after_s=straggler_s))
    return stragglers if debt <= stragglers else 0
