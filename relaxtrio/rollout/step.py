"""Rollout step values: configuration, scored Groups, step results, log lines and metrics."""

from __future__ import annotations

import inspect
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

import attrs

from .._errors import ExportError
from ..config import RolloutConfig
from ..forest import TRACE_KEY, TrainingSample
from ..nursery.group import Group
from .advantages import group_advantages, primary_rewards, scalar_reward
from .filters import FilterVerdict, run_dynamic_filter
from .hooks import custom_advantages, hook_arguments
from .rewards import metadata_metrics, passrate_metrics, reward_metrics, summary_metrics
from .scored import ScoredSample


def agentic_event(component: str, event: str, **fields: Any) -> str:
    """The ``AGENTIC <COMPONENT> event=<name> k=v ...`` log line (None fields omitted)."""
    parts = [f"AGENTIC {component.upper()} event={event}"]
    parts += [f"{k}={v}" for k, v in fields.items() if v is not None]
    return " ".join(parts)


@attrs.frozen(kw_only=True)
class ScoredGroup:
    """A completed Group with its scored contexts.

    Attributes:
        group: the finished Group.
        scored: its contexts with reward and credit, Session order then export order.
    """

    group: Group
    scored: tuple[ScoredSample, ...]

    @property
    def samples(self) -> list[TrainingSample]:
        """The contexts alone, in :attr:`scored` order."""
        return [s.sample for s in self.scored]


def _reward_of(sample: TrainingSample, session_index: int, reward_key: str | None) -> float:
    try:
        value = scalar_reward(sample.reward, reward_key)
    except ExportError as exc:
        raise ExportError(f"session {session_index}: {exc}", param=exc.param) from exc
    if not math.isfinite(value):
        raise ExportError(f"session {session_index}: reward is not finite")
    return value


async def _score_custom(group: Group, config: RolloutConfig) -> ScoredGroup | FilterVerdict:
    assert config.custom_advantage is not None
    # Only each export's own metadata (docs/export-and-credit.md#custom-advantage): no dataset
    # metadata, tools, template kwargs or trace fields.
    exports = [[(s.name, s.export_metadata) for s in session.samples] for session in group.sessions]
    credits = await custom_advantages(config.custom_advantage, exports, hook_args=config.hook_args)
    if credits is None:
        return FilterVerdict(group=group, source="custom_advantage")
    scored = [
        ScoredSample(sample=s, advantage=credit,
                     reward=None if s.reward is None else _reward_of(s, session.index, config.reward_key))
        for session, row in zip(group.sessions, credits, strict=True)
        for s, credit in zip(session.samples, row, strict=True)
    ]
    return ScoredGroup(group=group, scored=tuple(scored))


def _unrewarded(session: Any) -> ExportError:
    return ExportError(
        f"session {session.index} wrote no reward; write reward in RELAX_OUTPUT_JSON or "
        "configure --custom-rm-path", session_id=session.session_id)


def _fallback_rm(sample: TrainingSample, config: RolloutConfig) -> Any:
    """The synchronous reward model inline, for a Group no :func:`score_rewards` ran on."""
    assert config.custom_rm is not None and not config.group_rm
    value = config.custom_rm(*hook_arguments(config.custom_rm, "reward", (sample,), config.hook_args))
    if inspect.isawaitable(value):
        close = getattr(value, "close", None)
        if close is not None:
            close()
        raise ExportError("an async reward model must run through score_rewards (the pipeline "
                          "awaits it when the Group finishes)")
    return value


def _score_eval(group: Group, config: RolloutConfig) -> ScoredGroup:
    """An eval Group's rewards: never custom advantage, never a filter.

    Only contexts with a reward are scored (evaluation often exports only ``main``); the
    primary value uses ``eval_reward_key`` (else ``reward_key``). Advantages are all 0.0. A
    Session that failed or was cancelled is skipped (eval counts it; its siblings still count).
    """
    key = config.eval_reward_key if config.eval_reward_key is not None else config.reward_key
    scored: list[ScoredSample] = []
    for session in group.sessions:
        if session.status in ("failed", "cancelled"):
            continue
        num_rewarded = 0
        for sample in session.samples:
            reward = sample.reward
            if reward is None and config.custom_rm is not None and not config.group_rm:
                reward = _fallback_rm(sample, config)
            if reward is None:
                continue
            value = _reward_of(attrs.evolve(sample, reward=reward), session.index, key)
            scored.append(ScoredSample(sample=sample, reward=value, advantage=0.0))
            num_rewarded += 1
        if not num_rewarded:
            raise _unrewarded(session)
    return ScoredGroup(group=group, scored=tuple(scored))


