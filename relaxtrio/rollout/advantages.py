"""Rewards to advantages: the primary reward scalar and GRPO's within-Group normalization.

Pure Python (no torch): the rollout side turns each context's reward into one float, and the
trainer broadcasts that float over the context's response tokens (``loss_mask == 1``).

GRPO with outcome supervision (DeepSeekMath, arXiv 2402.03300, section 4.1.2) gives every token of
output ``i`` in a Group the advantage ``(r_i - mean(r)) / std(r)``. Dr. GRPO (arXiv 2503.20783,
section 3.1) argues the division by ``std`` biases the update towards too-easy and too-hard prompts and
drops it; ``std_normalize=False`` selects that variant. Deviations from the papers, on purpose:

- ``std`` is the population standard deviation (divide by ``n``, not ``n - 1``), so a Group of two
  rewards ``(0, 1)`` gives ``(-1, +1)``; DeepSeekMath does not specify which one it uses.
- ``eps`` is added to ``std`` so a Group whose rewards are nearly equal cannot blow up, and a
  Group whose rewards are exactly equal gets exactly 0.0 advantages (no signal), whatever ``eps``.

Custom advantage (docs/export-and-credit.md#custom-advantage) bypasses this module entirely: the
hook's scalar already is the base credit of one context.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from .._errors import ExportError
from .._validate import is_real, require_real

__all__ = ["grpo_advantages", "scalar_reward"]


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
    values = [require_real(reward, f"rewards[{index}]", error=ValueError)
              for index, reward in enumerate(rewards)]
    if not values or min(values) == max(values):
        # Exactly equal rewards carry no relative signal; don't let rounding of the mean leak in.
        return [0.0] * len(values)
    n = len(values)
    mean = math.fsum(values) / n
    centered = [value - mean for value in values]
    if not std_normalize:
        return centered
    std = math.sqrt(math.fsum(c * c for c in centered) / n)  # population std
    return [c / (std + eps) for c in centered]


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
