"""From one base credit per context to token advantages: KL-shaped returns, then whitening.

The rollout side gives every context one base scalar: an estimator's Group-level credit
(:mod:`relaxtrio.rollout.advantages`) or the custom advantage function's. What follows here is
steps 3 of docs/export-and-credit.md#what-the-trainer-does-with-an-advantage:

1. **returns and token advantages**: the scalar is broadcast over the context's trained tokens;
   with ``kl_coef > 0`` (``--kl-coef``, REINFORCE-style estimators only) each token's return
   carries a reference-KL penalty for the tokens from it to the end (REINFORCE++, arXiv
   2501.03262: per-token reward ``-kl_coef * KL_t`` plus the outcome at the end, ``gamma =
   1``)::

       A_t = A - kl_coef * sum_{s >= t, mask_s = 1} (old_s - ref_s)

   ``old - ref`` is the k1 estimate of KL(old || ref) at the sampled token, from the trainer's
   pre-update logprobs. This is the *reward-shaping* meaning of KL, reported as
   ``reward_shaping_kl``; it is neither ``ppo_kl`` nor ``kl_loss``;
2. **optional whitening** (``--normalize-advantages``): over every trained token of the step,
   ``(A - mean) / sqrt(var + 1e-8)`` (population variance).

Shapes: one ``(len_i,) float32`` tensor per sample, zero off its loss mask.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import torch
from torch import Tensor

from ..config import TrainConfig

__all__ = ["kl_shaped_advantages", "token_advantages", "whiten_advantages"]

WHITEN_EPS: Final = 1e-8
"""Added to the variance before the square root when whitening."""


def kl_shaped_advantages(
    base: Sequence[float],
    loss_masks: Sequence[Tensor],
    *,
    old_logprobs: Sequence[Tensor] | None = None,
    ref_logprobs: Sequence[Tensor] | None = None,
    kl_coef: float = 0.0,
) -> tuple[list[Tensor], float | None]:
    """Broadcast each sample's base credit over its trained tokens, KL-shaped when asked.

    Args:
        base: one finite scalar per sample.
        loss_masks: per sample ``(len_i,)``, 1 on trained tokens.
        old_logprobs: per sample ``(len_i,)`` the trainer's pre-update logprobs; needed when
            ``kl_coef > 0``.
        ref_logprobs: per sample ``(len_i,)`` the frozen reference's; needed when
            ``kl_coef > 0``.
        kl_coef: the shaping coefficient (>= 0).

    Returns:
        ``(advantages, shaping_kl)``: per sample ``(len_i,) float32`` (0.0 off the mask), and the
        mean per-token ``old - ref`` over trained tokens (None when ``kl_coef == 0``).

    Raises:
        ValueError: ``kl_coef > 0`` without both logprob lists.
    """
    out: list[Tensor] = []
    if kl_coef <= 0:
        for value, mask in zip(base, loss_masks, strict=True):
            out.append(mask.to(torch.float32) * float(value))
        return out, None
    if old_logprobs is None or ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs old_logprobs and ref_logprobs")
    kl_sum = 0.0
    kl_tokens = 0.0
    for value, mask, old, ref in zip(base, loss_masks, old_logprobs, ref_logprobs, strict=True):
        maskf = mask.to(torch.float32)  # (L,)
        kl = (old.to(torch.float32) - ref.to(torch.float32)) * maskf  # (L,)
        to_go = torch.flip(torch.cumsum(torch.flip(kl, [0]), 0), [0])  # (L,): sum over s >= t
        out.append((float(value) - kl_coef * to_go) * maskf)
        kl_sum += float(kl.sum().item())
        kl_tokens += float(maskf.sum().item())
    return out, kl_sum / kl_tokens if kl_tokens else None


def whiten_advantages(advantages: Sequence[Tensor], loss_masks: Sequence[Tensor]) -> list[Tensor]:
    """Whiten token advantages over every trained token of the step (``--normalize-advantages``).

    Args:
        advantages: per sample ``(len_i,) float32``.
        loss_masks: per sample ``(len_i,)``, 1 on trained tokens.

    Returns:
        Per sample ``(len_i,) float32``: ``(A - mean) / sqrt(var + 1e-8)`` on trained tokens, 0.0
        elsewhere; mean and (population) variance are taken over all trained tokens of all
        samples. Unchanged (all zeros stay zeros) when no token is trained.
    """
    masks = [m.to(torch.bool) for m in loss_masks]
    values = torch.cat([a[m] for a, m in zip(advantages, masks, strict=True)])  # (N,)
    if values.numel() == 0:
        return [a.clone() for a in advantages]
    mean = values.mean()
    var = ((values - mean) ** 2).mean()
    scale = torch.rsqrt(var + WHITEN_EPS)
    return [
        torch.where(m, (a - mean) * scale, torch.zeros_like(a))
        for a, m in zip(advantages, masks, strict=True)
    ]


def token_advantages(
    config: TrainConfig,
    base: Sequence[float],
    loss_masks: Sequence[Sequence[int]],
    old_by_sample: Mapping[int, Tensor] | None,
    ref_by_sample: Mapping[int, Tensor] | None,
) -> tuple[list[Tensor], dict[str, float]]:
    """A step's token advantages as ``config`` asks: shaping (``kl_coef``), then whitening.

    Args:
        config: the trainer settings.
        base: one base credit per sample.
        loss_masks: per sample, the (possibly off-policy masked) loss mask.
        old_by_sample: ``{i: (len_i,)}`` pre-update logprobs, needed when ``kl_coef > 0``.
        ref_by_sample: ``{i: (len_i,)}`` reference logprobs, needed when ``kl_coef > 0``.

    Returns:
        ``(advantages, stats)``: per sample ``(len_i,) float32`` on CPU; stats
        ``reward_shaping_kl`` (when shaping), ``advantage_mean`` and ``advantage_std`` over
        trained tokens (when any).
    """
    masks = [torch.tensor(m, dtype=torch.float32) for m in loss_masks]
    shaping = config.kl_coef > 0
    order = range(len(masks))
    old = [old_by_sample[i].cpu() for i in order] if shaping and old_by_sample is not None else None
    ref = [ref_by_sample[i].cpu() for i in order] if shaping and ref_by_sample is not None else None
    advantages, shaping_kl = kl_shaped_advantages(
        base, masks, old_logprobs=old, ref_logprobs=ref, kl_coef=config.kl_coef
    )
    stats: dict[str, float] = {}
    if shaping_kl is not None:
        stats["reward_shaping_kl"] = shaping_kl
    if config.normalize_advantages:
        advantages = whiten_advantages(advantages, masks)
    values = torch.cat([a[m.bool()] for a, m in zip(advantages, masks, strict=True)])  # (N,)
    if values.numel():
        stats["advantage_mean"] = float(values.mean().item())
        stats["advantage_std"] = float(values.std(correction=0).item())
    return advantages, stats