async def score_group(group: Group, config: RolloutConfig) -> ScoredGroup | FilterVerdict:
    """Scalar rewards and advantages for a completed Group, or why it is filtered.

    Eval Groups (``group.mode == "eval"``) are only scored for their rewards: custom advantage
    and the dynamic filter are never called (docs/export-and-credit.md#custom-advantage).
    For train Groups, a custom advantage function's credits are used as they are (no estimator
    normalization); otherwise every Session must export exactly one context and
    ``config.advantage_estimator`` turns the Group's rewards into credits. Then the dynamic
    sampling filter, if any, may filter the Group. Reward-model rewards are expected to be
    written already (:func:`relaxtrio.rollout.rewards.score_rewards`); a synchronous per-sample
    reward model is still called inline for samples without reward.

    Returns:
        The scored Group; or a :class:`~relaxtrio.rollout.filters.FilterVerdict` when the
        custom advantage function returned None or the dynamic sampling filter dropped the
        Group (never for an eval Group).

    Raises:
        ExportError: a Session exported several contexts without custom advantage, a sample has
            no reward and no custom RM is configured, or a reward is not a finite number.
        HookError: the custom advantage function or the filter raised or answered in the
            wrong shape (an :class:`ExportError` too).

    Cancellation:
        A checkpoint when a hook runs (:func:`~relaxtrio.rollout.hooks.call_hook`).
    """
    if group.mode == "eval":
        return _score_eval(group, config)
    if config.custom_advantage is not None:
        scored = await _score_custom(group, config)
        if isinstance(scored, FilterVerdict):
            return scored
    else:
        scored = _score_rewards_only(group, config)
    if config.dynamic_filter is not None:
        verdict = await run_dynamic_filter(config.dynamic_filter, scored.samples,
                                           [s.reward for s in scored.scored], hook_args=config.hook_args)
        if not verdict.keep:
            return FilterVerdict(group=group, source="dynamic_filter", reason=verdict.reason)
    return scored


def _score_rewards_only(group: Group, config: RolloutConfig) -> ScoredGroup:
    samples: list[TrainingSample] = []
    rewards: list[float] = []
    for session in group.sessions:
        if len(session.samples) != 1:
            raise ExportError(
                f"session {session.index} exported {len(session.samples)} contexts; "
                "more than one context per session requires --agentic-custom-advantage-path",
                session_id=session.session_id,
            )
        sample = session.samples[0]
        if sample.reward is None:
            if config.custom_rm is None or config.group_rm:
                raise _unrewarded(session)
            value = _reward_of(attrs.evolve(sample, reward=_fallback_rm(sample, config)),
                               session.index, config.reward_key)
        else:
            value = _reward_of(sample, session.index, config.reward_key)
        if not math.isfinite(value):
            raise ExportError(f"session {session.index}: reward is not finite",
                              session_id=session.session_id)
        samples.append(sample)
        rewards.append(value)
    credits = group_advantages(config.advantage_estimator, rewards,
                               std_normalize=config.grpo_std_normalization)
    return ScoredGroup(group=group, scored=tuple(
        ScoredSample(sample=s, reward=r, advantage=a) for s, r, a in zip(samples, rewards, credits, strict=True)))


