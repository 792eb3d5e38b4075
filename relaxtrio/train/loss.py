"""Token log-probabilities and the clipped policy-gradient loss.

Every function here is pure: no globals, no optimizer, no module state. Shapes use ``B`` = samples in
the (micro-)batch, ``T`` = padded sequence length in tokens, ``V`` = vocabulary size.

Position convention (shared with the engine and ``TrainingSample``): ``logprobs[b, t]`` is
``log p(token_ids[b, t] | token_ids[b, :t])``. Position 0 has no context and is always 0.0, and
so are right-padding positions; neither may be in ``loss_mask``.

Temperature convention (SGLang's, and the embedded engine's): a rollout sampled at temperature
``T`` reports ``log_softmax(logits / T)[token]``, and greedy requests (``T < 1e-6``) report the
``T = 1`` distribution. Every logprob here takes the same ``temperature`` so that the trainer's
old, current and reference logprobs describe the distribution the rollout actually sampled
from; see :func:`logprob_temperature`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

import torch
from torch import Tensor

__all__ = [
    "GREEDY_TEMPERATURE",
    "entropy_from_logits",
    "logprob_temperature",
    "logprobs_from_logits",
    "policy_loss",
    "token_logprobs",
]

DEFAULT_CHUNK_TOKENS: Final = 1024
"""Positions reduced at once over the vocabulary; bounds fp32 temporaries to ``chunk * V``."""

_MAX_LOG_RATIO: Final = 20.0
"""``|log ratio|`` is clamped to this before ``exp``, so a broken old logprob cannot overflow."""

GREEDY_TEMPERATURE: Final = 1e-6
"""Sampling temperatures below this are greedy; their logprobs use temperature 1 (SGLang)."""


def logprob_temperature(sampling_temperature: float) -> float:
    """The temperature trainer logprobs must use to match rollout logprobs.

    Args:
        sampling_temperature: the rollout's sampling temperature (``GenerationConfig.temperature``).

    Returns:
        ``sampling_temperature``, or 1.0 for a greedy temperature (``< 1e-6``), whose logprobs
        the engine reports at temperature 1.

    Raises:
        ValueError: the temperature is negative or not finite.
    """
    if not (math.isfinite(sampling_temperature) and sampling_temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {sampling_temperature!r}")
    return 1.0 if sampling_temperature < GREEDY_TEMPERATURE else float(sampling_temperature)


def token_logprobs(
    model: torch.nn.Module,
    token_ids: Tensor,
    attention_mask: Tensor,
    *,
    autocast_bf16: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    model_inputs: Mapping[str, Tensor] | None = None,
    temperature: float = 1.0,
) -> Tensor:
    """Per-token log-probabilities of ``token_ids`` under a causal LM, computed in float32.

    Differentiable when called with grad enabled (the trainer's forward); wrap it in
    ``torch.no_grad()`` for old/reference logprobs.

    Args:
        model: a Hugging Face causal LM (``model(input_ids=..., attention_mask=...).logits``).
        token_ids: ``(B, T) long``, right padded.
        attention_mask: ``(B, T)`` 1 on real tokens, 0 on padding.
        autocast_bf16: run the forward under ``torch.autocast(bfloat16)``. Faster on CPUs with
            AVX512-BF16 but far less exact (mean |error| ~0.05 nats vs ~4e-6 in fp32 on SmolLM2),
            which shows up directly in PPO ratios. The reduction itself stays fp32.
        chunk_tokens: positions reduced per chunk (see :func:`logprobs_from_logits`).
        model_inputs: extra keyword tensors for the forward pass, e.g. a VLM's merged
            ``pixel_values`` / ``image_grid_thw`` / ``mm_token_type_ids``
            (:func:`relaxtrio.train.multimodal.multimodal_model_inputs`); ``token_ids`` then hold
            the processor-expanded placeholders.
        temperature: logits are divided by this before the softmax (> 0; see the module
            docstring and :func:`logprob_temperature`).

    Returns:
        ``(B, T) float32``: ``out[:, 0] == 0``, ``out[b, t] = log p(token_ids[b, t] |
        token_ids[b, :t])`` for real tokens, and 0.0 where ``attention_mask == 0``.
    """
    logits = _forward_logits(
        model, token_ids, attention_mask, autocast_bf16=autocast_bf16, model_inputs=model_inputs
    )
    return logprobs_from_logits(
        logits, token_ids, attention_mask, chunk_tokens=chunk_tokens, temperature=temperature
    )


def _forward_logits(
    model: torch.nn.Module,
    token_ids: Tensor,
    attention_mask: Tensor,
    *,
    autocast_bf16: bool,
    model_inputs: Mapping[str, Tensor] | None = None,
) -> Tensor:
    """One forward pass; returns ``(B, T, V)`` logits (bf16 under autocast, else model dtype)."""
    extra = dict(model_inputs or {})
    with torch.autocast(token_ids.device.type, dtype=torch.bfloat16, enabled=autocast_bf16):
        out = model(input_ids=token_ids, attention_mask=attention_mask, use_cache=False, **extra)
    return out.logits  # (B, T, V)


def logprobs_from_logits(
    logits: Tensor,
    token_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    temperature: float = 1.0,
) -> Tensor:
    """Gather next-token log-probabilities from full-sequence logits, in float32.

    ``log_softmax(x)[y] = x[y] - logsumexp(x)``: only the logsumexp is reduced over ``V``, chunk
    by chunk along ``T``, so no ``(B, T, V)`` log-softmax is ever materialized next to the model's
    own ``(B, T, V)`` logits (the backward of a chunk re-creates one ``(B, chunk, V)`` softmax at
    a time).

    Args:
        logits: ``(B, T, V)`` any float dtype; ``logits[:, t]`` predicts ``token_ids[:, t + 1]``.
        token_ids: ``(B, T) long``.
        attention_mask: ``(B, T)`` or None; positions where it is 0 are set to 0.0.
        chunk_tokens: about how many ``(b, t)`` positions share one ``(B, chunk, V)`` temporary.
        temperature: ``log_softmax(logits / temperature)``; must be > 0. The division happens
            chunk by chunk, so no scaled copy of the whole logits tensor is made.

    Returns:
        ``(B, T) float32`` with ``out[:, 0] == 0`` (see the module docstring).

    Raises:
        ValueError: ``temperature`` is not a finite number > 0.
    """
    _check_temperature(temperature)
    B, T, _ = logits.shape
    targets = token_ids[:, 1:].unsqueeze(-1)  # (B, T - 1, 1)
    step = max(1, chunk_tokens // max(B, 1))
    pieces = []
    for start in range(0, T - 1, step):
        chunk = _scaled(logits[:, start : min(start + step, T - 1)], temperature)  # (B, c, V)
        picked = chunk.gather(-1, targets[:, start : start + chunk.shape[1]]).squeeze(-1)  # (B, c)
        pieces.append(picked - torch.logsumexp(chunk, dim=-1))  # (B, c)
    first = logits.new_zeros((B, 1), dtype=torch.float32)  # (B, 1): position 0 has no context
    out = torch.cat([first, *pieces], dim=1)  # (B, T)
    if attention_mask is not None:
        out = torch.where(attention_mask.bool(), out, torch.zeros_like(out))
    return out


def _check_temperature(temperature: float) -> None:
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")


def _scaled(chunk: Tensor, temperature: float) -> Tensor:
    """``chunk / temperature`` in float32 (no extra copy at temperature 1)."""
    chunk = chunk.float()
    return chunk if temperature == 1.0 else chunk / temperature


def entropy_from_logits(
    logits: Tensor, *, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, temperature: float = 1.0
) -> Tensor:
    """Entropy of each next-token distribution, in nats, float32.

    Differentiable when called with grad enabled (the entropy bonus); the trainer's metric calls
    it under ``torch.no_grad()``.

    Args:
        logits: ``(B, T, V)``; ``logits[:, t]`` is the distribution over ``token_ids[:, t + 1]``.
        chunk_tokens: about how many positions share one ``(B, chunk, V)`` temporary.
        temperature: the entropy of ``softmax(logits / temperature)`` (> 0), the distribution
            the rollout sampled from.

    Returns:
        ``(B, T) float32`` aligned like :func:`logprobs_from_logits`: ``out[:, t]`` is the
        entropy of the distribution that sampled ``token_ids[:, t]``; ``out[:, 0] == 0``.

    Raises:
        ValueError: ``temperature`` is not a finite number > 0.
    """
    _check_temperature(temperature)
    B, T, _ = logits.shape
    step = max(1, chunk_tokens // max(B, 1))
    pieces = [logits.new_zeros((B, 1), dtype=torch.float32)]
    for start in range(0, T - 1, step):
        chunk = _scaled(logits[:, start : min(start + step, T - 1)], temperature)  # (B, c, V)
        lse = torch.logsumexp(chunk, dim=-1, keepdim=True)  # (B, c, 1)
        probs = torch.exp(chunk - lse)  # (B, c, V)
        pieces.append(lse.squeeze(-1) - (probs * chunk).sum(-1))  # (B, c)
    return torch.cat(pieces, dim=1)  # (B, T)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    loss_denominator_tokens: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with token-level advantages, reduced as one token mean.

    Per masked token, with ``ratio = exp(logprobs - old_logprobs)`` (PPO, Schulman et al. 2017,
    arXiv 1707.06347, eq. 7)::

        loss_t = -min(ratio * A_t, clip(ratio, 1 - clip_eps_low, 1 + clip_eps_high) * A_t)

    ``clip_eps_high > clip_eps_low`` is DAPO's "clip-higher" (arXiv 2503.14476, section 3.1), which
    leaves low-probability tokens more room to grow. The reduction is DAPO's token-level loss
    (section 3.3): the sum over every masked token of the batch divided by the number of masked
    tokens, not GRPO's per-sample mean followed by a mean over samples, so long responses are not
    down-weighted. ``|log ratio|`` is clamped to 20 before ``exp`` (a no-op in normal training).

    Tokens with ``loss_mask == 0`` contribute nothing to the loss or to any gradient, even if
    their logprobs are ``inf`` or ``nan``.

    Args:
        logprobs: ``(B, T) float32``, current policy, with grad.
        old_logprobs: ``(B, T) float32``, behaviour policy (treated as a constant).
        advantages: ``(B, T) float32``, per-token advantage (treated as a constant).
        loss_mask: ``(B, T)`` float or int, 1 on trained tokens, 0 elsewhere.
        clip_eps_low: lower clip range; the ratio is clipped at ``1 - clip_eps_low``.
        clip_eps_high: upper clip range; the ratio is clipped at ``1 + clip_eps_high``.
        loss_denominator_tokens: divide the masked sum by this many tokens instead of this
            batch's masked count. Gradient accumulation passes the whole minibatch's count so that
            the micro-batch losses add up to the minibatch token mean. Stats are unaffected.

    Returns:
        ``(loss, stats)``: ``loss`` is a 0-dim float32 tensor (0.0 with no masked tokens).
        ``stats`` are floats averaged over this call's masked tokens: ``pg_loss`` (the token
        mean, ignoring ``loss_denominator_tokens``), ``clip_fraction`` (fraction of tokens where
        the clipped term is the active one, i.e. the token gets no gradient), ``ppo_kl`` (k1
        estimator of KL(old || new): mean of ``old_logprobs - logprobs``), ``approx_kl_k3``
        (k3 estimator ``ratio - 1 - log ratio``, Schulman 2020, always >= 0; both KL stats use the
        clamped log ratio), ``ratio_mean``,
        and ``num_tokens`` (masked tokens in this call).
    """
    if not (logprobs.shape == old_logprobs.shape == advantages.shape == loss_mask.shape):
        raise ValueError(
            "policy_loss needs equal shapes, got logprobs "
            f"{tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)}, advantages "
            f"{tuple(advantages.shape)}, loss_mask {tuple(loss_mask.shape)}"
        )
    if clip_eps_low < 0 or clip_eps_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got {clip_eps_low}, {clip_eps_high}")
    mask = loss_mask.bool()  # (B, T)
    maskf = mask.to(torch.float32)
    zero = torch.zeros_like(logprobs)
    # where() before any arithmetic so garbage at unmasked positions never reaches a gradient.
    log_ratio = torch.where(mask, logprobs - old_logprobs.detach(), zero)  # (B, T)
    log_ratio = log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    adv = torch.where(mask, advantages.detach().to(torch.float32), zero)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T)
    unclipped = -adv * ratio  # (B, T)
    clipped = -adv * ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high)  # (B, T)
    per_token = torch.maximum(unclipped, clipped) * maskf  # (B, T)

    num_tokens_t = maskf.sum()
    if loss_denominator_tokens is None:
        loss = per_token.sum() / num_tokens_t.clamp(min=1.0)
    else:
        loss = per_token.sum() / max(float(loss_denominator_tokens), 1.0)

    return loss, _policy_stats(per_token, clipped > unclipped, log_ratio, mask)


