"""The resident rollout pipeline: Prepare → Runtime → Reward, across steps, in one long-lived nursery.

* **Capacity.** ``agentic_concurrency`` resident Group permits, shared by Prepare (agents started,
  waiting for the lease) and Runtime (leased). A permit is taken when a Group starts and given
  back when its last Session ended (completed or dropped), before its reward work.
* **Steps.** :meth:`RolloutPipeline.run_step` starts (or leases) Groups until
  ``rollout_batch_size`` of them completed and were scored; a dropped Group is logged, counted and
  replaced while the refill budget lasts. A Group the dynamic sampling filter drops is
  *filtered*: logged, counted, and replaced within its own budget (``filter_budget``). Accepted
  Groups keep their finishing order; Sessions keep sample order.
* **Step close.** Without partial rollout or fully async, the tail (leased Groups not needed) is
  dropped, and so are finished Groups the step did not need; both are counted in the step's
  ``dropped``. With ``partial_rollout`` resident Groups are paused: in-flight generations are aborted,
  their partial ids and logprobs parked, and they resume in the next step (protected Sessions
  first run to completion). The last step drops every resident Group (counted in ``dropped``);
  those a later step would have continued are :attr:`RolloutPipeline.run_end_groups`, whose
  prompts an end-of-run checkpoint requeues (:mod:`relaxtrio.rollout.resume`).
* **Fully async** (:mod:`relaxtrio.rollout.fully_async`). Groups keep generating while the
  trainer trains; :meth:`RolloutPipeline.backfill` leases or starts the coming steps' demand as
  soon as a step closed (the driver calls it before the update); a step may close short, leaving
  its stragglers to later steps, and :meth:`RolloutPipeline.settle` completes its batch with the
  next Groups to finish; the last step starts no over-sampling surplus.
* **Prelaunch.** Groups are started while permits are free; their first requests wait for the
  lease and their budgets do not run until then.
* **Watchdog, accounting.** :class:`~relaxtrio.rollout.watchdog.BarrierWatchdog` logs stuck
  first-request barriers. Each step logs ``event=accounting_start`` / ``accounting_end``,
  ``Dropped group``/``Filtered group`` lines, and ``event=idle_heartbeat`` every
  ``idle_heartbeat_s`` seconds without progress (:mod:`relaxtrio.rollout.accounting`).
* **Engine failure.** A turn that sees the engine itself fail wakes the step at once
  (:meth:`~relaxtrio.rollout.turns.EngineTurnHandler.wait_engine_failed`), which stops the run.

Evaluation runs over the same pipeline in :mod:`relaxtrio.rollout.eval`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from .._errors import BackendError
from ..config import AgentConfig, RolloutConfig
from ..nursery.agent import RolloutMode
from ..nursery.group import Group
from ..nursery.group import run_group as run_group_sessions
from ..nursery.session import SessionRegistry
from ..tracing import current_tracing
from .accounting import (
    ChangeSignal,
    GroupStages,
    PipelineSnapshot,
    group_stages,
    progress_postfix,
    wait_with_heartbeat,
)
from .dataset import Prompt, PromptStream
from .fully_async import WeightWindow, may_close_short
from .inflight import abort_inflight
from .rewards import score_rewards
from .step import StepResult, agentic_event
from .step_book import Partitions, StepBook
from .turns import EngineTurnHandler
from .watchdog import BarrierWatchdog

log = logging.getLogger(__name__)


@attrs.define(eq=False, kw_only=True)
class RolloutPipeline:
    """Runs rollout steps over resident Groups. Create with :func:`open_rollout_pipeline`.

    Attributes:
        watchdog: reports Groups stuck at the first-request barrier.
        weights: the weight version the engines run and the staleness bound
            (:mod:`relaxtrio.rollout.fully_async`).
    """

    config: RolloutConfig
    agent: AgentConfig
    registry: SessionRegistry
    handler: EngineTurnHandler
    base_url: str
    prompts: PromptStream
    nursery: trio.Nursery
    max_context_tokens: int | None = None
    server_template_kwargs: dict[str, Any] = attrs.field(factory=dict)
    eval_concurrency: int | None = None
    rollout_id: int = 0
    watchdog: BarrierWatchdog = attrs.field(init=False)
    weights: WeightWindow = attrs.field(init=False)
    _permits: trio.Semaphore = attrs.field(init=False)
    _resident: list[Group] = attrs.field(factory=list)
    _rewarding: list[Group] = attrs.field(factory=list)
    _reward_scopes: dict[Group, trio.CancelScope] = attrs.field(factory=dict)
    _finished: list[Group] = attrs.field(factory=list)
    _changes: ChangeSignal = attrs.field(factory=ChangeSignal)
    _group_seq: int = 0
    _backfilled: dict[int, int] = attrs.field(factory=dict)
    _partitions: Partitions = attrs.field(factory=Partitions)
    _run_end: tuple[Group, ...] = ()

    def __attrs_post_init__(self) -> None:
        self._permits = trio.Semaphore(self.config.concurrency)
        self.watchdog = BarrierWatchdog(warn_s=self.config.barrier_warn_s)
        self.weights = WeightWindow(max_staleness=self.config.max_staleness, gate=self.config.fully_async)

    # ------------------------------------------------------------------ bookkeeping
    @property
    def resident_groups(self) -> tuple[Group, ...]:
        """Train Groups holding a permit (started and not yet ended)."""
        return tuple(self._resident)

    @property
    def groups_use_cpu(self) -> bool:
        """Whether a resident train Group may be using the CPU now: leased (its agents run and
        the engine generates for them), or prelaunched with an agent still starting (before its
        first request); False when every resident Group waits for its lease with its agents
        idle (:attr:`Group.waiting_for_lease`), or none is resident. Safe to read from a worker
        thread (the update asks before each micro-batch): it reads a snapshot of the list."""
        return not all(g.waiting_for_lease for g in tuple(self._resident))

    @property
    def held_groups(self) -> tuple[Group, ...]:
        """Train Groups holding a prompt no step has accounted for yet: finished after their step
        closed (fully async), then scoring their rewards, then resident; what a run checkpoint
        cannot save."""
        return (*self._finished, *self._rewarding, *self._resident)

    @property
    def run_end_groups(self) -> tuple[Group, ...]:
        """Train Groups the last step's close dropped that a non-last close would have carried
        into the next step (finished or resident with partial rollout or fully async, prelaunched
        in any mode), in :attr:`held_groups` order; empty before the last step closed. Their
        prompts were drawn but never trained: an end-of-run checkpoint requeues them, so a run
        extended from it (a larger ``--num-rollout``) trains them as a longer run would."""
        return self._run_end

    def _carried_at_close(self) -> tuple[Group, ...]:
        """The not-dropped train Groups a non-last step close keeps (see :meth:`_close_step`)."""
        cfg = self.config
        if cfg.fully_async or cfg.partial_rollout:
            return tuple(g for g in self.held_groups if not g.dropped)
        return tuple(g for g in self._resident if not g.leased and not g.dropped)

    def group_stages(self) -> GroupStages:
        """The train Groups counted by stage (the one source of both snapshots of the pipeline)."""
        return group_stages(self._resident, [*self._rewarding, *self._finished])

    @property
    def barrier_warnings(self) -> int:
        """Barrier watchdog warnings logged so far."""
        return self.watchdog.num_warnings

    def _notify(self) -> None:
        self._changes.notify()

    def make_group(self, prompt: Prompt, mode: RolloutMode = "train", n: int | None = None, *,
                   max_context_tokens: int | None = None) -> Group:
        """Builds the Group (n Sessions) for one prompt (:meth:`Prompt.make_group`: already
        dropped when its input cannot be built); ``max_context_tokens`` replaces the pipeline's
        limit when given (eval's ``--eval-max-context-len``)."""
        self._group_seq += 1
        return prompt.make_group(f"{mode}:group_{self._group_seq:06d}", mode=mode,
                                 num_sessions=n or self.config.n_samples_per_prompt, timeout_s=self.agent.timeout_s,
                                 max_context_tokens=max_context_tokens or self.max_context_tokens)

    async def run_group(self, group: Group, *, sessions_ended: Callable[[], None] | None = None) -> None:
        """Runs a Group's Sessions to their end under the barrier watchdog (the caller leases),
        then its reward work.

        Args:
            group: the Group to run.
            sessions_ended: called once every Session ended, before the reward work: reward
                work is outside the resident capacity (docs/scheduling.md), so the caller gives
                the Group's permit back there.

        Cancellation:
            Cancelling terminates every agent of the Group (shielded, bounded) before returning.
        """
        self.nursery.start_soon(self.watchdog.watch, group)
        with current_tracing().group_span(group.group_id, mode=group.mode, num_sessions=len(group.sessions)):
            await run_group_sessions(group, agent=self.agent, base_url=self.base_url, registry=self.registry,
                                     server_template_kwargs=self.server_template_kwargs, lease=False,
                                     max_response_tokens=self.handler.config.max_response_tokens)
            if sessions_ended is not None:
                sessions_ended()
            with trio.CancelScope() as scope:
                self._reward_scopes[group] = scope
                try:
                    await score_rewards(group, self.config)
                finally:
                    del self._reward_scopes[group]

    def _end_residence(self, group: Group) -> None:
        """Gives a train Group's permit back (once): its Sessions ended, or it was cancelled."""
        if group in self._resident:
            self._resident.remove(group)
            self._rewarding.append(group)
            self._permits.release()
            self._notify()

    async def _group_task(self, group: Group) -> None:
        try:
            await self.run_group(group, sessions_ended=functools.partial(self._end_residence, group))
        finally:
            self._end_residence(group)
            if group in self._rewarding:
                self._rewarding.remove(group)
                self._finished.append(group)
            self._notify()

    def _start_train_group(self, *, leased: bool, rollout_id: int | None = None) -> Group:
        """Starts one train Group (a permit must already be held), leased for ``rollout_id``
        (default: the current step) when ``leased``."""
        group = self.make_group(next(self.prompts))
        if group.dropped:
            log.warning("Dropped group %s: %s", group.group_id, group.dropped_reason)
            self._permits.release()
            self._finished.append(group)
            return group
        self._resident.append(group)
        if leased:
            group.lease(self.rollout_id if rollout_id is None else rollout_id)
        self.nursery.start_soon(self._group_task, group)
        return group

    def _prelaunch_fill(self, steps_left: int | None) -> int:
        """Fills free permits with unleased Groups, at most ``steps_left`` steps' demand of them
        (None: no bound): with more permits than one step's demand, Groups prelaunched beyond
        the last step would only load the machine during it and be dropped at the end."""
        started = 0
        limit = None if steps_left is None else steps_left * self.config.demand
        while limit is None or sum(1 for g in self._resident if not g.leased) < limit:
            try:
                self._permits.acquire_nowait()
            except trio.WouldBlock:
                return started
            self._start_train_group(leased=False)
            started += 1
        return started

    def backfill(self, rollout_id: int, *, ahead: int = 1, final: bool = False) -> int:
        """Fully async: leases or starts step ``rollout_id``'s demand now, before that step runs.

        Called between a step and its update, so the next step's Groups generate while the
        trainer trains and the weights load (docs/scheduling.md#fully-async); else the engine
        idles through the update. Prelaunched Groups are leased first (oldest first),
        then new Groups are started while permits are free, up to ``ahead`` steps' demand plus
        the debt of a step that closed short, minus the Groups already leased or finished; the
        leases count against step ``rollout_id``'s start budget.

        Args:
            rollout_id: the step leased for (recorded on the Groups until they reach it).
            ahead: steps from the last closed one to ``rollout_id``.
            final: ``rollout_id`` is the run's last step, a final backfill: its share is its
                target, without the over-sampling surplus, so the Groups already held pay
                for it instead of being outrun by new ones and dropped at the run's end.

        Returns:
            Groups leased or started.
        """
        leased = sum(1 for g in self._resident if g.leased)
        last_share = self.config.rollout_batch_size if final else self.config.demand
        gap = ((ahead - 1) * self.config.demand + last_share + self._partitions.carried - leased
               - len(self._rewarding) - len(self._finished))
        prelaunched = [g for g in self._resident if not g.leased][:max(gap, 0)]
        for group in prelaunched:
            group.lease(rollout_id)
        done = len(prelaunched)
        while done < gap:
            try:
                self._permits.acquire_nowait()
            except trio.WouldBlock:
                break
            self._start_train_group(leased=True, rollout_id=rollout_id)
            done += 1
        self._backfilled[rollout_id] = self._backfilled.get(rollout_id, 0) + done
        self.weights.apply(self._resident, next_step=rollout_id - ahead + 1)
        return done

    # ------------------------------------------------------------------ steps
    async def run_step(self, rollout_id: int, *, last: bool = False,
                       steps_left: int | None = None) -> StepResult:
        """Runs one step until ``rollout_batch_size`` Groups were accepted (or refills ran out),
        paying a previous step's carried debt first; a fully async step may close short
        (docs/scheduling.md#fully-async; :meth:`settle` completes its batch).

        Args:
            rollout_id: the step number (recorded on response nodes and leases).
            last: the final step: nothing is prelaunched or kept resident afterwards.
            steps_left: steps the run has after this one (None: unbounded); prelaunch keeps at
                most that many steps' demand of unleased Groups.

        Raises:
            BackendError: the engine failed (unreachable, 5xx), or did not honour aborts at step
                close.
            RuntimeError: the step before the previous one still owes Groups (a third partition).

        Cancellation:
            Cancelling the step leaves resident Groups to the pipeline; closing the pipeline
            terminates every agent.
        """
        self.rollout_id = rollout_id
        step = StepBook.open(rollout_id, self.config, self.group_stages(),
                             warnings_before=self.barrier_warnings,
                             backfilled=self._backfilled.pop(rollout_id, 0),
                             final_backfill=last and self.config.fully_async)
        self._partitions.open(step)  # a previous partition that closed short is paid first
        for group in self._resident:  # carried into this step; those leased ahead keep their step
            if group.leased and group.rollout_id <= rollout_id:
                group.enter_step(rollout_id)
        self.weights.release(self._resident)  # fully async: waits for weights end with the step
        try:
            await self._fill_step(step, last=last, steps_left=steps_left)
        finally:
            step.bar.close()
        aborted = await self._close_step(step, last=last)
        if self.config.prelaunch and not last:
            self._prelaunch_fill(steps_left)
        return step.result(aborted=aborted, stages=self.group_stages(), barrier_warnings=self.barrier_warnings)

    async def _fill_step(self, step: StepBook, *, last: bool, steps_left: int | None) -> None:
        """Scores finished Groups (into a previous partition that owes first) and leases or
        starts new ones until the step has its target, or closes it short (fully async); once
        it closed short, only finished Groups pay it.

        Raises:
            BackendError: the engine failed.

        Cancellation:
            Waits for Groups to finish; a cancel leaves them running.
        """
        while True:
            seen = self._changes.version  # a change from here on ends the wait below at once
            await self._score_finished(step)
            if not step.debt:
                return
            if step.closed_at is None:
                self._lease_or_start(step)
                if self.config.prelaunch and not last:
                    self._prelaunch_fill(steps_left)
                    self._update_bar(step)
                if stragglers := self._short_credit(step, last=last):
                    self._partitions.close_short(step, stragglers)
                    return
            if self._finished:
                continue  # Groups dropped at creation: account for them at once
            if not self._rewarding and not any(g.leased and not g.paused for g in self._resident):
                self._partitions.write_off(step)
                return
            if self.handler.fatal_error is None:  # wait until a Group finished, or the engine failed
                await wait_with_heartbeat(functools.partial(self._changes.wait_past, seen),
                                          interval_s=self.config.idle_heartbeat_s,
                                          on_idle=functools.partial(self._heartbeat, step, last))
            self.raise_if_engine_failed()

    async def settle(self, result: StepResult) -> StepResult:
        """The whole batch of ``result``'s step (:meth:`StepBook.paid`): when it closed short,
        waits until the next Groups to finish paid its debt (a previous partition's first) while
        Groups leased for later steps go on; else ``result`` itself. The driver calls it after
        :func:`~relaxtrio.rollout.fully_async.backfill_ahead`, before the update.

        Raises:
            BackendError: the engine failed.
            HookError: the batch has no Group, and every Group the step dropped failed in a hook.
        """
        book = self._partitions.unsettled(result.rollout_id)
        if book is None:
            return result
        await self._fill_step(book, last=True, steps_left=0)
        return book.paid(result)

    def _heartbeat(self, step: StepBook, last: bool, idle_s: float) -> None:
        snapshot = PipelineSnapshot.from_stages(self.group_stages(), active_rollout_id=step.rollout_id,
                                                target=step.target, scored=len(step.accepted), idle_s=idle_s)
        log.info(agentic_event("rollout", "idle_heartbeat", **snapshot.fields()))
        if self._short_credit(step, last=last):  # a lone straggler: nothing else would wake the step
            self._notify()

    def _short_credit(self, step: StepBook, *, last: bool) -> int:
        """The straggling Groups that let a running fully async step close short now, else 0."""
        cfg = self.config
        return 0 if not cfg.fully_async or last or step.closed_at is not None else may_close_short(
            self._partitions.debt, self._resident, self.weights, next_step=step.rollout_id + 1, straggler_s=cfg.straggler_s)

    def _update_bar(self, step: StepBook) -> None:
        n = self.config.n_samples_per_prompt
        step.bar.set_postfix(progress_postfix(
            scored_sessions=len(step.accepted) * n, prelaunch=self.config.prelaunch,
            prepared_sessions=sum(len(g.sessions) for g in self._resident if not g.leased)))

    async def _score_finished(self, step: StepBook) -> None:
        """Files finished Groups in finishing order, each into the partition that owes first
        (:meth:`Partitions.payee`), until ``step`` owes none."""
        while self._finished and step.debt:
            payee = self._partitions.payee() or step
            if await payee.file(self._finished.pop(0), self.config, self.weights) is not None:
                self._update_bar(payee)

    def _lease_or_start(self, step: StepBook) -> None:
        """Leases prelaunched Groups, then starts new ones, up to the step's open demand."""
        leased = [g for g in self._resident if g.leased]
        demand = step.target if step.final_backfill else self.config.demand  # no surplus at the end
        gap = (demand + self._partitions.carried - len(step.accepted) - len(leased) - len(self._rewarding)
               - len(self._finished))
        for group in [g for g in self._resident if not g.leased][:max(min(gap, step.starts_left), 0)]:
            group.lease(step.rollout_id)
            gap -= 1
            step.starts_left -= 1
        while gap > 0 and step.starts_left > 0:
            try:
                self._permits.acquire_nowait()
            except trio.WouldBlock:
                break
            self._start_train_group(leased=True)
            gap -= 1
            step.starts_left -= 1

    def raise_if_engine_failed(self) -> None:
        """Stops the run loudly when the engine itself failed (docs/scheduling.md#engine-failures).

        Raises:
            BackendError: the first engine failure any turn saw.
        """
        error = self.handler.fatal_error
        if error is not None:
            raise BackendError(f"the generation engine failed; stopping the run: {error}") from error

    async def _watch_engine(self) -> None:
        """Wakes the running step when a turn sees the engine fail.

        Cancellation:
            Runs until the engine fails or the pipeline closes.
        """
        await self.handler.wait_engine_failed()
        self._notify()

    async def _close_step(self, step: StepBook, *, last: bool) -> int:
        """Closes the step as its mode says (docs/scheduling.md#step-close); every Group it
        drops, or finished and not needed, is added to ``step.dropped``.

        Returns:
            Generations aborted (partial rollout).
        """
        cfg = self.config
        if last:
            self._run_end = self._carried_at_close()
        if cfg.fully_async and not last:  # kept Groups sample for the next step from now on
            self.weights.apply(self._resident, next_step=step.rollout_id + 1)
            return 0
        if cfg.partial_rollout and not last:
            # Protected Sessions are not interrupted: let them finish first (docs/scheduling.md#protection).
            for group in [g for g in self._resident if g.leased]:
                await group.wait_unprotected()
            leased = [g for g in self._resident if g.leased]
            for group in leased:
                group.pause()
            return await abort_inflight(leased, self.handler.abort, self.config.abort_wait_s)
        tail = [g for g in self._resident if g.leased or last]
        for group in tail:
            group.drop("step closed before the group finished (not needed this step)")
        for group in self._rewarding:  # finished, but not needed: stop its reward work
            group.drop(f"step {step.rollout_id} closed before the group's reward work finished")
            self._reward_scopes[group].cancel()
            log.warning("Dropped group %s: %s", group.group_id, group.dropped_reason)
        tail += self._rewarding
        while any(not g.finished for g in tail) or self._rewarding:
            await self._changes.wait_past(self._changes.version)
        for group in self._finished:  # finished after the step had its target: not trained
            if not group.dropped:
                group.drop(f"not needed: step {step.rollout_id} already had its {step.target} groups")
                log.warning("Dropped group %s: %s", group.group_id, group.dropped_reason)
            step.dropped.append(group)
        self._finished.clear()
        return 0


@asynccontextmanager
async def open_rollout_pipeline(**kwargs: Any) -> AsyncIterator[RolloutPipeline]:
    """Opens a pipeline whose Groups live in a nursery that spans every step.

    Args:
        **kwargs: the :class:`RolloutPipeline` fields except ``nursery``.

    Cancellation:
        On exit every resident Group is cancelled: agents terminated (shielded, bounded), engine
        requests aborted, Sessions unregistered.
    """
    async with trio.open_nursery() as nursery:
        pipeline = RolloutPipeline(nursery=nursery, **kwargs)
        nursery.start_soon(pipeline._watch_engine)
        try:
            yield pipeline
        finally:
            nursery.cancel_scope.cancel()
