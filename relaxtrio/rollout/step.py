"""Rollout step values: configuration, scored Groups, step results, log lines and metrics."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .._errors import ExportError, InvalidRequestError
from ..forest import TrainingSample
from ..nursery.group import Group
from .advantages import grpo_advantages, scalar_reward
from .hooks import CustomAdvantage, custom_advantages


def agentic_event(component: str, event: str, **fields: Any) -> str:
    """The ``AGENTIC <COMPONENT> event=<name> k=v ...`` log line (None fields omitted)."""
    parts = [f"AGENTIC {component.upper()} event={event}"]
    parts += [f"{k}={v}" for k, v in fields.items() if v is not None]
    return " ".join(parts)


@attrs.frozen(kw_only=True)
class RolloutConfig:
    """Shape and scheduling of rollout steps.

    Attributes:
        n_samples_per_prompt: Sessions per Group.
        rollout_batch_size: Groups trained on per step.
        over_sampling_batch_size: Groups demanded per step (>= rollout_batch_size); the first
            ``rollout_batch_size`` to finish are trained on, the tail is dropped at step close
            (kept resident with partial rollout or fully async).
        agentic_concurrency: resident Group permits shared by Prepare and Runtime (default:
            ``over_sampling_batch_size``).
        prelaunch: start agents while capacity is free; their first requests wait for the lease.
        partial_rollout: at step close, abort in-flight generations, keep the partial tokens and
            resume them in the next step (the agents' HTTP requests stay open).
        fully_async: Groups keep generating across steps, also while the trainer trains.
        max_refills: Groups a step may start to replace dropped ones (default: the step's demand).
        barrier_warn_s: warn when a Group waits longer than this (seconds) at the first-request
            barrier, naming the Sessions that have not sent their first request.
        abort_wait_s: at step close, how long to wait (seconds) for aborted generations to come
            back before reporting the engine as not honouring aborts.
        reward_key: primary key of object rewards.
        custom_rm: ``fn(sample) -> float`` for samples the agent did not reward, or None.
        custom_advantage: per-context credit function (see :mod:`relaxtrio.rollout.hooks`);
            required when a Session exports more than one context.
        show_progress: whether to draw the tqdm progress bar.
    """

    n_samples_per_prompt: int = 4
    rollout_batch_size: int = 4
    over_sampling_batch_size: int | None = None
    agentic_concurrency: int | None = None
    prelaunch: bool = False
    partial_rollout: bool = False
    fully_async: bool = False
    max_refills: int | None = None
    barrier_warn_s: float = 120.0
    abort_wait_s: float = 30.0
    reward_key: str | None = None
    custom_rm: Callable[[TrainingSample], float] | None = None
    custom_advantage: CustomAdvantage | None = None
    show_progress: bool = True

    @property
    def demand(self) -> int:
        """Groups started per step (over-sampling included)."""
        return max(self.over_sampling_batch_size or 0, self.rollout_batch_size)

    @property
    def concurrency(self) -> int:
        """Resident Group permits."""
        return self.agentic_concurrency or self.demand

    @property
    def keeps_resident(self) -> bool:
        """Whether unfinished Groups survive step close."""
        return self.partial_rollout or self.fully_async


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
    except (ValueError, InvalidRequestError) as exc:
        raise ExportError(f"session {session_index}: {exc}") from exc
    if not math.isfinite(value):
        raise ExportError(f"session {session_index}: reward is not finite")
    return value


def _score_custom(group: Group, config: RolloutConfig) -> ScoredGroup:
    assert config.custom_advantage is not None
    exports = [[(s.name, s.metadata) for s in session.samples] for session in group.sessions]
    credits = custom_advantages(config.custom_advantage, exports)
    if credits is None:
        raise ExportError("Filtered 1 group: the custom advantage function returned None")
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
            advantage answer is invalid, or it filtered the Group.
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
    """

    rollout_id: int
    groups: tuple[ScoredGroup, ...]
    dropped: tuple[Group, ...]
    rollout_s: float
    aborted_requests: int = 0
    resident_groups: int = 0
    barrier_warnings: int = 0

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


def group_metrics(result: StepResult) -> Mapping[str, float]:
    """Reward, length and scheduling statistics of a step (means over samples)."""
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
        "rollout_s": result.rollout_s,
    }
