"""Rollout step values: configuration, scored Groups, step results, log lines and metrics."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

import attrs

from .._errors import ExportError, GroupFilteredError
from ..config import RolloutConfig
from ..forest import TRACE_KEY, TrainingSample
from ..nursery.group import Group
from .advantages import grpo_advantages, scalar_reward
from .hooks import custom_advantages


def agentic_event(component: str, event: str, **fields: Any) -> str:
    """The ``AGENTIC <COMPONENT> event=<name> k=v ...`` log line (None fields omitted)."""
    parts = [f"AGENTIC {component.upper()} event={event}"]
    parts += [f"{k}={v}" for k, v in fields.items() if v is not None]
    return " ".join(parts)




@attrs.frozen(kw_only=True)
class ScoredGroup:
    """A completed Group with a scalar reward and an advantage per sample.

    Attributes:
        group: the finished Group.
        samples: its samples, Session order then export order.
        rewards: scalar reward per sample (None for contexts without a reward under custom
            advantage).
        advantages: per sample: GRPO advantage (reward normalized within the Group), or the
            custom advantage function's credit.
    """

    group: Group
    samples: tuple[TrainingSample, ...]
    rewards: tuple[float | None, ...]
    advantages: tuple[float, ...]


def _reward_of(sample: TrainingSample, session_index: int, config: RolloutConfig) -> float:
    try:
        value = scalar_reward(sample.reward, config.reward_key)
    except ExportError as exc:
        raise ExportError(f"session {session_index}: {exc}", param=exc.param) from exc
    if not math.isfinite(value):
        raise ExportError(f"session {session_index}: reward is not finite")
    return value


def _score_custom(group: Group, config: RolloutConfig) -> ScoredGroup:
    assert config.custom_advantage is not None
    exports = [[(s.name, s.metadata) for s in session.samples] for session in group.sessions]
    credits = custom_advantages(config.custom_advantage, exports)
    if credits is None:
        raise GroupFilteredError("Filtered 1 group: the custom advantage function returned None")
    samples = [s for session in group.sessions for s in session.samples]
    rewards = [
        None if s.reward is None else _reward_of(s, session.index, config)
        for session in group.sessions for s in session.samples
    ]
    return ScoredGroup(group=group, samples=tuple(samples), rewards=tuple(rewards),
                       advantages=tuple(c for row in credits for c in row))


def score_group(group: Group, config: RolloutConfig) -> ScoredGroup:
    """Scalar rewards and advantages for a completed Group.

    With a custom advantage function its credits are used as they are (no GRPO normalization);
    otherwise every Session must export exactly one context and GRPO normalizes the rewards.

    Raises:
        ExportError: a Session exported several contexts without custom advantage, a sample has
            no reward and no custom RM is configured, a reward is not a finite number, the custom
            advantage answer is invalid, or (:class:`GroupFilteredError`) it filtered the Group.
    """
    if config.custom_advantage is not None:
        return _score_custom(group, config)
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
            if config.custom_rm is None:
                raise ExportError(
                    f"session {session.index} wrote no reward; write reward in "
                    "RELAX_OUTPUT_JSON or configure --custom-rm-path",
                    session_id=session.session_id,
                )
            value = float(config.custom_rm(sample))
        else:
            value = _reward_of(sample, session.index, config)
        if not math.isfinite(value):
            raise ExportError(f"session {session.index}: reward is not finite",
                              session_id=session.session_id)
        samples.append(sample)
        rewards.append(value)
    return ScoredGroup(group=group, samples=tuple(samples), rewards=tuple(rewards),
                       advantages=tuple(grpo_advantages(rewards)))


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
        interrupted_groups: resident Groups paused at step close (partial rollout).
        filtered_groups: how many of ``dropped`` the custom advantage function filtered.
    """

    rollout_id: int
    groups: tuple[ScoredGroup, ...]
    dropped: tuple[Group, ...]
    rollout_s: float
    aborted_requests: int = 0
    resident_groups: int = 0
    barrier_warnings: int = 0
    interrupted_groups: int = 0
    filtered_groups: int = 0

    @property
    def samples(self) -> list[TrainingSample]:
        """All samples, Group by Group."""
        return [s for g in self.groups for s in g.samples]

    @property
    def advantages(self) -> list[float]:
        """All advantages, aligned with :attr:`samples`."""
        return [a for g in self.groups for a in g.advantages]

    @property
    def rewards(self) -> list[float | None]:
        """All scalar rewards, aligned with :attr:`samples` (None: context without reward)."""
        return [r for g in self.groups for r in g.rewards]


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


def group_metrics(result: StepResult) -> Mapping[str, Any]:
    """Reward, length and scheduling statistics of a step (means over samples).

    All values are floats except ``prompt_indices``: the dataset rows of the trained Groups, in
    acceptance order (what a resumed run is checked against). ``rollout_tokens_per_s`` is sampled
    (loss-mask) tokens of the accepted samples per second of rollout; the ``stop_reason/`` and
    ``num_turn/`` families come from :func:`family_metrics`.
    """
    rewards = [r for r in result.rewards if r is not None]
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
        "interrupted_groups": float(result.interrupted_groups),
        "filtered_groups": float(result.filtered_groups),
        "rollout_s": result.rollout_s,
        "rollout_tokens_per_s": (sum(sum(s.loss_mask) for s in samples) / result.rollout_s
                                 if result.rollout_s > 0 else float("nan")),
        "prompt_indices": [g.group.prompt_index for g in result.groups],
        **family_metrics(samples),
    }
