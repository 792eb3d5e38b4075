"""The policy objective's terms: the clipped surrogate, a reference-KL loss, and their reduction.

Every function here is pure: no globals, no optimizer, no module state. Shapes use ``B`` = samples in
the (micro-)batch, ``T`` = padded sequence length in tokens. Positions follow
:mod:`relaxtrio.train.logprobs`: ``logprobs[b, t]`` scores ``token_ids[b, t]``; only
``loss_mask == 1`` positions count, and garbage (``inf``/``nan``) elsewhere never reaches a value
or a gradient.

The word KL names three different things (docs/export-and-credit.md#three-meanings-of-kl); here
only two of them live, under distinct names:

* ``ppo_kl`` / ``approx_kl_k3``: statistics of the old/current log ratio that the clip acts on
  (:func:`policy_loss`);
* ``kl_loss``: the independent reference-policy KL loss term (:func:`reference_kl`,
  ``--use-kl-loss``).

The third, reference-KL reward shaping inside an estimator's returns (``--kl-coef``), is built
before the loss, in :mod:`relaxtrio.train.estimators`.
"""

from __future__ import annotations

from typing import Final

import attrs
import torch
from torch import Tensor

from ..config import KlLossType, LossAggregation, PolicyRatio

__all__ = ["LossDenominators", "aggregate", "policy_loss", "reference_kl"]

_MAX_LOG_RATIO: Final = 20.0
"""``|log ratio|`` is clamped to this before ``exp``, so a broken old logprob cannot overflow."""

_LOW_VAR_KL_BOUND: Final = 10.0
"""``low_var_kl`` clamps each token's k3 estimate to ``[-10, 10]`` (its only difference from k3)."""


@attrs.frozen(kw_only=True)
class LossDenominators:
    """The counts a reduction divides by, fixed per minibatch so micro-batches add up.

    Gradient accumulation sums the micro-batch losses; each must therefore be divided by the
    whole minibatch's counts, never by its own, for the sum to equal the unsplit loss.

    Attributes:
        num_tokens: trained tokens of the minibatch (``token_mean``).
        num_samples: samples of the minibatch with at least one trained token
            (``sequence_mean``, ``sequence_sum_norm``).
        norm_tokens: Dr. GRPO's constant length normaliser in tokens (``sequence_sum_norm``).
    """

    num_tokens: float
    num_samples: float
    norm_tokens: float

    @classmethod
    def of(cls, loss_mask: Tensor, *, norm_tokens: float | None = None) -> LossDenominators:
        """The counts of one batch alone.

        Args:
            loss_mask: ``(B, T)`` 1 on trained tokens.
            norm_tokens: the ``sequence_sum_norm`` constant; None uses the longest row's
                trained-token count.
        """
        per_row = loss_mask.to(torch.float32).sum(-1)  # (B,)
        longest = float(per_row.max().item()) if per_row.numel() else 0.0
        return cls(
            num_tokens=float(per_row.sum().item()),
            num_samples=float((per_row > 0).sum().item()),
            norm_tokens=float(norm_tokens) if norm_tokens is not None else longest,
        )


def aggregate(
    values: Tensor,
    loss_mask: Tensor,
    mode: LossAggregation = "token_mean",
    denominators: LossDenominators | None = None,
) -> Tensor:
    """Reduce a per-token loss term to one number (``--loss-aggregation``).

    With ``n_b`` trained tokens in row ``b``, ``N = sum_b n_b`` and ``S`` rows with ``n_b > 0``:

    * ``token_mean``: ``sum_{b,t} v / N``: DAPO's token-level loss (arXiv 2503.14476, section 3.3), long
      responses are not down-weighted (the default);
    * ``sequence_mean``: ``sum_b (sum_t v / n_b) / S``: GRPO's objective as written
      (DeepSeekMath, arXiv 2402.03300, eq. 3);
    * ``sequence_sum_norm``: ``sum_b (sum_t v / L) / S`` with a constant ``L``: Dr. GRPO
      (arXiv 2503.20783, section 3.1) removes the per-response ``1 / n_b`` length bias.

    Args:
        values: ``(B, T) float32`` per-token terms (already zero or arbitrary off the mask).
        loss_mask: ``(B, T)`` 1 on trained tokens.
        mode: the reduction.
        denominators: minibatch-wide counts; None uses this batch's own
            (:meth:`LossDenominators.of`).

    Returns:
        A 0-dim float32 tensor; 0.0 when nothing is trained.
    """
    mask = loss_mask.bool()
    den = denominators if denominators is not None else LossDenominators.of(loss_mask)
    masked = torch.where(mask, values, torch.zeros_like(values))  # (B, T)
    if mode == "token_mean":
        return masked.sum() / max(den.num_tokens, 1.0)
    per_row = masked.sum(-1)  # (B,)
    if mode == "sequence_mean":
        per_row = per_row / mask.to(torch.float32).sum(-1).clamp(min=1.0)
    elif mode == "sequence_sum_norm":
        per_row = per_row / max(den.norm_tokens, 1.0)
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}")
    return per_row.sum() / max(den.num_samples, 1.0)


