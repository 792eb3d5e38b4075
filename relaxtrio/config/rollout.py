"""Shape, scheduling and scoring of rollout steps (:class:`RolloutConfig`) and of evaluation
(:class:`EvalConfig`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from .._errors import ConfigError
from .._validate import one_of, optional_non_negative_int
from .trainer import ADVANTAGE_ESTIMATORS, ESTIMATORS_REJECTING_CUSTOM_ADVANTAGE, AdvantageEstimator

__all__ = [
    "EvalConfig",
    "RolloutConfig",
]


@attrs.frozen(kw_only=True)
class EvalConfig:
    """Evaluation settings.

    Attributes:
        datasets: ``(name, path, n_samples_per_eval_prompt)`` per eval dataset; empty disables
            eval. Datasets run serially.
        interval: evaluate after every ``interval`` steps (and never when 0).
        agentic_eval_concurrency: eval Groups at once (default: ceil(T / G_d)).
        max_context_tokens: training-token limit of each eval Session's lineages
            (``--eval-max-context-len``); None: the train limit.
    """

    datasets: tuple[tuple[str, Path, int], ...] = ()
    interval: int = 0
    agentic_eval_concurrency: int | None = None
    max_context_tokens: int | None = None


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
        max_staleness: the most weight versions a trained sample's oldest token may lag the
            policy (``--max-staleness``; None: no bound): staler Groups are dropped and counted,
            and with ``fully_async`` Groups wait for newer weights instead of sampling such
            tokens (docs/scheduling.md#fully-async).
        max_refills: Groups a step may start to replace dropped ones (default: the step's demand).
        barrier_warn_s: warn when a Group waits longer than this (seconds) at the first-request
            barrier, naming the Sessions that have not sent their first request.
        abort_wait_s: at step close, how long to wait (seconds) for aborted generations to come
            back before reporting the engine as not honouring aborts.
        idle_heartbeat_s: while a step waits this long (seconds, trio clock) without a Group
            finishing, log an ``event=idle_heartbeat`` line with the pipeline snapshot; again
            every ``idle_heartbeat_s`` after that.
        straggler_s: with ``fully_async``, a leased Group whose running Sessions have all been
            off the engine (no generation in flight) for this many seconds is a straggler: a
            step may close short on it (docs/scheduling.md#closing-short).
        reward_key: primary key of object rewards.
        eval_reward_key: primary key of object rewards in evaluation (``--eval-reward-key``);
            None uses ``reward_key``.
        custom_rm: the reward model (``--custom-rm-path``, sync or async, see
            :mod:`relaxtrio.rollout.rewards`): ``fn(sample) -> reward`` for samples the agent did
            not reward, or with ``group_rm`` ``fn(samples) -> [reward, ...]`` once per Group.
        group_rm: call ``custom_rm`` once per Group over all its samples (``--group-rm``).
        log_passrate: log ``rollout/pass@k`` (``--log-passrate``; one rewarded 0/1 context per
            Session).
        dynamic_filter: ``fn(samples, rewards) -> bool | DynamicFilterOutput`` run on every
            scored train Group (``--dynamic-sampling-filter-path``, see
            :mod:`relaxtrio.rollout.filters`); a filtered Group is new demand.
        max_filtered_groups: filtered Groups a step may replace before it closes short (default:
            ``8 * rollout_batch_size``), so a filter that rejects everything cannot spin forever.
        custom_advantage: per-context credit function (see :mod:`relaxtrio.rollout.hooks`);
            required when a Session exports more than one context.
        hook_args: what a hook with Relax's signature gets as its first argument, ``args``
            (the parsed command line; see :mod:`relaxtrio.rollout.hooks`).
        show_progress: whether to draw the tqdm progress bar.
        advantage_estimator: how a Group's rewards become each context's base credit
            (``--advantage-estimator``, see :mod:`relaxtrio.rollout.advantages`); bypassed by
            ``custom_advantage``, which ``rloo`` and ``reinforce_plus_plus_baseline`` refuse.
        grpo_std_normalization: GRPO divides the centered rewards by the Group's std; False
            (``--disable-grpo-std-normalization``) only centers them, as ``dr_grpo`` does.

    Raises:
        ConfigError: an estimator that refuses custom advantage is combined with it, or
            ``group_rm`` without ``custom_rm``.
    """

    n_samples_per_prompt: int = 4
    rollout_batch_size: int = 4
    over_sampling_batch_size: int | None = None
    agentic_concurrency: int | None = None
    prelaunch: bool = False
    partial_rollout: bool = False
    fully_async: bool = False
    max_staleness: int | None = attrs.field(default=None, validator=optional_non_negative_int)
    max_refills: int | None = None
    barrier_warn_s: float = 120.0
    abort_wait_s: float = 30.0
    idle_heartbeat_s: float = 30.0
    straggler_s: float = 30.0
    reward_key: str | None = None
    eval_reward_key: str | None = None
    custom_rm: Callable[..., Any] | None = None
    group_rm: bool = False
    log_passrate: bool = False
    dynamic_filter: Callable[..., Any] | None = None
    max_filtered_groups: int | None = attrs.field(default=None, validator=optional_non_negative_int)
    custom_advantage: Callable[..., Any] | None = None
    hook_args: Any = attrs.field(default=None, eq=False, repr=False)
    show_progress: bool = True
    advantage_estimator: AdvantageEstimator = attrs.field(
        default="grpo", validator=one_of(ADVANTAGE_ESTIMATORS)
    )
    grpo_std_normalization: bool = True

    def __attrs_post_init__(self) -> None:
        if self.group_rm and self.custom_rm is None:
            raise ConfigError("--group-rm needs --custom-rm-path (the function called once per "
                                      "Group).", param="group_rm")
        if self.custom_advantage is not None and self.advantage_estimator in ESTIMATORS_REJECTING_CUSTOM_ADVANTAGE:
            raise ConfigError(
                f"--advantage-estimator {self.advantage_estimator} cannot be combined with "
                "--agentic-custom-advantage-path: it builds its baseline from the Group's rewards, "
                "while custom advantage already returns each context's base credit (normalize "
                "inside the function, or use grpo / dr_grpo / gspo).",
                param="advantage_estimator",
            )

    @property
    def demand(self) -> int:
        """Groups started per step (over-sampling included)."""
        return max(self.over_sampling_batch_size or 0, self.rollout_batch_size)

    @property
    def filter_budget(self) -> int:
        """Filtered Groups a step may replace with new ones."""
        if self.max_filtered_groups is not None:
            return self.max_filtered_groups
        return 8 * self.rollout_batch_size

    @property
    def concurrency(self) -> int:
        """Resident Group permits."""
        return self.agentic_concurrency or self.demand
