"""The resident rollout pipeline: Prepare → Runtime → Reward, across steps, in one long-lived nursery.

* **Capacity.** ``agentic_concurrency`` resident Group permits, shared by Prepare (agents started,
  waiting for the lease) and Runtime (leased). A permit is taken when a Group starts and given
  back when its last Session ended (completed or dropped).
* **Steps.** :meth:`RolloutPipeline.run_step` starts (or leases) Groups until
  ``rollout_batch_size`` of them completed and were scored; a dropped Group is logged, counted and
  replaced while the refill budget lasts. Accepted Groups keep their finishing order; Sessions keep
  sample order.
* **Step close.** Without partial rollout or fully async, the tail (leased Groups not needed) is
  dropped. With ``partial_rollout`` resident Groups are paused: in-flight generations are aborted,
  their partial ids and logprobs parked, and they resume in the next step (protected Sessions
  first run to completion). With ``fully_async`` Groups keep generating while the trainer trains.
* **Prelaunch.** Groups are started while permits are free; their first requests wait for the
  lease and their budgets do not run until then.
* **Barrier watchdog.** A Group that waits longer than ``barrier_warn_s`` at the first-request
  barrier is reported, naming the Sessions that have not sent their first request and how long
  each has run: a deadlock (for example an external executor with too few slots) is a log line,
  never a silent hang.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
from tqdm import tqdm

from .._errors import BackendError, ExportError, InvalidRequestError
from ..config import AgentConfig, RolloutConfig
from ..forest import SessionForest
from ..nursery.agent import ActiveBudget, RolloutMode
from ..nursery.group import Group, run_group
from ..nursery.session import Session, SessionRegistry, new_session_id
from .dataset import Prompt, PromptStream
from .step import ScoredGroup, StepResult, agentic_event, score_group
from .turns import EngineTurnHandler

log = logging.getLogger(__name__)

_ABORT_RESEND_S = 1.0  # an abort can arrive before its request; re-send at most this often


@attrs.frozen(kw_only=True)
class EvalDataset:
    """One evaluation dataset.

    Attributes:
        name: metric prefix (``eval/<name>/...``).
        prompts: its rows.
        n_samples_per_prompt: Sessions per eval Group (G_d of the capacity formula).
    """

    name: str
    prompts: tuple[Prompt, ...]
    n_samples_per_prompt: int = 1


@attrs.define(eq=False, kw_only=True)
class RolloutPipeline:
    """Runs rollout steps and evals over resident Groups. Create with :func:`open_rollout_pipeline`."""

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
    barrier_warnings: int = 0
    _permits: trio.Semaphore = attrs.field(init=False)
    _resident: list[Group] = attrs.field(factory=list)
    _eval_groups: list[Group] = attrs.field(factory=list)
    _finished: list[Group] = attrs.field(factory=list)
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _warned_at: dict[str, float] = attrs.field(factory=dict)
    _group_seq: int = 0

    def __attrs_post_init__(self) -> None:
        self._permits = trio.Semaphore(self.config.concurrency)

    # ------------------------------------------------------------------ bookkeeping
    @property
    def resident_groups(self) -> tuple[Group, ...]:
        """Train Groups holding a permit (started and not yet ended)."""
        return tuple(self._resident)

    @property
    def held_groups(self) -> tuple[Group, ...]:
        """Train Groups holding a prompt no step has accounted for yet: finished after their step
        closed (fully async), then resident; what a run checkpoint cannot save."""
        return (*self._finished, *self._resident)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _wait_change(self) -> None:
        await self._changed.wait()

    def make_group(self, prompt: Prompt, mode: RolloutMode = "train", n: int | None = None) -> Group:
        """Builds the Group (n Sessions) for one prompt.

        A prompt whose input cannot be built (e.g. an image file that disappeared) gives a Group
        that is already dropped, with the reason; the caller does not run it.
        """
        self._group_seq += 1
        group = Group(group_id=f"{mode}:group_{self._group_seq:06d}", mode=mode,
                      prompt_index=prompt.index)
        try:
            payload = prompt.session_input()
        except InvalidRequestError as exc:
            group.dropped_reason = f"prompt {prompt.index} cannot be used: {exc}"
            return group
        for i in range(n or self.config.n_samples_per_prompt):
            session_id = new_session_id()
            group.sessions.append(Session(
                session_id=session_id, group=group, index=i,
                input_payload=copy.deepcopy(payload), dataset_metadata=dict(prompt.metadata),
                forest=SessionForest(session_id, max_context_tokens=self.max_context_tokens),
                budget=ActiveBudget(total_s=self.agent.timeout_s),
            ))
        return group

    async def _group_task(self, group: Group, release: trio.Semaphore) -> None:
        try:
            await run_group(group, agent=self.agent, base_url=self.base_url, registry=self.registry,
                            server_template_kwargs=self.server_template_kwargs, lease=False)
        finally:
            release.release()
            if group in self._resident:
                self._resident.remove(group)
                self._finished.append(group)
            if group in self._eval_groups:
                self._eval_groups.remove(group)
            self._notify()

    def _start_train_group(self, *, leased: bool) -> Group:
        """Starts one train Group (a permit must already be held)."""
        group = self.make_group(next(self.prompts))
        if group.dropped:
            log.warning("Dropped group %s: %s", group.group_id, group.dropped_reason)
            self._permits.release()
            self._finished.append(group)
            return group
        self._resident.append(group)
        if leased:
            group.lease(self.rollout_id)
        self.nursery.start_soon(self._group_task, group, self._permits)
        return group

    def _prelaunch_fill(self) -> int:
        started = 0
        while True:
            try:
                self._permits.acquire_nowait()
            except trio.WouldBlock:
                return started
            self._start_train_group(leased=False)
            started += 1

    # ------------------------------------------------------------------ steps
    async def run_step(self, rollout_id: int, *, last: bool = False) -> StepResult:
        """Runs one step until ``rollout_batch_size`` Groups were accepted (or refills ran out).

        Args:
            rollout_id: the step number (recorded on response nodes and leases).
            last: the final step: nothing is prelaunched or kept resident afterwards.

        Raises:
            BackendError: the engine failed (unreachable, 5xx), or did not honour aborts at step
                close.

        Cancellation:
            Cancelling the step leaves resident Groups to the pipeline; closing the pipeline
            terminates every agent.
        """
        cfg = self.config
        started = time.monotonic()
        self.rollout_id = rollout_id
        self.handler.rollout_id = rollout_id
        warnings_before = self.barrier_warnings
        target, demand = cfg.rollout_batch_size, cfg.demand
        starts_left = demand + (cfg.max_refills if cfg.max_refills is not None else demand)
        log.info(agentic_event("rollout", "accounting_start", rollout=rollout_id,
                               sessions=target * cfg.n_samples_per_prompt, groups=target,
                               resident=len(self._resident)))
        accepted: list[ScoredGroup] = []
        dropped: list[Group] = []
        for group in self._resident:
            if group.paused:
                group.resume(rollout_id)
        bar = tqdm(total=target * cfg.n_samples_per_prompt, desc=f"Rollout {rollout_id} generation",
                   unit="session", disable=not cfg.show_progress, leave=False)
        try:
            while True:
                while self._finished and len(accepted) < target:
                    group = self._finished.pop(0)
                    if not group.dropped:
                        try:
                            accepted.append(score_group(group, cfg))
                            bar.update(len(group.sessions))
                            bar.set_postfix(scored=len(accepted) * cfg.n_samples_per_prompt)
                            continue
                        except ExportError as exc:
                            group.dropped_reason = str(exc)
                            log.warning("Dropped group %s: %s", group.group_id, exc)
                    dropped.append(group)
                if len(accepted) >= target:
                    break
                leased = [g for g in self._resident if g.leased]
                gap = demand - len(accepted) - len(leased) - len(self._finished)
                for group in [g for g in self._resident if not g.leased]:
                    if gap <= 0 or starts_left <= 0:
                        break
                    group.lease(rollout_id)
                    gap -= 1
                    starts_left -= 1
                while gap > 0 and starts_left > 0:
                    try:
                        self._permits.acquire_nowait()
                    except trio.WouldBlock:
                        break
                    self._start_train_group(leased=True)
                    gap -= 1
                    starts_left -= 1
                if cfg.prelaunch and not last:
                    self._prelaunch_fill()
                if self._finished:
                    continue  # Groups dropped at creation: account for them at once
                if not any(g.leased for g in self._resident):
                    log.warning("rollout %d ends with %d of %d groups: refill budget exhausted",
                                rollout_id, len(accepted), target)
                    break
                with trio.move_on_after(1.0):
                    await self._wait_change()
                self._raise_engine_failure()
        finally:
            bar.close()
        aborted = await self._close_step(last=last)
        if cfg.prelaunch and not last:
            self._prelaunch_fill()
        result = StepResult(
            rollout_id=rollout_id, groups=tuple(accepted), dropped=tuple(dropped),
            rollout_s=time.monotonic() - started, aborted_requests=aborted,
            resident_groups=len(self._resident), barrier_warnings=self.barrier_warnings - warnings_before,
        )
        log.info(agentic_event(
            "rollout", "accounting_end", rollout=rollout_id, groups=len(result.groups),
            rows=len(result.samples), debt=max(target - len(result.groups), 0),
            dropped_groups=len(dropped), resident_groups=len(self._resident),
            aborted_requests=aborted))
        return result

    def _raise_engine_failure(self) -> None:
        """Stops the run loudly when the engine itself failed (docs/scheduling.md#engine-failures).

        Raises:
            BackendError: the first engine failure any turn saw.
        """
        error = self.handler.fatal_error
        if error is not None:
            raise BackendError(f"the generation engine failed; stopping the run: {error}") from error

    async def _close_step(self, *, last: bool) -> int:
        cfg = self.config
        if cfg.fully_async and not last:
            return 0
        if cfg.partial_rollout and not last:
            # Protected Sessions are not interrupted: let them finish first (docs/scheduling.md#protection).
            while any(g.leased and g.protected for g in self._resident):
                with trio.move_on_after(0.5):
                    await self._wait_change()
            leased = [g for g in self._resident if g.leased]
            for group in leased:
                group.pause()
            return await self._abort_inflight(leased)
        tail = [g for g in self._resident if g.leased or last]
        for group in tail:
            group.drop("step closed before the group finished (not needed this step)")
        while any(not g.finished for g in tail):
            await self._wait_change()
        self._finished.clear()
        return 0

    async def _abort_inflight(self, groups: Sequence[Group]) -> int:
        """Aborts the engine requests of paused Sessions and waits for them to come back.

        An abort is done only when the original generate call returned (SGLang acknowledges an
        abort before it happens, and may not know a rid whose request is still on the wire), so
        aborts are re-sent until every generation returned or ``abort_wait_s`` passed.
        """
        sessions = [s for g in groups for s in g.sessions if not s.protected]
        aborted: set[str] = set()
        last_sent: dict[str, float] = {}
        deadline = trio.current_time() + self.config.abort_wait_s
        while True:
            rids = {rid for s in sessions for rid in s.inflight_rids}
            if not rids:
                return len(aborted)
            now = trio.current_time()
            if now > deadline:
                raise BackendError(
                    f"engine did not return {len(rids)} aborted generations within "
                    f"{self.config.abort_wait_s:g} s: {sorted(rids)[:4]}"
                )
            for rid in sorted(rids):
                if now - last_sent.get(rid, -math.inf) >= _ABORT_RESEND_S:
                    last_sent[rid] = now
                    await self.handler.client.abort(rid)
            aborted |= rids
            await trio.sleep(0.05)

    # ------------------------------------------------------------------ eval
    async def run_eval(self, datasets: Sequence[EvalDataset]) -> dict[str, float]:
        """Runs each eval dataset in turn (datasets serially, Groups concurrently).

        Per dataset d, at most ``C_d = agentic_eval_concurrency or ceil(T / G_d)`` eval Groups
        run at once (T = agentic_concurrency × n_samples_per_prompt). Train Groups stay as they
        are: paused (partial rollout), generating (fully async) or prelaunched.

        Returns:
            ``eval/<name>/reward_mean``, ``.../num_samples`` and ``.../dropped_groups`` per dataset.
        """
        total_train = self.config.concurrency * self.config.n_samples_per_prompt
        metrics: dict[str, float] = {}
        for dataset in datasets:
            g = dataset.n_samples_per_prompt
            limit = trio.Semaphore(self.eval_concurrency or max(math.ceil(total_train / g), 1))
            groups: list[Group] = []
            async with trio.open_nursery() as nursery:
                for prompt in dataset.prompts:
                    await limit.acquire()
                    group = self.make_group(prompt, "eval", g)
                    groups.append(group)
                    if group.dropped:
                        limit.release()
                        continue
                    self._eval_groups.append(group)
                    group.lease(self.rollout_id)
                    nursery.start_soon(self._group_task, group, limit)
            self._raise_engine_failure()
            rewards: list[float] = []
            dropped = 0
            for group in groups:
                try:
                    rewards.extend(score_group(group, self.config).rewards if not group.dropped else ())
                    dropped += group.dropped
                except ExportError as exc:
                    log.warning("eval group %s not scored: %s", group.group_id, exc)
                    dropped += 1
            prefix = f"eval/{dataset.name}"
            metrics[f"{prefix}/reward_mean"] = sum(rewards) / len(rewards) if rewards else float("nan")
            metrics[f"{prefix}/num_samples"] = float(len(rewards))
            metrics[f"{prefix}/dropped_groups"] = float(dropped)
        return metrics

    # ------------------------------------------------------------------ watchdog
    async def watch_barriers(self) -> None:
        """Logs Groups stuck at the first-request barrier longer than ``barrier_warn_s``.

        Cancellation:
            Runs until cancelled (with the pipeline).
        """
        warn_s = self.config.barrier_warn_s
        period = min(max(warn_s / 4, 0.05), 5.0)
        while True:
            await trio.sleep(period)
            now = trio.current_time()
            for group in [*self._resident, *self._eval_groups]:
                if group.finished or group.barrier_passed or group.started_at is None:
                    continue
                waited = now - group.started_at
                last = self._warned_at.get(group.group_id)
                if waited < warn_s or (last is not None and now - last < warn_s):
                    continue
                self._warned_at[group.group_id] = now
                self.barrier_warnings += 1
                missing = ", ".join(
                    f"session {s.index} {s.session_id} (running {waited:.1f} s, no request yet)"
                    for s in group.missing_first_requests()
                )
                log.warning(agentic_event(
                    "rollout", "barrier_wait", group=group.group_id, mode=group.mode,
                    waited_s=f"{waited:.1f}", leased=group.leased) + f" missing: {missing}")


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
        nursery.start_soon(pipeline.watch_barriers)
        try:
            yield pipeline
        finally:
            nursery.cancel_scope.cancel()