def reference_kl(logprobs: Tensor, ref_logprobs: Tensor, kind: KlLossType = "k1") -> Tensor:
    """Per-token estimate of KL(current || reference) for the KL loss (``--kl-loss-type``).

    With ``d = logprobs - ref_logprobs`` at the sampled token (Schulman, "Approximating KL
    Divergence", 2020):

    * ``k1``: ``d`` (unbiased, high variance, can be negative);
    * ``k2``: ``d**2 / 2`` (biased, low variance, >= 0);
    * ``k3``: ``exp(-d) - 1 + d`` (unbiased, >= 0; the KL term of DeepSeekMath eq. 4);
    * ``low_var_kl``: k3 with ``d`` clamped to ``[-20, 20]`` and the result to ``[-10, 10]``
      (verl's name for a bounded k3).

    Args:
        logprobs: ``(B, T) float32`` current policy, with grad.
        ref_logprobs: ``(B, T) float32`` frozen reference policy (treated as a constant).
        kind: the estimator.

    Returns:
        ``(B, T) float32``; reduce it with :func:`aggregate` over the loss mask.
    """
    d = logprobs - ref_logprobs.detach()  # (B, T)
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        return torch.exp(-d) - 1.0 + d
    if kind == "low_var_kl":
        d = d.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        return (torch.exp(-d) - 1.0 + d).clamp(-_LOW_VAR_KL_BOUND, _LOW_VAR_KL_BOUND)
    raise ValueError(f"unknown kl loss type {kind!r}")


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    clip_ratio_c: float | None = None,
    policy_ratio: PolicyRatio = "token",
    token_weights: Tensor | None = None,
    aggregation: LossAggregation = "token_mean",
    denominators: LossDenominators | None = None,
    loss_denominator_tokens: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with token-level advantages.

    Per masked token, with ``ratio = exp(logprobs - old_logprobs)`` (PPO, Schulman et al. 2017,
    arXiv 1707.06347, eq. 7)::

        loss_t = -min(ratio * A_t, clip(ratio, 1 - clip_eps_low, 1 + clip_eps_high) * A_t)

    ``clip_eps_high > clip_eps_low`` is DAPO's "clip-higher" (arXiv 2503.14476, section 3.1), which
    leaves low-probability tokens more room to grow. Options, in the order they apply:

    * ``policy_ratio="sequence"``: GSPO (arXiv 2507.18071): every token of a row uses the row's
      length-normalized ratio, clipped as a whole (:func:`_log_ratios`);
    * ``clip_ratio_c``: dual-clip PPO (arXiv 1912.09729): for ``A_t < 0`` the loss is also capped
      at ``-clip_ratio_c * A_t`` (:func:`_clipped_loss`);
    * ``token_weights``: constant per-token factors on the loss (truncated importance weights,
      IcePop or OPSM masks from :mod:`relaxtrio.train.offpolicy`); a weight 0 removes the token's
      gradient but it still counts in the denominators.

    ``|log ratio|`` is clamped to 20 before ``exp`` (a no-op in normal training). The reduction is
    :func:`aggregate`'s ``aggregation`` (default: token mean).

    Args:
        logprobs: ``(B, T) float32``, current policy, with grad.
        old_logprobs: ``(B, T) float32``, behaviour policy (treated as a constant).
        advantages: ``(B, T) float32``, per-token advantage (treated as a constant).
        loss_mask: ``(B, T)`` float or int, 1 on trained tokens, 0 elsewhere.
        clip_eps_low: lower clip range; the ratio is clipped at ``1 - clip_eps_low``.
        clip_eps_high: upper clip range; the ratio is clipped at ``1 + clip_eps_high``.
        clip_ratio_c: dual-clip bound (> 1), or None.
        policy_ratio: ``token`` (PPO) or ``sequence`` (GSPO).
        token_weights: ``(B, T) float32`` or None; detached before use.
        aggregation: ``token_mean``, ``sequence_mean`` or ``sequence_sum_norm``.
        denominators: minibatch-wide counts for gradient accumulation; None uses this batch's.
        loss_denominator_tokens: shorthand for ``denominators`` with only ``num_tokens`` changed
            (``token_mean`` accumulation). Stats are unaffected by either.

    Returns:
        ``(loss, stats)``: ``loss`` is a 0-dim float32 tensor (0.0 with no masked tokens);
        ``stats`` are floats over this call's masked tokens, as :func:`_policy_stats` defines them
        (``pg_loss``, ``clip_fraction``, ``dual_clip_fraction``, ``ppo_kl``, ``approx_kl_k3``,
        ``ratio_mean``, ``num_tokens``).

    Raises:
        ValueError: the tensors differ in shape, a clip range is negative, or ``clip_ratio_c``
            is not above 1.
    """
    _check_policy_inputs(logprobs, old_logprobs, advantages, loss_mask, token_weights,
                         clip_eps_low, clip_eps_high, clip_ratio_c)
    mask = loss_mask.bool()  # (B, T)
    zero = torch.zeros_like(logprobs)
    token_log_ratio, log_ratio = _log_ratios(logprobs, old_logprobs, mask, policy_ratio)
    adv = torch.where(mask, advantages.detach().to(torch.float32), zero)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    per_token, clip_active, dual = _clipped_loss(adv, ratio, mask, clip_eps_low, clip_eps_high, clip_ratio_c)
    if token_weights is not None:
        per_token = per_token * torch.where(mask, token_weights.detach().to(torch.float32), zero)
    per_token = per_token * mask.to(torch.float32)  # (B, T)
    if denominators is None:
        denominators = LossDenominators.of(loss_mask)
    if loss_denominator_tokens is not None:
        denominators = attrs.evolve(denominators, num_tokens=float(loss_denominator_tokens))
    loss = aggregate(per_token, loss_mask, aggregation, denominators)
    return loss, _policy_stats(per_token, clip_active, dual, token_log_ratio, ratio, mask)


def _check_policy_inputs(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, loss_mask: Tensor,
                         token_weights: Tensor | None, clip_eps_low: float, clip_eps_high: float,
                         clip_ratio_c: float | None) -> None:
    """Raises :func:`policy_loss`'s ``ValueError`` for unequal shapes or bad clip settings."""
    shapes = [logprobs.shape, old_logprobs.shape, advantages.shape, loss_mask.shape]
    if token_weights is not None:
        shapes.append(token_weights.shape)
    if any(shape != shapes[0] for shape in shapes):
        raise ValueError(
            "policy_loss needs equal shapes, got logprobs "
            f"{tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)}, advantages "
            f"{tuple(advantages.shape)}, loss_mask {tuple(loss_mask.shape)}"
            + ("" if token_weights is None else f", token_weights {tuple(token_weights.shape)}")
        )
    if clip_eps_low < 0 or clip_eps_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got {clip_eps_low}, {clip_eps_high}")
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")


