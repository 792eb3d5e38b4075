"""The embedded engine's scheduler: waiting queue, continuous batching, abort, pause, weight updates.

One trio task (:meth:`Scheduler.run`) owns the running batch. Each loop iteration plans on the trio
thread (finalize aborts, retract, admit from the queue) and then makes exactly one worker-thread
call (``trio.to_thread.run_sync``) that drops rows, prefills admitted requests, runs one decode
step for the whole batch and samples. HTTP handlers never touch the batch: they change flags and
*kick* the loop, then wait on the request's ``done`` event or on a state change.

Semantics (those of SGLang 0.5.23):

- at most ``max_running_requests`` rows decode together; later requests wait in FIFO order;
- abort of a waiting request answers at once (``Abort in waiting queue``, with any partial output
  of a retracted request); a running request is stopped after the step in flight, so it may get
  one more token (docs/client-quirks.md#a-token-after-the-abort), and answers ``Aborted``;
- pause ``abort`` aborts everything; ``retract`` stops decoding and moves running requests back
  to the front of the queue keeping their ids (after continue they are re-prefilled, with the
  weights in force then); ``in_place`` stops decoding and keeps the KV cache. New requests wait
  while paused;
- ``update_weights_from_disk`` without a pause waits until every request submitted before it has
  finished, while requests submitted after it wait (writer preference,
  docs/client-quirks.md#weight-update-waits-for-in-flight-requests); while paused it
  loads at once. The version label of each token is recorded in ``weight_versions`` spans.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs
import trio

from ..sglang.wire import RequestError, SamplingParams
from ._batch import DecodeBatch
from ._limits import EngineLimits
from ._prefix_cache import PrefixCache
from ._request import (
    LockedTokenizer,
    Req,
    abort_reason,
    check_finished,
    error_reason,
    resolve_sampling,
    waiting_abort_reason,
)
from ._vision_inputs import EngineMedia
from ._weights import load_weights_from_disk
from .sampling import RowSampler

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["EngineLimits", "PauseMode", "Scheduler", "SchedulerStatistics"]

logger = logging.getLogger(__name__)

PauseMode = Literal["abort", "retract", "in_place"]


@attrs.frozen(kw_only=True)
class SchedulerStatistics:
    """A snapshot of the scheduler's counters (``statistics()``)."""

    num_running_reqs: int
    num_waiting_reqs: int
    max_batch_size_seen: int
    num_decode_steps: int
    num_generated_tokens: int
    num_cached_tokens: int
    num_prefill_tokens: int
    num_prefix_hit_tokens: int
    num_prefix_cache_tokens: int
    num_admitted_reqs: int  # requests admitted into the batch (first admission only)
    queue_time_s: float  # their seconds from arrival to admission, summed
    paused: bool
    weight_update_pending: bool
    weight_version: str


@attrs.define(kw_only=True)
class _Plan:
    drop: list[Req]
    admit: list[Req]
    clear: bool
    decode: bool
    weight_version: str


