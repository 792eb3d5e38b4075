"""Token log-probabilities and entropies of a causal LM, in float32, at the rollout temperature.

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

import inspect
import math
from collections.abc import Mapping
from typing import Final

import torch
from torch import Tensor

__all__ = [
    "GREEDY_TEMPERATURE",
    "entropy_from_logits",
    "first_context_position",
    "forward_logits",
    "left_pad",
    "logprob_temperature",
    "logprobs_from_logits",
    "takes_logits_to_keep",
    "token_logprobs",
]

DEFAULT_CHUNK_TOKENS: Final = 1024
"""Positions reduced at once over the vocabulary; bounds fp32 temporaries to ``chunk * V``."""

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
    logits = forward_logits(
        model, token_ids, attention_mask, autocast_bf16=autocast_bf16, model_inputs=model_inputs
    )
    return logprobs_from_logits(
        logits, token_ids, attention_mask, chunk_tokens=chunk_tokens, temperature=temperature
    )


def forward_logits(
    model: torch.nn.Module,
    token_ids: Tensor,
    attention_mask: Tensor,
    *,
    autocast_bf16: bool,
    model_inputs: Mapping[str, Tensor] | None = None,
    skip: int = 0,
) -> Tensor:
    """One forward pass; returns ``(B, T - skip, V)`` logits (bf16 under autocast, else model dtype).

    Args:
        model: a Hugging Face causal LM.
        token_ids: ``(B, T) long``.
        attention_mask: ``(B, T)``.
        autocast_bf16: run under ``torch.autocast(bfloat16)``.
        model_inputs: extra keyword tensors (a VLM's pixel inputs).
        skip: leading positions whose logits are not wanted, ``0 <= skip < T``: the model's
            ``logits_to_keep`` is ``T - skip``, so its output head and the caller's reductions
            over the vocabulary run on the kept positions only. Needs a model whose forward
            takes ``logits_to_keep`` (:func:`takes_logits_to_keep`); 0 calls the model without it.
    """
    extra = dict(model_inputs or {})
    if skip:
        extra["logits_to_keep"] = token_ids.shape[1] - skip
    with torch.autocast(token_ids.device.type, dtype=torch.bfloat16, enabled=autocast_bf16):
        out = model(input_ids=token_ids, attention_mask=attention_mask, use_cache=False, **extra)
    return out.logits  # (B, T - skip, V)


def takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward takes ``logits_to_keep`` (Hugging Face causal LMs since
    transformers 4.50; a peft model passes it on to its base model)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        parameters = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):  # no introspectable signature
        return False
    return "logits_to_keep" in parameters


def first_context_position(loss_mask: Tensor) -> int:
    """The first position whose logits a loss over ``loss_mask`` reads: one before the earliest
    trained token of any row (``logits[:, t]`` predicts token ``t + 1``), or 0 when no row has one.

    Args:
        loss_mask: ``(B, T)``, nonzero on trained tokens (never position 0).
    """
    trained = loss_mask.any(dim=0).nonzero()  # (n, 1) columns with a trained token
    return max(0, int(trained[0, 0]) - 1) if trained.numel() else 0


def left_pad(values: Tensor, length: int) -> Tensor:
    """``(B, n)`` values of the last ``n`` positions as ``(B, length)``, zeros before them."""
    missing = length - values.shape[1]
    return values if missing == 0 else torch.nn.functional.pad(values, (missing, 0))


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
