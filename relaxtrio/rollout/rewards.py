"""Rewards of a finished Group: the custom reward model (sync or async, per sample or per Group),
and the reward metrics (raw reward, reward-object and export-metadata helper fields, pass rates).

Reward model (``--custom-rm-path``; docs/export-and-credit.md#reward-models):

* **ordinary RM**: ``fn(sample) -> reward`` for every exported sample whose agent wrote no
  reward; samples carrying an agent reward are not re-scored. Skipped for train Groups with
  custom advantage (the credit comes from the custom function).
* **Group RM** (``--group-rm``): ``fn(samples) -> [reward, ...]``, one call per Group over the
  flattened samples in Session order, then export order; it writes every sample's reward.

A reward is a finite number or an object (a mapping with the ``--reward-key`` primary value and
numeric helper fields). Either hook may have relaxtrio's or Relax's signature (``fn(args,
sample)``, ``fn(args, samples)``), and be a plain function (run in a worker thread, so a slow
scorer never blocks the trio loop) or an ``async def`` (awaited; ordinary RM calls of one Group
then run concurrently); see :mod:`relaxtrio.rollout.hooks`. A hook that raises, or answers in
the wrong shape, drops the Group with the reason (the Group's agents did their work; the user's
scorer did not).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import attrs
import trio

from .._errors import ExportError
from ..config import RolloutConfig
from ..forest import TrainingSample
from ..nursery.group import Group
from .advantages import scalar_reward
from .hooks import HookError, HookKind, call_hook, is_async_hook

__all__ = [
    "METADATA_METRIC_SKIP",
    "metadata_metrics",
    "passrate_metrics",
    "reward_metrics",
    "score_rewards",
    "summary_metrics",
]

log = logging.getLogger(__name__)

METADATA_METRIC_SKIP: Final = frozenset({
    "agentic_trace", "id", "index", "sample_index", "group_index", "start_rollout_id", "rollout_turns",
})
"""Top-level export metadata fields that are identifiers or bookkeeping, never metrics."""


def _check_reward(value: Any, where: str, kind: HookKind) -> Any:
    """A reward model's answer: a finite number or an object (mapping with string keys)."""
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return dict(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise HookError(kind, f"{where} must return a finite number or a reward object, got {value!r}")
    return float(value)


async def score_rewards(group: Group, config: RolloutConfig) -> None:
    """Writes reward-model rewards into a finished Group's samples.

    Replaces entries of ``session.samples`` with copies carrying the new ``reward``. Does nothing
    without ``config.custom_rm`` or for a dropped Group. On a hook failure the Group is dropped
    (``group.drop``) with the reason, and a warning is logged.

    Args:
        group: a Group whose Sessions have ended.
        config: ``custom_rm``, ``group_rm`` and ``custom_advantage`` decide what runs.

    Cancellation:
        A checkpoint. A cancel leaves the rewards written so far; a sync hook already running in
        its worker thread finishes there (its result is discarded).
    """
    fn = config.custom_rm
    if fn is None or group.dropped:
        return
    try:
        if config.group_rm:
            await _score_group_rm(group, fn, config.hook_args)
        elif not (group.mode == "train" and config.custom_advantage is not None):
            await _score_each(group, fn, config.hook_args)
    except HookError as exc:
        group.drop(str(exc))
        log.warning("Dropped group %s: %s", group.group_id, group.dropped_reason,
                    exc_info=exc.__cause__ is not None)


async def _score_group_rm(group: Group, fn: Callable[..., Any], hook_args: Any) -> None:
    slots = [(session, i) for session in group.sessions for i in range(len(session.samples))]
    samples = [session.samples[i] for session, i in slots]
    rewards = await call_hook(fn, "group_reward", samples, hook_args=hook_args)
    if not isinstance(rewards, (list, tuple)) or len(rewards) != len(samples):
        got = f"{type(rewards).__name__}" + (f" of {len(rewards)}" if isinstance(rewards, (list, tuple)) else "")
        raise HookError("group_reward", f"the group reward model must return a list of {len(samples)} "
                        f"rewards (one per exported sample, Session order then export order), got {got}")
    for k, ((session, i), value) in enumerate(zip(slots, rewards, strict=True)):
        reward = _check_reward(value, f"the group reward model (item {k})", "group_reward")
        session.samples[i] = attrs.evolve(session.samples[i], reward=reward)


async def _score_each(group: Group, fn: Callable[..., Any], hook_args: Any) -> None:
    todo = [(session, i) for session in group.sessions
            for i, sample in enumerate(session.samples) if sample.reward is None]

    async def one(session: Any, i: int) -> None:
        value = await call_hook(fn, "reward", session.samples[i], hook_args=hook_args)
        reward = _check_reward(value, f"the reward model (session {session.index})", "reward")
        session.samples[i] = attrs.evolve(session.samples[i], reward=reward)

    if is_async_hook(fn):
        errors: list[Exception] = []

        async def guarded(session: Any, i: int) -> None:
            try:
                await one(session, i)
            except Exception as exc:  # noqa: BLE001 (re-raised after the siblings finish, unwrapped)
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            for session, i in todo:
                nursery.start_soon(guarded, session, i)
        if errors:
            raise errors[0]
    else:  # one worker thread at a time: a plain scorer need not be thread-safe
        for session, i in todo:
            await one(session, i)


# ---------------------------------------------------------------------------- metrics


def summary_metrics(prefix: str, values: Sequence[float]) -> dict[str, float]:
    """``<prefix>/mean``, ``/median``, ``/max`` and ``/min`` of a non-empty list of numbers."""
    return {
        f"{prefix}/mean": math.fsum(values) / len(values),
        f"{prefix}/median": float(statistics.median(values)),
        f"{prefix}/max": float(max(values)),
        f"{prefix}/min": float(min(values)),
    }


def _numbers(value: Any) -> list[float] | None:
    """A finite number, or a list of them (flattened), as floats; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return [float(value)] if math.isfinite(value) else None
    if isinstance(value, (list, tuple)) and value:
        out: list[float] = []
        for item in value:
            numbers = _numbers(item)
            if numbers is None:
                return None
            out.extend(numbers)
        return out
    return None


def _collect(records: Iterable[Mapping[str, Any]], skip: Callable[[str], bool]) -> dict[str, list[float]]:
    fields: dict[str, list[float]] = {}
    for record in records:
        for key, value in record.items():
            if not isinstance(key, str) or skip(key):
                continue
            numbers = _numbers(value)
            if numbers is not None:
                fields.setdefault(key, []).extend(numbers)
    return fields


def reward_metrics(samples: Sequence[TrainingSample], reward_key: str | None, *,
                   prefix: str = "rollout/") -> dict[str, float]:
    """``rollout/raw_reward`` and ``rollout/<field>/mean|median|max|min`` of reward objects.

    Args:
        samples: the step's samples (contexts without a reward are skipped).
        reward_key: the primary key of object rewards.
        prefix: replaces ``rollout/`` (eval: ``eval/<dataset>/``).

    Returns:
        ``rollout/raw_reward``: the mean primary reward (omitted when no sample has one); one
        summary per numeric field of the reward objects (the primary field included).
    """
    raw: list[float] = []
    for sample in samples:
        if sample.reward is None:
            continue
        try:
            raw.append(scalar_reward(sample.reward, reward_key))
        except ExportError:
            continue  # an object without the primary key: still its helper fields below
    out = {f"{prefix}raw_reward": math.fsum(raw) / len(raw)} if raw else {}
    objects = [s.reward for s in samples if isinstance(s.reward, Mapping)]
    for field, values in sorted(_collect(objects, lambda key: False).items()):
        out.update(summary_metrics(f"{prefix}{field}", values))
    return out


def metadata_metrics(samples: Sequence[TrainingSample]) -> dict[str, float]:
    """``<field>/mean|median|max|min`` of numeric top-level export metadata (no prefix).

    Reads each sample's ``export_metadata`` (what the agent wrote); lists of numbers are
    flattened; identifiers and bookkeeping (:data:`METADATA_METRIC_SKIP`) and keys starting with
    ``_`` are skipped, and so are booleans and non-numeric values.
    """
    fields = _collect((s.export_metadata for s in samples),
                      lambda key: key in METADATA_METRIC_SKIP or key.startswith("_"))
    out: dict[str, float] = {}
    for field, values in sorted(fields.items()):
        out.update(summary_metrics(field, values))
    return out


def passrate_metrics(
    sessions_rewards: Sequence[Sequence[Sequence[float | None]]], *, prefix: str = "rollout/"
) -> dict[str, float]:
    """``pass@k`` over Groups (``--log-passrate``), with the rules of docs/export-and-credit.md#reward-metrics-and-pass-rate.

    Each Session contributes its one representative outcome: exactly one of its exported
    contexts carries a reward (usually ``main``; siblings leave it unset), and that primary
    value is 1 (success) or 0. A Group breaking a rule (a Session with no or several rewarded
    contexts, e.g. a Group RM that rewarded every row, or a value other than 0/1) is skipped
    and counted in ``<prefix>passrate/skipped_groups``: its logical-Session grouping is lost.

    ``pass@k`` is the unbiased estimator ``1 - C(n - c, k) / C(n, k)`` of a Group of ``n``
    Sessions with ``c`` successes (Chen et al. 2021, arXiv 2107.03374, section 2.1), averaged over
    Groups, for ``k = 1, 2, 4, ...`` up to the smallest Group size.

    Args:
        sessions_rewards: per Group, per Session, the primary reward of each exported context
            (None when unset).
        prefix: metric name prefix.

    Returns:
        ``<prefix>pass@<k>`` per k, and ``<prefix>passrate/skipped_groups`` when any was skipped.
    """
    outcomes: list[tuple[int, int]] = []  # (n, c) per valid Group
    skipped = 0
    for group in sessions_rewards:
        successes = 0
        valid = bool(group)
        for contexts in group:
            rewarded = [r for r in contexts if r is not None]
            if len(rewarded) != 1 or rewarded[0] not in (0.0, 1.0):
                valid = False
                break
            successes += int(rewarded[0] == 1.0)
        if valid:
            outcomes.append((len(group), successes))
        else:
            skipped += 1
    out: dict[str, float] = {}
    if skipped:
        out[f"{prefix}passrate/skipped_groups"] = float(skipped)
    if not outcomes:
        return out
    smallest = min(n for n, _ in outcomes)
    k = 1
    while k <= smallest:
        out[f"{prefix}pass@{k}"] = math.fsum(_pass_at_k(n, c, k) for n, c in outcomes) / len(outcomes)
        k *= 2
    return out


def _pass_at_k(n: int, c: int, k: int) -> float:
    """``1 - C(n - c, k) / C(n, k)``, computed as a product (no big binomials)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))
