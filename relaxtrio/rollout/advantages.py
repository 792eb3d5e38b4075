"""Rewards to advantages: the primary reward scalar and each estimator's Group-level credit.

Pure Python (no torch): the rollout side turns each context's reward into one float, the
estimator turns a Group's rewards into one base credit per context, and the trainer broadcasts
that float over the context's response tokens (``loss_mask == 1``), where KL shaping and
whitening may follow (:mod:`relaxtrio.train.estimators`).

Estimators (``--advantage-estimator``), for a Group of ``n`` rewards ``r`` with mean ``m``:

- ``grpo``: GRPO with outcome supervision (DeepSeekMath, arXiv 2402.03300, section 4.1.2) gives every
  token of output ``i`` the advantage ``(r_i - m) / std(r)``.
- ``dr_grpo``: Dr. GRPO (arXiv 2503.20783, section 3.1) argues the division by ``std`` biases the update
  towards too-easy and too-hard prompts and drops it: ``r_i - m``. (``grpo`` with
  ``std_normalize=False`` is the same.) The paper also drops GRPO's per-response length
  normalization; that is the loss side's ``sequence_sum_norm`` aggregation.
- ``rloo``: REINFORCE Leave-One-Out (Ahmadian et al., "Back to Basics", arXiv 2402.14740, its
  leave-one-out estimator, after Kool et al. 2019): the baseline of sample ``i`` is the mean of
  the *other* ``n - 1`` rewards, ``r_i - (sum(r) - r_i) / (n - 1) = n / (n - 1) * (r_i - m)``.
- ``reinforce_plus_plus_baseline``: REINFORCE++-baseline (Hu et al., arXiv 2501.03262, the
  -baseline variant): subtract the Group mean, ``r_i - m``; the method then normalizes by the
  *batch* statistics, which the trainer does over every trained token of the step
  (``normalize_advantages``).
- ``gspo``: GSPO (arXiv 2507.18071) keeps GRPO's Group-normalized credit and changes the
  policy ratio to a sequence-level one; the credit here is ``grpo``'s.

Deviations from the papers, on purpose:

- ``std`` is the population standard deviation (divide by ``n``, not ``n - 1``), so a Group of two
  rewards ``(0, 1)`` gives ``(-1, +1)``; DeepSeekMath does not specify which one it uses.
- ``eps`` is added to ``std`` so a Group whose rewards are nearly equal cannot blow up, and a
  Group whose rewards are exactly equal gets exactly 0.0 advantages (no signal), whatever ``eps``.
- A Group of one context gets 0.0 from every estimator (RLOO's baseline is undefined there).

Custom advantage (docs/export-and-credit.md#what-the-trainer-does-with-an-advantage) bypasses this module entirely: the
hook's scalar already is the base credit of one context.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .._errors import ExportError
from .._validate import is_real, require_real
from ..config import AdvantageEstimator

__all__ = [
    "dr_grpo_advantages",
    "group_advantages",
    "grpo_advantages",
    "reinforce_plus_plus_baseline_advantages",
    "primary_rewards",
    "rloo_advantages",
    "scalar_reward",
]


def grpo_advantages(
    rewards: Sequence[float], *, std_normalize: bool = True, eps: float = 1e-6
) -> list[float]:
    """Normalize one Group's rewards into per-context advantages.

    Args:
        rewards: one finite scalar reward per context of the Group, length ``n`` (``n >= 0``),
            in the Group's Session order.
        std_normalize: True (default) divides the centered rewards by ``std + eps`` (GRPO,
            arXiv 2402.03300 section 4.1.2); False only subtracts the mean (Dr. GRPO, arXiv 2503.20783).
        eps: added to the population standard deviation before dividing; must be >= 0.

    Returns:
        ``n`` advantages in the same order: ``(r_i - mean) / (std + eps)``, or ``r_i - mean``
        without std normalization. Their mean is 0 (up to float rounding). A Group of one
        context, or one whose rewards are all equal, gets all zeros. An empty Group gives ``[]``.

    Raises:
        ValueError: a reward is not a finite real number (``nan``, ``inf``, a bool or a
            non-number), or ``eps`` is negative.
    """
    if not (is_real(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    centered = _centered(rewards)
    if not std_normalize or not any(centered):
        return centered
    n = len(centered)
    std = math.sqrt(math.fsum(c * c for c in centered) / n)  # population std
    return [c / (std + eps) for c in centered]


def dr_grpo_advantages(rewards: Sequence[float]) -> list[float]:
    """Dr. GRPO credit: the Group-centered rewards ``r_i - mean(r)`` (arXiv 2503.20783, section 3.1).

    Raises:
        ValueError: a reward is not a finite real number.
    """
    return _centered(rewards)


def rloo_advantages(rewards: Sequence[float]) -> list[float]:
    """RLOO credit: each reward minus the mean of the Group's *other* rewards (arXiv 2402.14740).

    ``r_i - (sum(r) - r_i) / (n - 1)``, computed as ``n / (n - 1) * (r_i - mean(r))``. A Group of
    one context has no other sample to compare with and gets ``[0.0]``.

    Raises:
        ValueError: a reward is not a finite real number.
    """
    centered = _centered(rewards)
    n = len(centered)
    if n < 2:
        return [0.0] * n
    return [c * n / (n - 1) for c in centered]


def reinforce_plus_plus_baseline_advantages(rewards: Sequence[float]) -> list[float]:
    """REINFORCE++-baseline's Group step: ``r_i - mean(r)`` (arXiv 2501.03262, the -baseline variant).

    The batch-level normalization that follows is the trainer's whitening
    (``TrainConfig.normalize_advantages``, turned on for this estimator).

    Raises:
        ValueError: a reward is not a finite real number.
    """
    return _centered(rewards)


def group_advantages(
    estimator: AdvantageEstimator, rewards: Sequence[float], *, std_normalize: bool = True
) -> list[float]:
    """One Group's base credit per context with the chosen ``--advantage-estimator``.

    Args:
        estimator: ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_plus_plus_baseline`` or
            ``gspo`` (whose credit is GRPO's).
        rewards: one finite reward per context, Session order, length ``n``.
        std_normalize: for ``grpo`` / ``gspo`` only: divide by the Group's std (default).

    Returns:
        ``n`` credits in the same order.

    Raises:
        ValueError: unknown estimator, or a reward that is not a finite real number.
    """
    if estimator in ("grpo", "gspo"):
        return grpo_advantages(rewards, std_normalize=std_normalize)
    if estimator == "dr_grpo":
        return dr_grpo_advantages(rewards)
    if estimator == "rloo":
        return rloo_advantages(rewards)
    if estimator == "reinforce_plus_plus_baseline":
        return reinforce_plus_plus_baseline_advantages(rewards)
    raise ValueError(f"unknown advantage estimator {estimator!r}")


def _centered(rewards: Sequence[float]) -> list[float]:
    """``r_i - mean(r)``; exactly 0.0 everywhere when all rewards are equal.

    Raises:
        ValueError: ``rewards[i] must be a finite number`` (nan, inf, bools, non-numbers).
    """
    values = [require_real(reward, f"rewards[{index}]", error=ValueError)
              for index, reward in enumerate(rewards)]
    if not values or min(values) == max(values):
        # Exactly equal rewards carry no relative signal; don't let rounding of the mean leak in.
        return [0.0] * len(values)
    mean = math.fsum(values) / len(values)
    return [value - mean for value in values]


def scalar_reward(reward: float | Mapping[str, object] | None, reward_key: str | None) -> float:
    """Pick the primary scalar out of a context's reward.

    A reward is either a number (the task outcome) or an object holding a primary value plus
    numeric helper metrics; ``reward_key`` (``--reward-key``) names the primary value. A numeric
    reward is returned as is even when ``reward_key`` is set, so one configuration serves rows
    of both kinds.

    Args:
        reward: ``TrainingSample.reward``: a number, a mapping ``{str: number, ...}``, or None.
        reward_key: the key of the primary value in a reward object, or None.

    Returns:
        The primary reward as a finite float.

    Raises:
        ExportError: with ``param`` naming the field (a reward is agent output, not a request):
            the reward is missing (None), is a mapping but ``reward_key`` is None or absent from
            it, or the chosen value is not a finite number (bools are rejected, too).
    """
    if reward is None:
        raise ExportError(
            "reward is missing: write a numeric reward (or a reward object with the key chosen by "
            "reward_key) in the Session output, or configure a reward model",
            param="reward",
        )
    if isinstance(reward, Mapping):
        if reward_key is None:
            keys = ", ".join(sorted(map(str, reward))) or "none"
            raise ExportError(
                f"reward is an object (keys: {keys}); configure reward_key to choose its primary "
                "value",
                param="reward",
            )
        if reward_key not in reward:
            keys = ", ".join(sorted(map(str, reward))) or "none"
            raise ExportError(
                f"reward object has no key {reward_key!r} (keys: {keys})",
                param=f"reward.{reward_key}",
            )
        return require_real(reward[reward_key], f"reward.{reward_key}", error=ExportError)
    return require_real(reward, "reward", error=ExportError)


def primary_rewards(samples: Iterable[Any], reward_key: str | None) -> list[float | None]:
    """:func:`scalar_reward` of each sample's ``reward``; None where it is unset or has no
    primary value (a pass rate counts those as not passed)."""
    out: list[float | None] = []
    for sample in samples:
        try:
            out.append(None if sample.reward is None else scalar_reward(sample.reward, reward_key))
        except ExportError:
            out.append(None)
    return out
