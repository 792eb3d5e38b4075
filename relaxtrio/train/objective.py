"""One micro-batch through a policy: its forward pass, its objective, and the minibatch's denominators.

:func:`micro_batch_forward` is the one forward every pass runs (the loss pass with grad, the
no-grad old and reference passes), with the prompt's logits cut where the loss cannot read them;
:func:`observe_pre_update` records the pre-update pass's engine/trainer differences and entropy.
:func:`micro_batch_objective` assembles the terms of docs/export-and-credit.md#what-the-trainer-does-with-an-advantage
for one micro-batch: the clipped surrogate (:func:`~relaxtrio.train.loss.policy_loss`) against the
old logprobs, with the off-policy token weights (:mod:`relaxtrio.train.offpolicy`), minus the
entropy bonus, plus a reference-KL loss term; every term reduced against the *minibatch's*
denominators, so accumulating the micro-batches' gradients equals the unsplit loss. The
:class:`~relaxtrio.train.Trainer` runs the passes; this module only combines their outputs.

Shapes: ``B`` samples in the micro-batch, ``T`` padded tokens, ``V`` vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from collections.abc import Sequence

from ..config import TrainConfig
from .batching import MicroBatch
from .logprobs import entropy_from_logits, first_context_position, forward_logits, left_pad, logprobs_from_logits
from .loss import LossDenominators, aggregate, policy_loss, reference_kl
from .offpolicy import offpolicy_token_weights
from .stats import StepAccumulator

__all__ = [
    "gather_rows",
    "micro_batch_forward",
    "micro_batch_objective",
    "minibatch_denominators",
    "observe_pre_update",
]


def micro_batch_forward(
    model: torch.nn.Module, batch: MicroBatch, *, config: TrainConfig, temperature: float, cut_prompt: bool
) -> tuple[Tensor, Tensor]:
    """One forward of ``batch``: ``(logits (B, T - skip, V), logprobs (B, T) float32)``.

    Args:
        model: the policy (or its frozen KL reference).
        batch: the micro-batch.
        config: autocast and chunking settings.
        temperature: the logprob temperature.
        cut_prompt: skip the positions before the micro-batch's first trained token (needs a
            model that takes ``logits_to_keep``): ``skip`` is one position before that token, so
            the output head and the reductions over the vocabulary skip the prompt, and the
            logprobs before ``skip + 1`` are 0.0. Else ``skip`` is 0 and every position is
            computed.
    """
    skip = first_context_position(batch.loss_mask) if cut_prompt else 0
    logits = forward_logits(
        model, batch.token_ids, batch.attention_mask,
        autocast_bf16=config.bf16_autocast, model_inputs=batch.model_inputs, skip=skip,
    )  # (B, T - skip, V)
    logprobs = left_pad(logprobs_from_logits(
        logits, batch.token_ids[:, skip:], batch.attention_mask[:, skip:],
        chunk_tokens=config.logprob_chunk_tokens, temperature=temperature,
    ), batch.token_ids.shape[1])  # (B, T)
    return logits, logprobs


def observe_pre_update(
    acc: StepAccumulator, batch: MicroBatch, pre: Tensor, logits: Tensor, *, config: TrainConfig,
    temperature: float,
) -> None:
    """Adds a pre-update pass's ``|rollout - pre|`` logprob differences on trained tokens, and
    with ``config.compute_entropy`` its entropy sum, to ``acc``.

    Args:
        pre: ``(B, T)`` pre-update logprobs.
        logits: ``(B, T - skip, V)`` of the same pass (they may start after position 0).
    """
    with torch.no_grad():
        mask = batch.loss_mask.bool()  # (B, T)
        diff = (batch.rollout_logprobs - pre).abs()[mask]  # (N,)
        entropy = None
        if config.compute_entropy:
            ent = left_pad(entropy_from_logits(
                logits.detach(), chunk_tokens=config.logprob_chunk_tokens, temperature=temperature,
            ), mask.shape[1])  # (B, T)
            entropy = float(ent[mask].sum().item())
        acc.observe_pre_update(diff, entropy)


def minibatch_denominators(
    minibatch: Sequence[int], masks: Sequence[Sequence[int]], *, norm_tokens: int | None
) -> LossDenominators:
    """What the loss terms of every micro-batch of ``minibatch`` are divided by.

    Args:
        minibatch: sample indices.
        masks: every sample's (off-policy masked) loss mask.
        norm_tokens: ``--loss-norm-tokens``, or None: the longest trained length.
    """
    counts = [sum(masks[i]) for i in minibatch]
    return LossDenominators(
        num_tokens=float(sum(counts)),
        num_samples=float(sum(1 for c in counts if c > 0)),
        norm_tokens=float(norm_tokens if norm_tokens is not None else max(counts, default=0)),
    )


def micro_batch_objective(
    config: TrainConfig,
    batch: MicroBatch,
    *,
    logits: Tensor,
    logprobs: Tensor,
    pre: Tensor,
    ref: Tensor | None,
    den: LossDenominators,
    temperature: float,
) -> tuple[Tensor, dict[str, float]]:
    """The micro-batch's loss (with grad) and its statistics.

    Args:
        config: the loss settings (clip, ratio, off-policy correction, entropy, KL).
        batch: the micro-batch.
        logits: ``(B, T - skip, V)`` of the forward pass, with grad; they may start after
            position 0 (the prompt cut, see :meth:`relaxtrio.train.Trainer._forward`).
        logprobs: ``(B, T) float32`` of the same pass, with grad.
        pre: ``(B, T) float32``, the pre-update policy's logprobs (no grad).
        ref: ``(B, T) float32`` logprobs of the frozen KL reference policy when the KL loss is
            on, else None.
        den: the minibatch's denominators.
        temperature: the logprob temperature (:func:`~relaxtrio.train.logprobs.logprob_temperature`).

    Returns:
        ``(loss, stats)``: a scalar tensor, and the loss statistics (``kl_loss`` with ``ref``).
    """
    old = batch.rollout_logprobs if config.use_rollout_logprobs_as_old else pre
    weights, off_stats = offpolicy_token_weights(
        config, old=pre, rollout=batch.rollout_logprobs, logprobs=logprobs,
        advantages=batch.advantages, loss_mask=batch.loss_mask,
    )
    loss, stats = policy_loss(
        logprobs, old, batch.advantages, batch.loss_mask,
        clip_eps_low=config.clip_eps_low, clip_eps_high=config.clip_eps_high,
        clip_ratio_c=config.clip_ratio_c, policy_ratio=config.policy_ratio, token_weights=weights,
        aggregation=config.loss_aggregation, denominators=den,
    )
    if config.clip_ratio_c is None:
        del stats["dual_clip_fraction"]
    stats.update(off_stats)
    if config.entropy_coef > 0:
        entropy = left_pad(entropy_from_logits(
            logits, chunk_tokens=config.logprob_chunk_tokens, temperature=temperature
        ), batch.token_ids.shape[1])  # (B, T), with grad
        loss = loss - config.entropy_coef * aggregate(entropy, batch.loss_mask, config.loss_aggregation, den)
    if ref is not None:
        kl = reference_kl(logprobs, ref, config.kl_loss_type)  # (B, T)
        if config.kl_loss_coef > 0:
            loss = loss + config.kl_loss_coef * aggregate(kl, batch.loss_mask, config.loss_aggregation, den)
        mask = batch.loss_mask.bool()
        stats["kl_loss"] = float(kl.detach()[mask].sum().item()) / max(float(mask.sum().item()), 1.0)
    return loss, stats


def gather_rows(per_sample: dict[int, Tensor], batch: MicroBatch) -> Tensor:
    """Precomputed per-sample logprobs (``{index: (len_i,)}``) padded back into the batch's
    ``(B, T)`` layout (0.0 past each sample's end)."""
    out = torch.zeros_like(batch.rollout_logprobs)  # (B, T)
    for b, i in enumerate(batch.indices):
        row = per_sample[i]
        out[b, : row.shape[0]] = row
    return out
