"""Corrections for tokens the trainer's policy did not sample: importance weights and masks.

Rollout logprobs come from the engine (``pi_rollout``); the trainer recomputes the same tokens with
its own weights before the update (``pi_old``) and during it (``pi_theta``). Engine kernels,
batching, and weights carried over from earlier steps (partial rollout, fully async) make
``pi_rollout != pi_old``. Each function here answers one way to deal with that mismatch; all of
them return constants (no grad) that :func:`relaxtrio.train.loss.policy_loss` multiplies into
the per-token loss, or a loss mask. Shapes: ``(B, T)`` as in :mod:`relaxtrio.train.loss`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Protocol

import torch
from torch import Tensor

from ..config import TrainConfig

__all__ = ["SpanLike", "icepop_weights", "newest_version_loss_mask", "offpolicy_token_weights", "opsm_mask", "tis_weights"]

_MAX_LOG_RATIO: Final = 20.0


class SpanLike(Protocol):
    """A ``relaxtrio.forest.WeightSpan``: the weight version that sampled ``[start, end)``."""

    @property
    def version(self) -> str: ...

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


def _mismatch_ratio(old_logprobs: Tensor, rollout_logprobs: Tensor, loss_mask: Tensor) -> Tensor:
    """``exp(old - rollout)`` on the mask (1.0 elsewhere), log clamped to ``[-20, 20]``."""
    mask = loss_mask.bool()
    log_k = torch.where(mask, old_logprobs - rollout_logprobs, torch.zeros_like(old_logprobs))
    return torch.exp(log_k.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)).detach()  # (B, T)


@torch.no_grad()
def tis_weights(
    old_logprobs: Tensor,
    rollout_logprobs: Tensor,
    loss_mask: Tensor,
    *,
    clip_high: float,
    clip_low: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """Truncated importance sampling weights between the trainer and the engine (``--use-tis``).

    ``w_t = clamp(pi_old(y_t) / pi_rollout(y_t), clip_low, clip_high)``: the rollout was sampled
    from ``pi_rollout`` while the objective is defined under ``pi_old``; truncation bounds the
    variance (Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training", 2025, the truncated-IS correction).

    Args:
        old_logprobs: ``(B, T)`` the trainer's pre-update logprobs.
        rollout_logprobs: ``(B, T)`` the engine's.
        loss_mask: ``(B, T)``.
        clip_high: ``--tis-clip`` (upper clamp, > 0).
        clip_low: ``--tis-clip-low`` (lower clamp, >= 0).

    Returns:
        ``(weights, stats)``: weights ``(B, T) float32`` (1.0 off the mask); stats
        ``tis_weight_mean`` and ``tis_clip_fraction`` (tokens whose weight was clamped) over the
        masked tokens, and their count ``num_tokens``.
    """
    mask = loss_mask.bool()
    k = _mismatch_ratio(old_logprobs, rollout_logprobs, loss_mask)  # (B, T)
    w = k.clamp(clip_low, clip_high)
    w = torch.where(mask, w, torch.ones_like(w))
    n = max(float(mask.sum().item()), 1.0)
    return w, {
        "tis_weight_mean": float(w[mask].sum().item()) / n,
        "tis_clip_fraction": float(((k != w) & mask).sum().item()) / n,
    }


@torch.no_grad()
def icepop_weights(
    old_logprobs: Tensor,
    rollout_logprobs: Tensor,
    loss_mask: Tensor,
    *,
    low: float,
    high: float,
) -> tuple[Tensor, dict[str, float]]:
    """IcePop-style masked importance weights (``--use-icepop``).

    ``w_t = k_t`` where ``low <= k_t <= high`` and 0 elsewhere, ``k_t = pi_old / pi_rollout``:
    tokens whose trainer and engine probabilities disagree too much are dropped from the gradient
    instead of being truncated (IcePop, Ling Team, Ring-1T report, arXiv 2510.18855, the
    masked-IS objective; their defaults are ``low = 0.5``, ``high = 5``).

    Args:
        old_logprobs: ``(B, T)`` the trainer's pre-update logprobs.
        rollout_logprobs: ``(B, T)`` the engine's.
        loss_mask: ``(B, T)``.
        low: lower bound of the kept band.
        high: upper bound of the kept band.

    Returns:
        ``(weights, stats)``: weights ``(B, T) float32`` (1.0 off the mask); stats
        ``icepop_masked_fraction`` over the masked tokens.
    """
    mask = loss_mask.bool()
    k = _mismatch_ratio(old_logprobs, rollout_logprobs, loss_mask)  # (B, T)
    keep = (k >= low) & (k <= high)
    w = torch.where(keep, k, torch.zeros_like(k))
    w = torch.where(mask, w, torch.ones_like(w))
    n = max(float(mask.sum().item()), 1.0)
    return w, {"icepop_masked_fraction": float((~keep & mask).sum().item()) / n}


@torch.no_grad()
def opsm_mask(
    rollout_logprobs: Tensor,
    logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    delta: float,
) -> tuple[Tensor, dict[str, float]]:
    """Off-policy sequence masking (``--use-opsm``; DeepSeek-V3.2, arXiv 2512.02556, its
    "Off-Policy Sequence Masking").

    Row ``b``'s tokens with a negative advantage are masked when the row drifted too far from the
    policy that sampled it: ``mean_t(log pi_rollout(y_t) - log pi_theta(y_t)) > delta`` over the
    row's trained tokens. Learning from one's own mistakes is useful; learning from another
    policy's far-off mistakes mostly destabilizes.

    Args:
        rollout_logprobs: ``(B, T)`` the behaviour (engine) policy.
        logprobs: ``(B, T)`` the current policy (detached here).
        advantages: ``(B, T)`` per-token advantages.
        loss_mask: ``(B, T)``.
        delta: the threshold in nats per token (``--opsm-delta``).

    Returns:
        ``(mask, stats)``: ``(B, T) float32`` of 0.0/1.0 (1.0 off the loss mask); stats
        ``opsm_masked_fraction`` over the masked tokens.
    """
    mask = loss_mask.bool()
    maskf = mask.to(torch.float32)
    diff = torch.where(mask, rollout_logprobs - logprobs.detach(), torch.zeros_like(logprobs))
    seq_kl = diff.sum(-1) / maskf.sum(-1).clamp(min=1.0)  # (B,)
    drop = (advantages < 0) & (seq_kl[:, None] > delta) & mask  # (B, T)
    n = max(float(mask.sum().item()), 1.0)
    return (~drop).to(torch.float32), {"opsm_masked_fraction": float(drop.sum().item()) / n}


def offpolicy_token_weights(
    config: TrainConfig,
    *,
    old: Tensor,
    rollout: Tensor,
    logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
) -> tuple[Tensor | None, dict[str, float]]:
    """The per-token factors ``config`` asks for: TIS or IcePop weights, times the OPSM mask.

    Args:
        config: the trainer settings (``use_tis``, ``use_icepop``, ``use_opsm`` and their bounds).
        old: ``(B, T)`` the trainer's pre-update logprobs.
        rollout: ``(B, T)`` the engine's.
        logprobs: ``(B, T)`` the current policy's (OPSM; detached here).
        advantages: ``(B, T)``.
        loss_mask: ``(B, T)``.

    Returns:
        ``(weights, stats)``: ``(B, T)`` factors for ``policy_loss(token_weights=...)``, or None
        when every correction is off; the corrections' stats.
    """
    weights: Tensor | None = None
    stats: dict[str, float] = {}
    if config.use_tis:
        weights, stats = tis_weights(old, rollout, loss_mask, clip_high=config.tis_clip,
                                     clip_low=config.tis_clip_low)
    elif config.use_icepop:
        weights, stats = icepop_weights(old, rollout, loss_mask, low=config.icepop_low,
                                        high=config.icepop_high)
    if config.use_opsm:
        keep, opsm_stats = opsm_mask(rollout, logprobs, advantages, loss_mask, delta=config.opsm_delta)
        weights = keep if weights is None else weights * keep
        stats.update(opsm_stats)
    return weights, stats


def trained_loss_masks(samples: Sequence[Any], *, mask_offpolicy: bool) -> list[list[int]]:
    """Every sample's loss mask as the step trains it: as exported, or with
    ``mask_offpolicy`` (``--mask-offpolicy-in-partial-rollout``) only the tokens of its newest
    weight version (:func:`newest_version_loss_mask`; a sample without ``weight_versions`` keeps
    its mask)."""
    if not mask_offpolicy:
        return [list(s.loss_mask) for s in samples]
    return [newest_version_loss_mask(s.loss_mask, getattr(s, "weight_versions", ())) for s in samples]


def newest_version_loss_mask(loss_mask: Sequence[int], weight_versions: Sequence[SpanLike]) -> list[int]:
    """``--mask-offpolicy-in-partial-rollout``: keep only tokens the newest weights sampled.

    With partial rollout or fully async a context can carry tokens from several weight versions:
    an aborted request resumed after a weight update, or earlier turns generated in an earlier
    step. The newest version is the one of the last attempt (the last span in token order); every
    trained token inside a span of another version gets loss mask 0 (it still conditions the
    later tokens). Tokens outside every span keep their mask.

    Args:
        loss_mask: the sample's loss mask, ``len == len(token_ids)``.
        weight_versions: the sample's spans (``version``, ``start``, ``end`` in token
            coordinates, lineage order).

    Returns:
        The new loss mask, same length.
    """
    out = list(loss_mask)
    spans = [s for s in weight_versions if s.end > s.start]
    if not spans:
        return out
    newest = max(spans, key=lambda s: s.end).version
    for span in spans:
        if span.version != newest:
            for t in range(span.start, min(span.end, len(out))):
                out[t] = 0
    return out