@attrs.frozen(kw_only=True)
class StepResult:
    """What one rollout step produced.

    Attributes:
        rollout_id: the step.
        groups: accepted Groups, in acceptance order.
        dropped: Groups dropped during the step, with their reasons.
        rollout_s: wall seconds of the step's rollout.
        aborted_requests: generations aborted (and parked) at step close.
        resident_groups: Groups still resident after the step closed.
        barrier_warnings: barrier watchdog warnings logged during the step.
        filtered: every Group filtered during the step, in filtering order: by the dynamic
            sampling filter (each replaced by new demand) or by the custom advantage function
            (those are in ``dropped`` as well).
        interrupted_groups: resident Groups paused at step close (partial rollout), or
            waiting for newer weights (fully async with ``--max-staleness``).
        stale_groups: Groups dropped for a sample staler than ``--max-staleness`` (also in
            ``dropped``).
        stale_samples: the samples of those Groups staler than the bound.
        slowest_group_wait_s: wall seconds between the acceptance of the step's second-to-last
            Group and its last one: the rollout waiting on its slowest Group alone (0.0 with
            fewer than two accepted Groups).
        hook_failures: Groups dropped because a user hook failed, per hook kind (``reward``,
            ``group_reward``, ``dynamic_filter``, ``custom_advantage``); they are in
            ``dropped`` too.
        carried_debt_groups: Groups the step still owed when it closed short (fully async:
            its stragglers were left to later steps, and the next Groups to finish paid its
            batch); 0 when it closed with its target.
        debt_wait_s: seconds from the short close until that debt was paid (what the update
            waited for); 0.0 when the step did not close short.
    """

    rollout_id: int
    groups: tuple[ScoredGroup, ...]
    dropped: tuple[Group, ...]
    rollout_s: float
    aborted_requests: int = 0
    resident_groups: int = 0
    barrier_warnings: int = 0
    filtered: tuple[FilterVerdict, ...] = ()
    interrupted_groups: int = 0
    slowest_group_wait_s: float = 0.0
    hook_failures: Mapping[str, int] = attrs.field(factory=dict)
    stale_groups: int = 0
    stale_samples: int = 0
    carried_debt_groups: int = 0
    debt_wait_s: float = 0.0

    @property
    def filtered_groups(self) -> int:
        """Filtered Groups: by the dynamic sampling filter and by the custom advantage function."""
        return len(self.filtered)

    @property
    def contexts_per_session(self) -> int:
        """The most contexts one Session of an accepted Group exported (0 without Groups)."""
        return max((len(s.samples) for g in self.groups for s in g.group.sessions), default=0)

    @property
    def scored(self) -> list[ScoredSample]:
        """Every scored context, Group by Group: what the trainer trains on, in its order."""
        return [s for g in self.groups for s in g.scored]

    @property
    def samples(self) -> list[TrainingSample]:
        """The contexts alone, in :attr:`scored` order."""
        return [s.sample for s in self.scored]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def stop_reason(sample: TrainingSample) -> str:
    """Why a sample's rollout stopped: the export metadata's ``rollout_stop_reason``, then its
    ``stop_reason``, then the finish reason of the context's last turn; ``unknown`` when none is
    set. ``env_error:<detail>`` counts as ``env_error``."""
    meta = sample.metadata
    reason = meta.get("rollout_stop_reason") or meta.get("stop_reason")
    if not (isinstance(reason, str) and reason.strip()):
        turns = (meta.get(TRACE_KEY) or {}).get("turns") or []
        reason = turns[-1].get("finish_reason") if turns else None
    if not (isinstance(reason, str) and reason.strip()):
        return "unknown"
    return reason.strip().split(":", 1)[0]


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile ``q`` in [0, 100] of non-empty ascending values."""
    rank = max(math.ceil(q / 100 * len(sorted_values)), 1)
    return sorted_values[rank - 1]


def family_metrics(samples: list[TrainingSample]) -> dict[str, float]:
    """``stop_reason/<reason>/{count,ratio}`` and ``num_turn/{min,mean,max,p50,p90,p95,p99}``
    (turns per exported context, from ``rollout_turns``) of a step's samples."""
    out: dict[str, float] = {}
    if not samples:
        return out
    reasons = Counter(stop_reason(s) for s in samples)
    for reason, count in sorted(reasons.items()):
        out[f"stop_reason/{reason}/count"] = float(count)
        out[f"stop_reason/{reason}/ratio"] = count / len(samples)
    turns = sorted(float(s.metadata.get("rollout_turns", 0)) for s in samples)
    out.update({"num_turn/min": turns[0], "num_turn/mean": _mean(turns), "num_turn/max": turns[-1]})
    for q in (50, 90, 95, 99):
        out[f"num_turn/p{q}"] = _percentile(turns, q)
    return out