def _log_ratios(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor,
                policy_ratio: PolicyRatio) -> tuple[Tensor, Tensor]:
    """``(token_log_ratio, log_ratio)``, both ``(B, T) float32`` and 0 off the mask: the clamped
    per-token ``logprobs - old_logprobs``, and the log ratio the clip acts on.

    With ``policy_ratio="sequence"`` (GSPO, arXiv 2507.18071, its sequence-level ratio and
    GSPO-token variant) every token of row ``b`` uses the row's length-normalized ratio
    ``s_b = exp(mean_t(logprobs - old_logprobs))``; the gradient reaches each token as
    ``s_b * grad log p_t`` (``sg[s_b] * p_t / sg[p_t]``), so with per-sequence advantages and
    ``sequence_mean`` this is GSPO's sequence objective exactly.

    Raises:
        ValueError: an unknown ``policy_ratio``.
    """
    zero = torch.zeros_like(logprobs)
    # where() before any arithmetic so garbage at unmasked positions never reaches a gradient.
    token_log_ratio = torch.where(mask, logprobs - old_logprobs.detach(), zero)  # (B, T)
    token_log_ratio = token_log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    if policy_ratio == "token":
        return token_log_ratio, token_log_ratio
    if policy_ratio != "sequence":
        raise ValueError(f"unknown policy ratio {policy_ratio!r}")
    per_row = mask.to(torch.float32).sum(-1).clamp(min=1.0)  # (B,)
    seq = (token_log_ratio.detach().sum(-1) / per_row).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    current = torch.where(mask, logprobs, zero)  # (B, T)
    return token_log_ratio, torch.where(mask, seq[:, None] + current - current.detach(), zero)


