"""One rollout step's book: the Groups it accepted, dropped and filtered, and its two accounting lines.

:class:`StepBook` is what :class:`~relaxtrio.rollout.pipeline.RolloutPipeline` keeps while a step
runs. Opening it logs ``AGENTIC ROLLOUT event=accounting_start``; :meth:`StepBook.file` scores a
finished Group and files it (accepted, filtered, or dropped with its reason logged);
:meth:`StepBook.result` closes it into the step's
:class:`~relaxtrio.rollout.step.StepResult` and logs ``event=accounting_end``.

Hooks: a Group a user hook failed (:class:`~relaxtrio.rollout.hooks.HookError`) is dropped with
the exception in its reason and counted per hook; the run goes on, unless no Group of the step
was accepted and every one it dropped failed in a hook (a hook that fails every Group).

Budgets: a Group the dynamic sampling filter drops is new demand, replaced within the config's
``filter_budget`` (each one gives the step one more start); a Group the custom advantage
function filters, or one whose scoring fails, is dropped and replaced within the refill budget
the step opened with.

Partitions (fully async): a step that closes short keeps its book open, owing Groups;
:class:`Partitions` files the next finished Groups into it before the current step's, and
:meth:`StepBook.paid` gives its whole batch once paid (docs/scheduling.md#fully-async).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import attrs
import trio
from tqdm import tqdm

from .._errors import ExportError
from ..config import RolloutConfig
from ..nursery.group import Group
from .accounting import GroupStages
from .filters import FilterVerdict
from .hooks import HookError, hook_failure_kind
from .fully_async import WeightWindow
from .step import ScoredGroup, StepResult, agentic_event, score_group

__all__ = ["Partitions", "StepBook"]

log = logging.getLogger(__name__)


@attrs.define(eq=False, kw_only=True)
class StepBook:
    """Bookkeeping of the step being run. Create with :meth:`open`.

    Attributes:
        rollout_id: the step.
        target: Groups to accept (``rollout_batch_size``).
        starts_left: Group leases or starts the step may still make (demand plus refills).
        started: ``time.monotonic()`` at the step's start.
        warnings_before: barrier warnings logged before the step.
        bar: the progress bar of completed Sessions.
        accepted: scored Groups, in acceptance order.
        dropped: Groups dropped during the step (those the custom advantage function filtered
            included).
        filtered: every Group filtered during the step, with the verdict.
        accepted_at: ``time.monotonic()`` of each acceptance, in acceptance order.
        hook_failures: Groups dropped because a hook failed, per hook kind.
        final_backfill: the last step of a fully async run: it starts no over-sampling
            surplus, so the Groups it already holds fill its target before any new one.
        stale_groups: Groups dropped for a sample staler than ``--max-staleness`` (also in
            ``dropped``).
        stale_samples: the samples those Groups held that were staler than the bound.
        carried_debt: Groups the step still owed when it closed short (fully async); 0 when
            it closed with its target.
        closed_at: trio clock time of the short close, or None.
        paid_at: trio clock time the carried debt was paid, or None.
        written_off: nothing left could pay the step's debt; it is trained short.
    """

    rollout_id: int
    target: int
    starts_left: int
    started: float
    warnings_before: int
    bar: tqdm
    accepted: list[ScoredGroup] = attrs.field(factory=list)
    dropped: list[Group] = attrs.field(factory=list)
    filtered: list[FilterVerdict] = attrs.field(factory=list)
    accepted_at: list[float] = attrs.field(factory=list)
    hook_failures: Counter[str] = attrs.field(factory=Counter)
    final_backfill: bool = False
    stale_groups: int = 0
    stale_samples: int = 0
    carried_debt: int = 0
    closed_at: float | None = None
    paid_at: float | None = None
    written_off: bool = False

    @classmethod
    def open(cls, rollout_id: int, config: RolloutConfig, stages: GroupStages, *,
             warnings_before: int, backfilled: int, final_backfill: bool = False) -> StepBook:
        """Opens the book of step ``rollout_id`` and logs ``event=accounting_start``.

        Args:
            rollout_id: the step.
            config: the rollout settings (batch size, demand, refills, progress bar).
            stages: the pipeline's Groups by stage as the step opens.
            warnings_before: barrier warnings logged so far.
            backfilled: leases or starts already made for this step before it opened (fully
                async backfill); they count against its start budget.
            final_backfill: see the attribute.
        """
        started = time.monotonic()
        target, demand = config.rollout_batch_size, config.demand
        log.info(agentic_event("rollout", "accounting_start", rollout=rollout_id,
                               sessions=target * config.n_samples_per_prompt, groups=target, debt=target,
                               resident_groups=stages.resident, interrupted_groups=stages.interrupted,
                               final_backfill=final_backfill or None))
        bar = tqdm(total=target * config.n_samples_per_prompt, desc=f"Rollout {rollout_id} generation",
                   unit="session", disable=not config.show_progress, leave=False)
        starts = demand + (config.max_refills if config.max_refills is not None else demand)
        return cls(rollout_id=rollout_id, target=target, started=started, warnings_before=warnings_before,
                   starts_left=max(starts - backfilled, 0), bar=bar, final_backfill=final_backfill)

    @property
    def full(self) -> bool:
        """Whether the step accepted its target of Groups."""
        return len(self.accepted) >= self.target

    @property
    def debt(self) -> int:
        """Groups the step's batch still needs; 0 once it has its target, or once nothing left
        could pay (:meth:`write_off`)."""
        return 0 if self.written_off else max(self.target - len(self.accepted), 0)

    async def file(self, group: Group, config: RolloutConfig,
                   weights: WeightWindow | None = None) -> ScoredGroup | None:
        """Scores a finished Group and files it: accepted, filtered, or dropped.

        A Group dropped before it finished is filed as dropped without scoring. A Group with a
        sample staler than ``weights.max_staleness`` is dropped and counted in
        :attr:`stale_groups` / :attr:`stale_samples`. A Group the scoring refuses
        (:class:`ExportError`, a failed hook included) is dropped with the error as its reason.

        Returns:
            The accepted Group, or None when it was filtered or dropped.

        Cancellation:
            A checkpoint while a hook runs; the Group is then not filed.
        """
        outcome: ScoredGroup | FilterVerdict | None = None
        if not group.dropped and weights is not None:
            self._drop_if_stale(group, weights)
        if not group.dropped:
            try:
                outcome = await score_group(group, config)
            except ExportError as exc:
                group.dropped_reason = str(exc)
                log.warning("Dropped group %s: %s", group.group_id, exc,
                            exc_info=isinstance(exc, HookError) and exc.__cause__ is not None)
        if isinstance(outcome, ScoredGroup):
            self.accepted.append(outcome)
            self.accepted_at.append(time.monotonic())
            if self.closed_at is not None and self.paid_at is None and not self.debt:
                self.paid_at = trio.current_time()
            _record_scores(outcome)
            self.bar.update(len(group.sessions))
            return outcome
        if isinstance(outcome, FilterVerdict):
            self.filtered.append(outcome)
            if outcome.source == "dynamic_filter":  # new demand, within the filter budget
                log.info("Filtered 1 group %s: %s", group.group_id, outcome.message)
                if sum(v.source == "dynamic_filter" for v in self.filtered) <= config.filter_budget:
                    self.starts_left += 1
                return None
            group.dropped_reason = outcome.message
            log.warning("Filtered group %s: %s", group.group_id, outcome.message)
        self.dropped.append(group)
        kind = hook_failure_kind(group.dropped_reason)
        if kind is not None:
            self.hook_failures[kind] += 1
        return None

    def _drop_if_stale(self, group: Group, weights: WeightWindow) -> None:
        stale = weights.stale_samples(group)
        if not stale:
            return
        oldest = min(v for s in stale if (v := weights.oldest_version(s)) is not None)
        group.dropped_reason = (
            f"stale: {len(stale)} sample(s) sampled by weight version {oldest}, "
            f"{weights.loaded - oldest} versions behind the policy (--max-staleness "
            f"{weights.max_staleness})")
        log.warning("Dropped group %s: %s", group.group_id, group.dropped_reason)
        self.stale_groups += 1
        self.stale_samples += len(stale)

    def _check_hooks(self) -> None:
        failed = sum(self.hook_failures.values())
        if not self.accepted and failed and failed == len(self.dropped):
            kind = next(iter(self.hook_failures))
            raise HookError(kind, f"every Group of rollout {self.rollout_id} failed in a hook "  # type: ignore[arg-type]
                            f"({failed}); the first: {self.dropped[0].dropped_reason}")

    def _filed(self) -> dict[str, Any]:
        """The :class:`StepResult` fields the book's filings make (they grow while a step that
        closed short is paid)."""
        return dict(groups=tuple(self.accepted), dropped=tuple(self.dropped), filtered=tuple(self.filtered),
                    slowest_group_wait_s=(self.accepted_at[-1] - self.accepted_at[-2]
                                          if len(self.accepted_at) > 1 else 0.0),
                    hook_failures=dict(self.hook_failures), stale_groups=self.stale_groups,
                    stale_samples=self.stale_samples, carried_debt_groups=self.carried_debt)

    def result(self, *, aborted: int, stages: GroupStages, barrier_warnings: int) -> StepResult:
        """Closes the step: its result, logged as ``event=accounting_end``. A step that closed
        short is still paid afterwards (:meth:`paid` gives its whole batch).

        Args:
            aborted: generations aborted (and parked) at step close.
            stages: the pipeline's Groups by stage after the close.
            barrier_warnings: barrier warnings logged so far (the step's are those past
                :attr:`warnings_before`).

        Raises:
            HookError: the step accepted no Group, and every Group it dropped failed in a hook
                (checked when the step's batch is complete).
        """
        if not self.carried_debt:
            self._check_hooks()
        result = StepResult(
            rollout_id=self.rollout_id, rollout_s=time.monotonic() - self.started, aborted_requests=aborted,
            resident_groups=stages.resident, barrier_warnings=barrier_warnings - self.warnings_before,
            interrupted_groups=stages.interrupted, **self._filed())
        log.info(agentic_event(
            "rollout", "accounting_end", rollout=self.rollout_id, groups=len(result.groups),
            rows=sum(len(g.scored) for g in result.groups), debt=max(self.target - len(result.groups), 0),
            resident_groups=result.resident_groups, interrupted_groups=result.interrupted_groups,
            dropped_groups=len(self.dropped), filtered_groups=result.filtered_groups,
            stale_groups=self.stale_groups or None,  # only under --max-staleness drops
            carried_debt=self.carried_debt or None,  # only when the step closed short
            aborted_requests=aborted))
        return result

    def close_short(self, stragglers: int) -> None:
        """The step closes before its target (fully async): what it still owes is carried, and
        the next Groups that finish pay it (:class:`Partitions`)."""
        self.carried_debt, self.closed_at = self.debt, trio.current_time()
        log.info(agentic_event("rollout", "close_short", rollout=self.rollout_id, groups=len(self.accepted),
                               carried_debt=self.carried_debt, stragglers=stragglers))

    def write_off(self, why: str) -> None:
        """Nothing is left that could pay the step's debt (``why``, logged): it is trained short."""
        if self.debt:
            log.warning("rollout %d ends with %d of %d groups: %s", self.rollout_id, len(self.accepted),
                        self.target, why)
        self.written_off = True

    def paid(self, result: StepResult) -> StepResult:
        """The result of a step that closed short, once its debt is paid (or written off): its
        whole batch, with :attr:`StepResult.debt_wait_s` (trio clock seconds from the short
        close to the payment, or to now when written off); logged as ``event=debt_paid``.

        Raises:
            HookError: the batch has no Group, and every Group the step dropped failed in a hook.
        """
        if self.closed_at is None:
            return result
        self._check_hooks()
        wait_s = (trio.current_time() if self.paid_at is None else self.paid_at) - self.closed_at
        log.info(agentic_event("rollout", "debt_paid", rollout=self.rollout_id, groups=len(self.accepted),
                               carried_debt=self.carried_debt, unpaid=self.target - len(self.accepted),
                               wait_s=f"{wait_s:.1f}"))
        return attrs.evolve(result, debt_wait_s=wait_s, **self._filed())


@attrs.define(eq=False)
class Partitions:
    """The open partitions (steps' batches) of the rollout: the current step's and, while it
    still owes Groups after closing short, the one before it. Finished Groups pay the previous
    partition first (:meth:`payee`); opening a third partition while the previous one owes is
    refused (docs/scheduling.md#closing-short).

    Attributes:
        previous: the partition before :attr:`current` while it owes Groups after closing
            short, else None.
        current: the latest partition opened, or None before the first step.
    """

    previous: StepBook | None = None
    current: StepBook | None = None
    _unsettled: dict[int, StepBook] = attrs.field(factory=dict)

    def open(self, book: StepBook) -> None:
        """Opens ``book``'s partition; the current one becomes the previous when it closed
        short and still owes (a step that ended otherwise owes nothing more).

        Raises:
            RuntimeError: the previous partition still owes Groups (a third would open), or
                ``book``'s step is already open.
        """
        if self.previous is not None and self.previous.debt:
            raise RuntimeError(
                f"rollout {self.previous.rollout_id}'s partition still owes {self.previous.debt} "
                f"group(s): it must be paid before rollout {book.rollout_id}'s opens (at most the "
                "previous and the current partition are open)")
        if self.current is not None and self.current.rollout_id == book.rollout_id:
            raise RuntimeError(f"rollout {book.rollout_id}'s partition is already open")
        current = self.current
        self.previous = current if current is not None and current.closed_at is not None and current.debt else None
        self.current = book

    @property
    def debt(self) -> int:
        """Groups the open partitions still owe together (the running step's included)."""
        return sum(b.debt for b in (self.previous, self.current) if b is not None)

    @property
    def carried(self) -> int:
        """Groups the partitions that closed short still owe (paid before any new demand)."""
        return sum(b.debt for b in (self.previous, self.current) if b is not None and b.closed_at is not None)

    def payee(self) -> StepBook | None:
        """The partition the next finished Group is filed into: the previous while it owes,
        else the current while it owes; None when neither owes."""
        for book in (self.previous, self.current):
            if book is not None and book.debt:
                return book
        return None

    def close_short(self, book: StepBook, stragglers: int) -> None:
        """``book``'s step closes short (:meth:`StepBook.close_short`); :meth:`unsettled` gives
        it back once."""
        book.close_short(stragglers)
        self._unsettled[book.rollout_id] = book

    def unsettled(self, rollout_id: int) -> StepBook | None:
        """The book of step ``rollout_id`` when it closed short and was not asked for yet."""
        return self._unsettled.pop(rollout_id, None)

    def write_off(self, step: StepBook) -> None:
        """Nothing is left that could pay ``step`` (open) or the previous partition: both are
        trained short."""
        for book in {id(b): b for b in (self.previous, step) if b is not None}.values():
            book.write_off("nothing left that could pay its carried debt" if book.carried_debt
                           else "refill budget exhausted")


def _record_scores(scored: ScoredGroup) -> None:
    """Adds a ``scored`` event (reward, advantage) per context to its Session's timeline."""
    sessions = {s.session_id: s for s in scored.group.sessions}
    for item in scored.scored:
        session = sessions.get(item.sample.session_id)
        if session is not None:
            session.timeline.add("scored", item.reward, item.advantage)