def group_metrics(result: StepResult, config: RolloutConfig | None = None) -> Mapping[str, Any]:
    """Reward, length and scheduling statistics of a step (means over samples).

    All values are floats except ``prompt_indices``: the dataset rows of the trained Groups, in
    acceptance order (what a resumed run is checked against). ``rollout_tokens_per_s`` is sampled
    (loss-mask) tokens of the accepted samples per second of rollout; the ``stop_reason/`` and
    ``num_turn/`` families come from :func:`family_metrics`.

    With ``config`` also the reward metrics of docs/export-and-credit.md#reward-metrics-and-pass-rate:
    ``rollout/raw_reward``, ``rollout/<field>/mean|median|max|min`` of reward objects,
    ``<field>/mean|median|max|min`` of numeric export metadata, ``rollout/pass@k`` with
    ``log_passrate``, ``credit/<context name>/mean|median|max|min`` of the base credit of every
    named (explicitly exported) context, and ``filtered_groups`` with
    ``rollout/dynamic_filter/drop_<reason>``. Always: ``rollout/hook_failures/<hook>`` for each
    hook that failed a Group this step.
    """
    out = dict(_base_metrics(result))
    for kind, count in sorted(result.hook_failures.items()):
        out[f"rollout/hook_failures/{kind}"] = float(count)
    if config is None:
        return out
    samples = result.samples
    out.update(reward_metrics(samples, config.reward_key))
    out.update(metadata_metrics(samples))
    if config.log_passrate:
        out.update(passrate_metrics([_session_rewards(g, config.reward_key) for g in result.groups]))
    credits: dict[str, list[float]] = {}
    for scored in result.scored:
        if scored.sample.name is not None:
            credits.setdefault(scored.sample.name, []).append(scored.advantage)
    for name, values in sorted(credits.items()):
        out.update(summary_metrics(f"credit/{name}", values))
    for verdict in result.filtered:
        if verdict.metric is not None:
            out[verdict.metric] = out.get(verdict.metric, 0.0) + 1.0
    return out


def _session_rewards(scored: ScoredGroup, reward_key: str | None) -> list[list[float | None]]:
    """Per Session, the primary reward of each exported context (None when unset)."""
    return [primary_rewards(session.samples, reward_key) for session in scored.group.sessions]


def _base_metrics(result: StepResult) -> Mapping[str, Any]:
    rewards = [s.reward for s in result.scored if s.reward is not None]
    mean = _mean(rewards)
    std = math.sqrt(_mean([(r - mean) ** 2 for r in rewards])) if rewards else float("nan")
    samples = result.samples
    return {
        "reward_mean": mean,
        "reward_std": std,
        "response_length_mean": _mean([float(sum(s.loss_mask)) for s in samples]),
        "sequence_length_mean": _mean([float(len(s.token_ids)) for s in samples]),
        "turns_mean": _mean([float(s.metadata.get("rollout_turns", 0)) for s in samples]),
        "num_groups": float(len(result.groups)),
        "num_samples": float(len(samples)),
        "dropped_groups": float(len(result.dropped)),
        "aborted_requests": float(result.aborted_requests),
        "resident_groups": float(result.resident_groups),
        "barrier_warnings": float(result.barrier_warnings),
        "unexported_branches": float(sum(s.num_dropped_branches for g in result.groups for s in g.group.sessions)),
        "unexported_side_leaves": float(sum(s.num_side_leaves for g in result.groups for s in g.group.sessions)),
        "ignored_request_fields": float(sum(sum(s.ignored_request_fields.values())
                                           for g in result.groups for s in g.group.sessions)),
        # Accepted and dropped Groups alike: an agent that cannot recover from the overflow
        # usually fails its Session, and so drops its Group.
        "overflow_ended_sessions": float(sum(s.overflowed_last for group in (*(g.group for g in result.groups),
                                                                              *result.dropped)
                                             for s in group.sessions)),
        "images_as_text": float(sum(s.images_as_text for g in result.groups for s in g.group.sessions)),
        "interrupted_groups": float(result.interrupted_groups),
        "filtered_groups": float(result.filtered_groups),
        "stale_groups": float(result.stale_groups),
        "stale_samples": float(result.stale_samples),
        "carried_debt_groups": float(result.carried_debt_groups),
        "debt_wait_s": result.debt_wait_s,
        "rollout_s": result.rollout_s,
        "rollout_slowest_group_wait_s": result.slowest_group_wait_s,
        "rollout_tokens_per_s": (sum(sum(s.loss_mask) for s in samples) / result.rollout_s
                                 if result.rollout_s > 0 else float("nan")),
        "prompt_indices": [g.group.prompt_index for g in result.groups],
        **family_metrics(samples),
    }