def _clipped_loss(adv: Tensor, ratio: Tensor, mask: Tensor, clip_eps_low: float, clip_eps_high: float,
                  clip_ratio_c: float | None) -> tuple[Tensor, Tensor, Tensor]:
    """``(per_token, clip_active, dual)``: the clipped surrogate per token ``(B, T) float32``, where
    the clipped term is the active one and where the dual clip capped it (``(B, T) bool``).

    Dual-clip PPO (Ye et al., arXiv 1912.09729, section "Dual-clip PPO"): with ``clip_ratio_c``,
    for ``A_t < 0`` the loss is also capped at ``-clip_ratio_c * A_t``, so a huge ratio on a bad
    token cannot dominate the update.
    """
    unclipped = -adv * ratio  # (B, T)
    clipped = -adv * ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high)  # (B, T)
    per_token = torch.maximum(unclipped, clipped)  # (B, T)
    dual = torch.zeros_like(mask)
    if clip_ratio_c is not None:
        cap = -adv * clip_ratio_c  # (B, T): binding only where A < 0
        dual = (adv < 0) & (per_token > cap) & mask
        per_token = torch.where(adv < 0, torch.minimum(per_token, cap), per_token)
    return per_token, clipped > unclipped, dual


@torch.no_grad()
def _policy_stats(
    per_token: Tensor, clip_active: Tensor, dual: Tensor, token_log_ratio: Tensor, ratio: Tensor,
    mask: Tensor,
) -> dict[str, float]:
    """The stats of :func:`policy_loss`, averaged over masked tokens with one device sync:
    ``pg_loss`` (the token mean of the weighted per-token loss, whatever the aggregation),
    ``clip_fraction`` (fraction of tokens where the clipped term is the active one, i.e. the token
    gets no gradient), ``dual_clip_fraction`` (tokens capped by the dual clip), ``ppo_kl`` (k1
    estimator of KL(old || new): mean of ``old_logprobs - logprobs``), ``approx_kl_k3`` (k3
    estimator ``ratio - 1 - log ratio``, Schulman 2020, always >= 0; both KL stats use the clamped
    per-token log ratio), ``ratio_mean`` (of the ratio the clip acts on), and ``num_tokens``
    (masked tokens in this call).

    Args:
        per_token: ``(B, T) float32`` masked (weighted) per-token losses.
        clip_active: ``(B, T) bool``, where the clipped term is the active one.
        dual: ``(B, T) bool``, where the dual clip capped the loss.
        token_log_ratio: ``(B, T) float32`` clamped per-token ``logprobs - old_logprobs``.
        ratio: ``(B, T) float32`` the ratio the clip acted on (per token or per sequence).
        mask: ``(B, T) bool`` trained tokens.
    """
    maskf = mask.to(torch.float32)
    lr_d = token_log_ratio.detach()
    sums = torch.stack(
        [
            per_token.detach().sum(),
            (clip_active & mask).to(torch.float32).sum(),
            dual.to(torch.float32).sum(),
            (-lr_d * maskf).sum(),
            ((torch.exp(lr_d) - 1.0 - lr_d) * maskf).sum(),
            (ratio.detach() * maskf).sum(),
            maskf.sum(),
        ]
    ).tolist()  # one device sync for all stats
    count = max(sums[-1], 1.0)
    names = ("pg_loss", "clip_fraction", "dual_clip_fraction", "ppo_kl", "approx_kl_k3", "ratio_mean")
    stats = {name: value / count for name, value in zip(names, sums[:-1], strict=True)}
    stats["num_tokens"] = sums[-1]
    return stats
