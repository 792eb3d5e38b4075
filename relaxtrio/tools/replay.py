"""``python -m relaxtrio replay DUMP --checkpoint DIR``: recompute a dumped step on CPU, no agents, no engine.

From a debug dump (docs/dumps.md) and the model directory whose weights sampled the step, the
replay recomputes, in the order the trainer uses them:

1. **logprobs**: every sample's trainer logprobs, with :meth:`~relaxtrio.train.Trainer.compute_logprobs`
   (the trainer's own function, under the trainer settings the dump recorded, so any setting
   that changes them, such as the logprob temperature, is followed), compared on every trained
   token (``loss_mask == 1``) with the rollout logprobs the engine reported;
2. **advantages**: each Group's credits from the recorded scalar rewards with the rollout's own
   advantage function, compared with the credits the trainer received (not recomputed for custom
   advantage, whose hook is user code with inputs not all in the dump, nor for dumps without
   advantages, such as serve dumps);
3. **loss**: the step's loss with :meth:`~relaxtrio.train.Trainer.train_step` on a fresh trainer,
   compared with the loss the run recorded (only when the dump has a ``train`` section).

The first place where a recomputed value leaves its tolerance is reported with its sample,
token index, recorded and recomputed values. A logprob divergence says the engine and the trainer
disagree (different weights, numerics, temperature or tokens); an advantage divergence with
matching logprobs says the credit is wrong. Tolerances: :data:`LOGPROB_ATOL`,
:data:`ADVANTAGE_ATOL`, :data:`LOSS_RTOL`.

The loss check replays the trainer's first minibatch split from its seed, so it is exact for
step 0 or one minibatch per step (the default); the checkpoint must hold the weights that
sampled the step (for step 0 the run's starting model).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import attrs

from .._errors import ConfigError
from ..config import TrainConfig
from ..rollout.advantages import group_advantages
from ..rollout.dumps import DumpedSample, RolloutDump
from ..rollout.scored import ScoredSample

LOGPROB_ATOL: Final = 1e-3
"""Nats: trainer and engine logprobs of one token may differ by this much. fp32 on CPU keeps
them within ~1e-5 (measured on the tiny test model and SmolLM2), so 1e-3 flags a real
disagreement and still catches a 0.01 nat error at the token where it happens."""

ADVANTAGE_ATOL: Final = 1e-6
"""Absolute tolerance on a recomputed advantage (both sides are float64 Python arithmetic)."""

LOSS_RTOL: Final = 1e-4
"""Relative tolerance on the recomputed step loss (with an absolute floor of 1e-6): the same
fp32 torch computation, differing only in reduction order across threads."""

DivergenceKind = Literal["logprob", "advantage", "loss"]

_SHARED_WITH_GENERATION: Final = ("temperature",)
"""Generation settings a trainer setting of the same name follows (the logprob temperature), for
dumps that recorded no trainer settings; used only where :class:`TrainConfig` has the field."""


@attrs.frozen(kw_only=True)
class Divergence:
    """A recomputed value outside its tolerance.

    Attributes:
        kind: what was recomputed.
        sample: index into the step's samples (trainer order), None for the step loss.
        token: index into that sample's ``token_ids`` (logprobs only), else None.
        recorded: the value in the dump.
        recomputed: the value the replay computed.
        tolerance: the allowed absolute difference.
        session_id: the sample's Session, when there is one.
        context: the sample's context name (None: implicit export).
    """

    kind: DivergenceKind
    sample: int | None
    token: int | None
    recorded: float
    recomputed: float
    tolerance: float
    session_id: str | None = None
    context: str | None = None

    def describe(self) -> str:
        """One line for people."""
        where = "the step loss" if self.sample is None else f"sample {self.sample}"
        if self.sample is not None:
            where += f" (session {self.session_id}, context {self.context!r})"
        if self.token is not None:
            where += f" token {self.token}"
        diff = abs(self.recorded - self.recomputed)
        return (f"first divergence: {self.kind} at {where}: recorded {self.recorded:.6g}, "
                f"recomputed {self.recomputed:.6g} (|diff| {diff:.3g} > {self.tolerance:.3g})")


@attrs.frozen(kw_only=True)
class ReplayReport:
    """What a replay found.

    Attributes:
        num_samples: samples replayed.
        num_trained_tokens: tokens with ``loss_mask == 1``.
        logprob_max_abs_diff: largest ``|trainer - rollout|`` logprob over trained tokens (nats).
        logprob_mean_abs_diff: its mean over trained tokens (nats).
        num_logprob_divergences: trained tokens outside :data:`LOGPROB_ATOL`.
        advantages_checked: whether advantages were recomputed.
        advantages_skipped: why not, when they were not (custom advantage, or a dump without
            advantages such as a serve dump).
        advantage_max_abs_diff: largest advantage difference (None when not checked).
        recorded_loss: the run's step loss, or None.
        recomputed_loss: the replayed step loss, or None.
        divergences: the first divergence of each kind, in pipeline order.
        notes: things a reader should know (unknown trainer settings, several weight versions).
    """

    num_samples: int
    num_trained_tokens: int
    logprob_max_abs_diff: float
    logprob_mean_abs_diff: float
    num_logprob_divergences: int
    advantages_checked: bool
    advantages_skipped: str | None
    advantage_max_abs_diff: float | None
    recorded_loss: float | None
    recomputed_loss: float | None
    divergences: tuple[Divergence, ...]
    notes: tuple[str, ...] = ()

    @property
    def first(self) -> Divergence | None:
        """The first divergence in pipeline order (logprobs, advantages, loss), or None."""
        return self.divergences[0] if self.divergences else None

    def lines(self) -> list[str]:
        """The report for people, one finding per line."""
        out = [f"note: {n}" for n in self.notes]
        out.append(f"logprobs: {self.num_samples} samples, {self.num_trained_tokens} trained tokens, "
                   f"max |trainer - rollout| {self.logprob_max_abs_diff:.3g}, mean "
                   f"{self.logprob_mean_abs_diff:.3g} nats, {self.num_logprob_divergences} above "
                   f"{LOGPROB_ATOL:g}")
        if self.advantages_checked:
            out.append(f"advantages: recomputed, max |diff| {self.advantage_max_abs_diff:.3g}")
        else:
            out.append(f"advantages: not recomputed ({self.advantages_skipped})")
        if self.recorded_loss is None:
            out.append("loss: not recorded in the dump (no training step)")
        else:
            out.append(f"loss: recorded {self.recorded_loss:.6g}, recomputed {self.recomputed_loss:.6g}")
        out.append(self.first.describe() if self.first else "no divergence")
        return out


def train_config_of(dump: RolloutDump, *, device: str = "cpu") -> tuple[TrainConfig, list[str]]:
    """The trainer settings the run used, as far as this version's :class:`TrainConfig` knows them.

    Settings the dump recorded but this :class:`TrainConfig` lacks are returned as notes. A dump
    without a ``trainer_config`` (a rollout-only run) gets the defaults, with every
    :class:`TrainConfig` field that follows a generation setting (the sampling temperature, where
    this version's trainer computes logprobs at it) taken from the recorded ``generation``.

    Returns:
        ``(config, notes)``; ``config.device`` is ``device``.
    """
    fields = attrs.fields_dict(TrainConfig)
    recorded = dump.section("trainer_config")
    notes: list[str] = []
    if recorded is None:
        generation = dump.section("generation") or {}
        recorded = {k: generation[k] for k in _SHARED_WITH_GENERATION if k in fields and k in generation}
        notes.append("the dump has no trainer settings (rollout only): trainer defaults used")
    unknown = sorted(k for k in recorded if k not in fields)
    if unknown:
        notes.append(f"recorded trainer settings unknown to this version, ignored: {', '.join(unknown)}")
    kwargs = {k: v for k, v in recorded.items() if k in fields and v is not None}
    kwargs["device"] = device
    return TrainConfig(**kwargs), notes


def _check_samples(samples: Sequence[DumpedSample]) -> None:
    if not samples:
        raise ConfigError("the dump has no samples to replay", param="samples")
    media = [s.index for s in samples if s.num_multimodal_inputs]
    if media:
        raise ConfigError(
            f"samples {media[:4]} carry images, which dumps do not store; only text samples replay",
            param="samples")


def _logprob_check(samples: Sequence[DumpedSample], recomputed: Sequence[Sequence[float]]
                   ) -> tuple[Divergence | None, int, float, float, int]:
    first: Divergence | None = None
    count = above = 0
    total = worst = 0.0
    for d, row in zip(samples, recomputed, strict=True):
        s = d.sample
        for t, (mask, rollout, trainer) in enumerate(zip(s.loss_mask, s.rollout_logprobs, row, strict=True)):
            if not mask:
                continue
            diff = abs(trainer - rollout)
            count += 1
            total += diff
            worst = max(worst, diff)
            if not diff <= LOGPROB_ATOL:  # nan counts as a divergence
                above += 1
                if first is None:
                    first = Divergence(kind="logprob", sample=d.index, token=t, recorded=rollout,
                                       recomputed=trainer, tolerance=LOGPROB_ATOL,
                                       session_id=s.session_id, context=s.name)
    return first, count, worst, (total / count if count else 0.0), above


def _advantage_check(samples: Sequence[DumpedSample], rollout: Mapping[str, Any]
                     ) -> tuple[Divergence | None, float, list[float]]:
    """Recomputes each Group's credits from its recorded scalar rewards (Group order kept), with
    the recorded ``--advantage-estimator`` (``grpo`` with std normalization when the dump has
    none)."""
    estimator = rollout.get("advantage_estimator") or "grpo"
    std_normalize = bool(rollout.get("grpo_std_normalization", True))
    by_group: dict[str, list[DumpedSample]] = {}
    for d in samples:
        by_group.setdefault(d.group_id, []).append(d)
    recomputed: dict[int, float] = {}
    for members in by_group.values():
        rewards = [m.scalar_reward for m in members]
        if any(r is None for r in rewards):
            raise ConfigError(f"group {members[0].group_id} has a sample without a scalar "
                                      "reward; its advantages cannot be recomputed", param="samples")
        credits = group_advantages(estimator, [float(r) for r in rewards],  # type: ignore[arg-type]
                                   std_normalize=std_normalize)
        for m, a in zip(members, credits, strict=True):
            recomputed[m.index] = a
    first: Divergence | None = None
    worst = 0.0
    for d in samples:
        value = recomputed[d.index]
        recorded = math.nan if d.advantage is None else float(d.advantage)
        diff = abs(value - recorded)
        worst = max(worst, diff) if math.isfinite(diff) else math.inf
        if first is None and not diff <= ADVANTAGE_ATOL:
            first = Divergence(kind="advantage", sample=d.index, token=None, recorded=recorded,
                               recomputed=value, tolerance=ADVANTAGE_ATOL,
                               session_id=d.sample.session_id, context=d.sample.name)
    return first, worst, [recomputed[d.index] for d in samples]


def _weight_notes(samples: Sequence[DumpedSample], checkpoint: Path) -> list[str]:
    versions = sorted({span.version for d in samples for span in d.sample.weight_versions})
    if len(versions) > 1:
        return [(f"the samples were generated by weight versions {versions}; {checkpoint} holds one "
                 "of them, so tokens of the others are expected to diverge")]
    return []


def replay_dump(dump: RolloutDump, checkpoint: Path) -> ReplayReport:
    """Recomputes the dumped step with the trainer's functions and finds the first divergence.

    Blocking (torch on CPU); loads ``checkpoint`` once.

    Args:
        dump: a loaded dump (:func:`~relaxtrio.rollout.dumps.load_dump`).
        checkpoint: a Hugging Face model directory with the weights that sampled the step.

    Returns:
        The report; ``report.first`` is None when every value is within tolerance.

    Raises:
        ConfigError: the dump has no samples, has multimodal samples, or a Group lacks
            scalar rewards.
    """
    from ..train import Trainer

    samples = dump.samples
    _check_samples(samples)
    config, notes = train_config_of(dump)
    notes += _weight_notes(samples, checkpoint)
    trainer = Trainer.from_pretrained(checkpoint, config)
    recomputed_logprobs = trainer.compute_logprobs([d.sample for d in samples])
    lp_first, count, worst, mean, above = _logprob_check(samples, recomputed_logprobs)
    divergences = [lp_first] if lp_first else []
    rollout = dump.section("rollout_config") or {}
    skipped = None
    if rollout.get("custom_advantage", False):
        skipped = "custom advantage"
    elif all(d.advantage is None for d in samples):
        skipped = "the dump records no advantages"
    checked = skipped is None
    adv_worst = None
    advantages = [0.0 if d.advantage is None else float(d.advantage) for d in samples]
    if checked:
        adv_first, adv_worst, advantages = _advantage_check(samples, rollout)
        if adv_first:
            divergences.append(adv_first)
    recorded_loss = recomputed_loss = None
    train = dump.section("train")
    if train is not None and train.get("loss") is not None:
        recorded_loss = float(train["loss"])
        scored = [ScoredSample(sample=d.sample, reward=d.scalar_reward, advantage=a)
                  for d, a in zip(samples, advantages, strict=True)]
        recomputed_loss = float(trainer.train_step(scored).loss)
        tolerance = max(LOSS_RTOL * abs(recorded_loss), 1e-6)
        if not abs(recomputed_loss - recorded_loss) <= tolerance:
            divergences.append(Divergence(kind="loss", sample=None, token=None, recorded=recorded_loss,
                                          recomputed=recomputed_loss, tolerance=tolerance))
    return ReplayReport(
        num_samples=len(samples), num_trained_tokens=count, logprob_max_abs_diff=worst,
        logprob_mean_abs_diff=mean, num_logprob_divergences=above, advantages_checked=checked,
        advantages_skipped=skipped,
        advantage_max_abs_diff=adv_worst, recorded_loss=recorded_loss, recomputed_loss=recomputed_loss,
        divergences=tuple(divergences), notes=tuple(notes),
    )


def report_json(report: ReplayReport) -> dict[str, Any]:
    """The report as JSON-ready data (``--json``)."""
    data: Mapping[str, Any] = attrs.asdict(report)
    first = report.first
    return {**data, "first": None if first is None else attrs.asdict(first)}