@torch.no_grad()
def _policy_stats(per_token: Tensor, clip_active: Tensor, log_ratio: Tensor, mask: Tensor) -> dict[str, float]:
    """The stats of :func:`policy_loss`, averaged over masked tokens with one device sync.

    Args:
        per_token: ``(B, T) float32`` masked per-token losses.
        clip_active: ``(B, T) bool``, where the clipped term is the active one.
        log_ratio: ``(B, T) float32`` clamped ``logprobs - old_logprobs`` (0 where unmasked).
        mask: ``(B, T) bool`` trained tokens.
    """
    maskf = mask.to(torch.float32)
    lr_d = log_ratio.detach()
    ratio_d = torch.exp(lr_d)
    sums = torch.stack(
        [
            per_token.detach().sum(),
            (clip_active & mask).to(torch.float32).sum(),
            (-lr_d * maskf).sum(),
            ((ratio_d - 1.0 - lr_d) * maskf).sum(),
            (ratio_d * maskf).sum(),
            maskf.sum(),
        ]
    ).tolist()  # one device sync for all stats
    count = max(sums[-1], 1.0)
    names = ("pg_loss", "clip_fraction", "ppo_kl", "approx_kl_k3", "ratio_mean")
    stats = {name: value / count for name, value in zip(names, sums[:-1], strict=True)}
    stats["num_tokens"] = sums[-1]
    return stats