def _plain_kv_layers(model: PreTrainedModel) -> bool:
    """Whether every layer keeps all positions (no sliding window): then cached keys/values of
    a prefix are exactly what a prefill of it would compute."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)


class Scheduler:
    """Batches concurrent generations of one model; see the module docstring for semantics.

    Args:
        model: causal LM in eval mode (shared with the weight loader).
        tokenizer: its tokenizer (stop strings, EOS ids).
        limits: token limits.
        eos_ids: ids that stop generation unless ``ignore_eos``.
        weight_version: initial version label.
        prefix_cache_tokens: ids the prefix cache may hold (0 disables it); see
            :mod:`relaxtrio.engine._prefix_cache`.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        limits: EngineLimits,
        eos_ids: frozenset[int],
        weight_version: str = "default",
        prefix_cache_tokens: int = 0,
    ):
        self.model = model
        self.tokenizer = LockedTokenizer(tokenizer)
        self.limits = limits
        self.eos_ids = eos_ids
        self.weight_version = weight_version
        self.vocab_size = int(model.config.get_text_config().vocab_size)
        self._batch: DecodeBatch[Req] = DecodeBatch(model)
        self._prefix = PrefixCache(max_tokens=prefix_cache_tokens if _plain_kv_layers(model) else 0)
        self._waiting: deque[Req] = deque()
        self._by_rid: dict[str, Req] = {}
        self._paused = False
        self._pause_mode: PauseMode = "abort"
        self._barrier: set[Req] | None = None  # only these may be admitted (weight update drain)
        self._model_lock = trio.Lock()
        self._update_lock = trio.Lock()
        self._kick_event = trio.Event()
        self._kick_seq = 0
        self._parked = False
        self._parked_seq = -1
        self._changed = trio.Event()
        self._max_batch_size_seen = 0
        self._num_decode_steps = 0
        self._num_generated_tokens = 0
        self._num_admitted_reqs, self._queue_time_s = 0, 0.0

    # ---------------------------------------------------------------- state notifications
    def _kick(self) -> None:
        self._kick_seq += 1
        self._kick_event.set()

    def _notify(self) -> None:
        event, self._changed = self._changed, trio.Event()
        event.set()

    async def _wait_until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._changed.wait()

    async def wait_settled(self) -> None:
        """Wait until the loop has handled every change made up to now and has nothing to do.

        Once settled, nothing happens until the next submit, abort, pause, resume or weight
        update: a paused engine's waiting requests stay waiting and no token is generated, so
        tests can assert that something did *not* happen without sleeping.

        Cancellation:
            A plain wait; nothing to clean up.
        """
        target = self._kick_seq
        await self._wait_until(lambda: self._parked and self._parked_seq >= target)

    async def wait_statistics(self, predicate: Callable[[SchedulerStatistics], bool]) -> SchedulerStatistics:
        """Wait until ``predicate(self.statistics())`` holds and return that snapshot.

        Every change of a counter or flag in :class:`SchedulerStatistics` wakes the waiters
        (submit, finish, each loop iteration, pause, resume, weight updates).

        Cancellation:
            A plain wait; nothing to clean up.
        """
        while not predicate(stats := self.statistics()):
            await self._changed.wait()
        return stats

    @property
    def paused(self) -> bool:
        return self._paused

    def statistics(self) -> SchedulerStatistics:
        return SchedulerStatistics(
            num_running_reqs=len(self._batch),
            num_waiting_reqs=len(self._waiting),
            max_batch_size_seen=self._max_batch_size_seen,
            num_decode_steps=self._num_decode_steps,
            num_generated_tokens=self._num_generated_tokens,
            num_cached_tokens=self._batch.num_cached_tokens,
            num_prefill_tokens=self._prefix.num_prefill_tokens,
            num_prefix_hit_tokens=self._prefix.num_hit_tokens,
            num_prefix_cache_tokens=self._prefix.num_tokens,
            num_admitted_reqs=self._num_admitted_reqs,
            queue_time_s=self._queue_time_s,
            paused=self._paused,
            weight_update_pending=self._barrier is not None,
            weight_version=self.weight_version,
        )

    # ---------------------------------------------------------------- submission
    def submit(
        self,
        input_ids: Sequence[int],
        params: SamplingParams,
        *,
        rid: str | None = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        return_text_in_logprobs: bool = False,
        media: EngineMedia | None = None,
    ) -> Req:
        """Validate and enqueue one request (never blocks).

        ``input_ids`` are the ids the model runs on: for an image request, with every image
        placeholder already expanded to the image's feature count (``media`` holds the pixels);
        the context checks count these ids.

        Raises:
            RequestError: duplicate in-flight rid, context overflow (SGLang's texts), bad
                sampling values, out-of-vocabulary input ids.
        """
        rid = uuid.uuid4().hex if rid is None else rid
        if rid in self._by_rid:
            raise RequestError(f"Duplicate request ID detected: {rid}")
        cfg = resolve_sampling(self.limits, input_ids, params, vocab_size=self.vocab_size,
                               eos_ids=self.eos_ids)
        req = Req(
            rid=rid,
            input_ids=tuple(input_ids),
            sampling=cfg,
            sampler=RowSampler(cfg, top_logprobs_num=top_logprobs_num),
            return_logprob=return_logprob,
            top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs,
            media=media,
        )
        self._by_rid[rid] = req
        if cfg.max_new_tokens == 0:
            req.finish_reason = {"type": "length", "length": 0}
            self._finish(req)
            return req
        self._waiting.append(req)
        self._kick()
        self._notify()
        return req

    async def generate(self, input_ids: Sequence[int], params: SamplingParams, **kwargs: Any) -> Req:
        """Submit a request and wait until it finishes (normally or aborted).

        Raises:
            RequestError: as :meth:`submit`.

        Cancellation:
            A checkpoint. If cancelled before the request finished (client disconnect,
            shutdown), the request is aborted so its row is freed; nothing else is kept.
        """
        req = self.submit(input_ids, params, **kwargs)
        try:
            await req.done.wait()
        finally:
            if not req.done.is_set():
                self._abort_req(req)
        return req

    def _finish(self, req: Req) -> None:
        req.state = "finished"
        req.e2e_latency_s = time.perf_counter() - req.arrival_s
        if self._by_rid.get(req.rid) is req:
            del self._by_rid[req.rid]
        req.done.set()
        self._notify()

    # ---------------------------------------------------------------- abort
    def _abort_req(self, req: Req) -> None:
        if req.state == "waiting":
            self._waiting.remove(req)
            req.finish_reason = waiting_abort_reason()
            req.aborted_while_waiting = True
            self._finish(req)
        elif req.state == "running":
            req.abort_requested = True
            self._kick()

    def abort(self, rid: str) -> None:
        """Abort the in-flight request with exactly this rid; unknown rids are a no-op."""
        req = self._by_rid.get(rid)
        if req is not None:
            self._abort_req(req)

    def abort_all(self) -> None:
        """Abort every waiting and running request."""
        for req in list(self._by_rid.values()):
            self._abort_req(req)

    # ---------------------------------------------------------------- pause / weights
    async def pause(self, mode: PauseMode) -> None:
        """Stop generation until :meth:`resume`; see the module docstring for the modes.

        Cancellation:
            A checkpoint. The pause takes effect at once; only the wait for the loop to settle
            (the step in flight, aborted rows) is cancelled.
        """
        self._paused = True
        self._pause_mode = mode
        if mode == "abort":
            self.abort_all()
        self._kick()
        self._notify()
        await self.wait_settled()

    def resume(self) -> None:
        """Continue after :meth:`pause` (a no-op when not paused)."""
        self._paused = False
        self._kick()
        self._notify()

    def set_weight_version(self, new_version: str, *, abort_all: bool) -> None:
        """Relabel the weights; tokens generated from now on carry ``new_version``."""
        if abort_all:
            self.abort_all()
        self.weight_version = new_version
        self._notify()

    async def update_weights_from_disk(
        self, model_path: str, *, weight_version: str | None, abort_all: bool
    ) -> None:
        """Load ``model_path`` into the running model between steps.

        Raises:
            WeightLoadError: the checkpoint is unusable; the running weights are unchanged.

        Cancellation:
            A checkpoint while draining (nothing changed yet; the drain barrier is lifted).
            Once loading has started it runs to completion in a worker thread.
        """
        async with self._update_lock:
            if abort_all:
                self.abort_all()
            barrier = {req for req in self._by_rid.values() if not req.done.is_set()}
            self._barrier = barrier
            try:
                self._kick()
                self._notify()
                await self._wait_until(
                    lambda: self._paused or all(req.done.is_set() for req in barrier)
                )
                async with self._model_lock:
                    await trio.to_thread.run_sync(load_weights_from_disk, self.model, model_path)
                    self._prefix.clear()  # keys/values of the old weights
                if weight_version is not None:
                    self.weight_version = weight_version
            finally:
                self._barrier = None
                self._kick()
                self._notify()

    # ---------------------------------------------------------------- the loop
    def _plan(self) -> _Plan | None:
        drop: list[Req] = []
        for req in self._batch.rows:
            if req.abort_requested and req.state == "running":
                req.finish_reason = abort_reason()
                drop.append(req)
                self._finish(req)
        clear = False
        if self._paused and self._pause_mode == "retract" and len(self._batch) > len(drop):
            kept = [r for r in self._batch.rows if r.state == "running"]
            for req in reversed(kept):
                req.state = "waiting"
                req.num_retractions += 1
                self._waiting.appendleft(req)
            clear = True
        admit: list[Req] = []
        if not self._paused:
            room = self.limits.max_running_requests - (len(self._batch) - len(drop))
            for req in list(self._waiting):
                if len(admit) >= room:
                    break
                if self._barrier is None or req in self._barrier:
                    self._waiting.remove(req)
                    req.state = "running"
                    admit.append(req)
                    if not req.num_retractions:  # its first admission: it waited since arrival
                        self._num_admitted_reqs += 1
                        self._queue_time_s += time.perf_counter() - req.arrival_s
        decode = not self._paused and not clear
        if not (drop or admit or clear or (decode and len(self._batch) > len(drop))):
            return None
        return _Plan(
            drop=drop, admit=admit, clear=clear, decode=decode, weight_version=self.weight_version
        )

    def _iterate(self, plan: _Plan) -> list[Req]:
        """Worker-thread half of one iteration; returns the requests that finished in it."""
        batch = self._batch
        if plan.clear:
            batch.clear()
        else:
            self._keep_prefixes(plan.drop)  # aborted rows: a resumed request continues them
            batch.remove(plan.drop)
        finished: list[Req] = []
        joins = []
        for req in plan.admit:
            sequence = req.input_ids + tuple(req.output_ids)
            prefix = self._prefix.lookup(sequence) if req.media is None else None
            req.cached_tokens = 0 if prefix is None else prefix.length
            cache, logits, offset = batch.prefill(sequence, req.media, prefix)  # (V,)
            if req.media is None:
                layers = cache.layers
                self._prefix.insert(sequence, [l.keys for l in layers], [l.values for l in layers])
            req.append(req.sampler.choose(logits, len(req.output_ids)), plan.weight_version)
            self._num_generated_tokens += 1
            req.finish_reason = check_finished(req, self.tokenizer)
            if req.finish_reason is not None:
                finished.append(req)
            else:
                joins.append((req, cache, offset))
        batch.add(joins)
        if plan.decode and len(batch) > 0:
            self._max_batch_size_seen = max(self._max_batch_size_seen, len(batch))
            logits = batch.step([r.output_ids[-1] for r in batch.rows])  # (B, V)
            self._num_decode_steps += 1
            done_rows = []
            for req, row in zip(batch.rows, logits, strict=True):
                req.append(req.sampler.choose(row, len(req.output_ids)), plan.weight_version)
                self._num_generated_tokens += 1
                req.finish_reason = check_finished(req, self.tokenizer)
                if req.finish_reason is not None:
                    done_rows.append(req)
            self._keep_prefixes(done_rows)
            batch.remove(done_rows)
            finished.extend(done_rows)
        return finished

    def _keep_prefixes(self, rows: Sequence[Req]) -> None:
        """Store finishing rows' keys/values (all their ids but the last sampled one)."""
        if self._prefix.max_tokens <= 0:
            return
        for req in rows:
            if req.media is None and req in self._batch.rows:
                keys, values = self._batch.row_cache(req)
                sequence = (req.input_ids + tuple(req.output_ids))[: keys[0].shape[2]]
                self._prefix.insert(sequence, keys, values)

    def flush_cache(self) -> None:
        """Empty the prefix cache (``/flush_cache``)."""
        self._prefix.clear()
        self._notify()

    def _fail_batch(self, plan: _Plan) -> list[Req]:
        failed = [r for r in [*self._batch.rows, *plan.admit] if r.state == "running"]
        self._batch.clear()
        for req in failed:
            req.finish_reason = error_reason("Internal error in the embedded engine's model step.")
        return list(dict.fromkeys(failed))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the scheduling loop forever.

        Cancellation:
            Cancel it to stop the engine (abort requests first so their callers get answers).
            A step in flight finishes in its worker thread before the cancellation lands.
        """
        task_status.started()
        while True:
            seen = self._kick_seq
            plan = self._plan()
            if plan is None:
                self._parked, self._parked_seq = True, seen
                self._notify()
                await self._kick_event.wait()
                self._kick_event = trio.Event()
                self._parked = False
                continue
            async with self._model_lock:
                try:
                    finished = await trio.to_thread.run_sync(self._iterate, plan)
                except Exception:
                    # A failed model step leaves the batch in an unknown state: fail every
                    # request that was in it (HTTP 500 to their callers) and start afresh.
                    logger.exception("model step failed; failing the running requests")
                    finished = self._fail_batch(plan)
            for req in finished:
                failed = (req.finish_reason or {}).get("status_code") is not None
                if req.abort_requested and not failed:  # the abort came during the step
                    req.finish_reason = abort_reason()
                self._finish(req)
            self._notify()  # the batch, the queue and the token counters moved
