"""From training samples to padded tensors: validation, minibatch split, micro-batch packing.

The trainer never sees a ``TrainingSample`` class; anything with the three fields of
:class:`SampleLike` (``relaxtrio.forest.TrainingSample`` among them) trains, and it receives
each one with its credit as a :class:`ScoredLike` (``relaxtrio.rollout.scored.ScoredSample``
among them). A sample of a vision-language model also carries ``multimodal_inputs`` (see
:mod:`relaxtrio.train.multimodal`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol

import attrs
import torch
from torch import Tensor

from .._validate import require_real
from ..config import TrainConfig
from .multimodal import multimodal_model_inputs

__all__ = [
    "MicroBatch",
    "SampleLike",
    "ScoredLike",
    "collate",
    "plan_configured_micro_batches",
    "plan_dynamic_micro_batches",
    "plan_micro_batches",
    "special_token_ids",
    "split_minibatches",
]


class SampleLike(Protocol):
    """The fields the trainer reads from a sample (duck-typed ``TrainingSample``).

    ``len(token_ids) == len(loss_mask) == len(rollout_logprobs) >= 1``; ``loss_mask[0] == 0``
    (the first token has no context to be predicted from). An optional ``multimodal_inputs``
    (payloads with ``train_inputs``, lineage order) is read when present, and so are the
    optional ``weight_versions`` spans (``--mask-offpolicy-in-partial-rollout``).
    """

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def loss_mask(self) -> Sequence[int]: ...

    @property
    def rollout_logprobs(self) -> Sequence[float]: ...


class ScoredLike(Protocol):
    """One context and its base credit, as the trainer receives them (duck-typed
    ``relaxtrio.rollout.scored.ScoredSample``; the trainer reads nothing else of it)."""

    @property
    def sample(self) -> SampleLike: ...

    @property
    def advantage(self) -> float: ...


@attrs.frozen(eq=False)
class MicroBatch:
    """One right-padded forward pass worth of samples.

    Attributes:
        indices: positions of these samples in the step's sample list, length ``B``.
        token_ids: ``(B, T) long``; padding positions hold ``pad_token_id``.
        attention_mask: ``(B, T) long``; 1 on real tokens.
        loss_mask: ``(B, T) float32``; 1 on trained tokens.
        rollout_logprobs: ``(B, T) float32``; engine logprobs (0.0 off the loss mask).
        advantages: ``(B, T) float32``; each sample's scalar advantage broadcast over its whole
            row, or its per-token advantages (the loss only reads it where ``loss_mask == 1``).
        model_inputs: extra model keyword tensors (a VLM's ``pixel_values``, ``image_grid_thw``,
            ``mm_token_type_ids``); empty for text.
    """

    indices: tuple[int, ...]
    token_ids: Tensor
    attention_mask: Tensor
    loss_mask: Tensor
    rollout_logprobs: Tensor
    advantages: Tensor
    model_inputs: dict[str, Tensor] = attrs.field(factory=dict)

    @property
    def num_tokens(self) -> int:
        """Trained tokens in this micro-batch."""
        return int(self.loss_mask.sum().item())


def special_token_ids(model: torch.nn.Module) -> tuple[int, int | None]:
    """``(pad_token_id, image_token_id)`` for collating ``model``'s micro-batches.

    The pad id is the (text) config's ``pad_token_id`` when it is a valid id, else 0: any valid
    id does, since padding is masked out. The image token id is a VLM config's
    ``image_token_id``, else None.
    """
    model_config: Any = getattr(model, "config", None)
    get_text_config = getattr(model_config, "get_text_config", None)
    text_config = get_text_config() if get_text_config is not None else model_config
    pad = getattr(text_config, "pad_token_id", None)
    vocab = getattr(text_config, "vocab_size", None)
    image_token = getattr(model_config, "image_token_id", None)
    pad_id = pad if isinstance(pad, int) and pad >= 0 and (vocab is None or pad < vocab) else 0
    return pad_id, (image_token if isinstance(image_token, int) else None)


def plan_configured_micro_batches(
    config: TrainConfig, indices: Sequence[int], lengths: Sequence[int]
) -> list[list[int]]:
    """Micro-batches of ``indices`` as ``config`` asks: packed by ``max_tokens_per_gpu`` with
    dynamic batching (:func:`plan_dynamic_micro_batches`), else :func:`plan_micro_batches`."""
    if config.use_dynamic_batch_size:
        assert config.max_tokens_per_gpu is not None  # TrainConfig checks it
        return plan_dynamic_micro_batches(indices, lengths, max_tokens=config.max_tokens_per_gpu)
    return plan_micro_batches(
        indices, lengths, micro_batch_size=config.micro_batch_size,
        max_tokens_per_micro_batch=config.max_tokens_per_micro_batch,
    )


def validate_samples(samples: Sequence[SampleLike], advantages: Sequence[float] | None) -> None:
    """Check the length and value invariants the trainer relies on.

    Raises:
        ValueError: naming the offending ``samples[i]`` field or ``advantages[i]``.
    """
    if not samples:
        raise ValueError("samples is empty: a train step needs at least one sample")
    if advantages is not None and len(advantages) != len(samples):
        raise ValueError(
            f"len(advantages) == {len(advantages)} but len(samples) == {len(samples)}; "
            "give one advantage per sample"
        )
    for i, sample in enumerate(samples):
        n = len(sample.token_ids)
        if n == 0:
            raise ValueError(f"samples[{i}].token_ids is empty")
        if len(sample.loss_mask) != n or len(sample.rollout_logprobs) != n:
            raise ValueError(
                f"samples[{i}]: len(token_ids) == {n}, len(loss_mask) == {len(sample.loss_mask)}, "
                f"len(rollout_logprobs) == {len(sample.rollout_logprobs)}; they must be equal"
            )
        if any(m not in (0, 1) for m in sample.loss_mask):
            raise ValueError(f"samples[{i}].loss_mask must hold only 0 and 1")
        if sample.loss_mask[0]:
            raise ValueError(f"samples[{i}].loss_mask[0] must be 0: token 0 has no context")
        if advantages is not None:
            require_real(advantages[i], f"advantages[{i}]", error=ValueError)


def split_minibatches(
    num_samples: int, num_minibatches: int, rng: random.Random
) -> list[list[int]]:
    """Shuffle sample indices and split them into up to ``num_minibatches`` near-equal parts.

    With ``num_minibatches == 1`` the order is kept and ``rng`` is not used. Never returns an
    empty part (fewer samples than minibatches gives one sample per part).
    """
    order = list(range(num_samples))
    if num_minibatches == 1:
        return [order]
    rng.shuffle(order)
    parts = min(num_minibatches, num_samples)
    base, extra = divmod(num_samples, parts)
    out, start = [], 0
    for k in range(parts):
        size = base + (1 if k < extra else 0)
        out.append(order[start : start + size])
        start += size
    return out


def plan_micro_batches(
    indices: Sequence[int],
    lengths: Sequence[int],
    *,
    micro_batch_size: int,
    max_tokens_per_micro_batch: int | None,
) -> list[list[int]]:
    """Group sample indices into micro-batches of similar lengths.

    The samples are taken longest first (ties in their given order) and cut into consecutive
    micro-batches, so each right-padded forward pads a sample to the length of its neighbours in
    that order, not to the longest of an arbitrary few: on the default example's steps (16
    samples of 44-155 tokens, 4 per micro-batch) that is 1,660 padded tokens instead of 2,068 in
    the rollout's order. Accumulation makes the split irrelevant to the gradient (the loss
    denominators are the minibatch's), up to float rounding. The longest micro-batch comes first,
    so a step that cannot fit in memory fails on its first forward.

    Args:
        indices: the minibatch's sample indices.
        lengths: token count of every sample of the step (indexed by sample index).
        micro_batch_size: at most this many samples per micro-batch.
        max_tokens_per_micro_batch: if set, also ``len(mb) * max(length in mb) <= budget``
            (padded tokens); a sample longer than the budget gets a micro-batch of its own.

    Returns:
        Non-empty lists of sample indices covering ``indices`` exactly once; each list is
        ordered longest first.
    """
    out: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in sorted(indices, key=lambda i: -lengths[i]):  # stable: ties keep their order
        longer = max(longest, lengths[i])
        over_count = len(current) >= micro_batch_size
        over_budget = (
            max_tokens_per_micro_batch is not None
            and (len(current) + 1) * longer > max_tokens_per_micro_batch
        )
        if current and (over_count or over_budget):
            out.append(current)
            current, longer = [], lengths[i]
        current.append(i)
        longest = longer
    if current:
        out.append(current)
    return out


def plan_dynamic_micro_batches(
    indices: Sequence[int], lengths: Sequence[int], *, max_tokens: int
) -> list[list[int]]:
    """Pack sample indices into micro-batches by a padded-token budget (dynamic batching).

    First-fit decreasing: samples are taken longest first and each goes into the first
    micro-batch that stays within ``len(mb) * longest(mb) <= max_tokens`` with it (the padded
    size of a right-padded forward), else into a new one. Sorting keeps similar lengths
    together, so little padding is wasted; the sample count per micro-batch is not bounded.
    Accumulation makes the split irrelevant to the gradient (the loss denominators are the
    minibatch's), so any packing is correct; this one is just small.

    Args:
        indices: the minibatch's sample indices.
        lengths: token count of every sample of the step (indexed by sample index).
        max_tokens: the padded-token budget (``--max-tokens-per-gpu``); a longer sample gets a
            micro-batch of its own.

    Returns:
        Non-empty lists of sample indices covering ``indices`` exactly once; each list is
        ordered longest first.
    """
    order = sorted(indices, key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    for i in order:
        for mb in bins:
            if (len(mb) + 1) * lengths[mb[0]] <= max_tokens:  # mb[0] is its longest
                mb.append(i)
                break
        else:
            bins.append([i])
    return bins


def collate(
    samples: Sequence[SampleLike],
    advantages: Sequence[float | Tensor] | None,
    indices: Sequence[int],
    *,
    pad_token_id: int,
    device: torch.device | str,
    image_token_id: int | None = None,
    loss_masks: Sequence[Sequence[int]] | None = None,
) -> MicroBatch:
    """Right-pad the chosen samples into one :class:`MicroBatch` on ``device``.

    Args:
        samples: the step's samples.
        advantages: one per sample (a scalar, or a ``(len_i,)`` tensor of token advantages),
            or None.
        indices: which samples, in batch order.
        pad_token_id: id written at padding positions.
        device: where the tensors go.
        image_token_id: the model's image placeholder id, for samples with images.
        loss_masks: per-sample loss masks replacing ``sample.loss_mask`` (e.g. off-policy
            tokens masked), indexed like ``samples``; None keeps the samples' own.

    Raises:
        ValueError: a sample's rollout logprob is ``nan``/``inf`` on a trained token, or a sample
            has images the model cannot take.
    """
    rows = [samples[i] for i in indices]
    B, T = len(rows), max(len(s.token_ids) for s in rows)
    token_ids = torch.full((B, T), pad_token_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((B, T), dtype=torch.long)  # (B, T)
    loss_mask = torch.zeros((B, T), dtype=torch.float32)  # (B, T)
    rollout_logprobs = torch.zeros((B, T), dtype=torch.float32)  # (B, T)
    adv = torch.zeros((B, T), dtype=torch.float32)  # (B, T)
    for b, (i, s) in enumerate(zip(indices, rows, strict=True)):
        n = len(s.token_ids)
        token_ids[b, :n] = torch.tensor(s.token_ids, dtype=torch.long)
        attention_mask[b, :n] = 1
        mask = s.loss_mask if loss_masks is None else loss_masks[i]
        loss_mask[b, :n] = torch.tensor(mask, dtype=torch.float32)
        rollout_logprobs[b, :n] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
        if advantages is not None:
            value = advantages[i]
            if isinstance(value, Tensor):
                adv[b, :n] = value.to(torch.float32)
            else:
                adv[b, :n] = float(value)
    on_mask = loss_mask.bool()
    bad = (on_mask & ~torch.isfinite(rollout_logprobs)).any(dim=1)  # (B,)
    if bad.any():
        i = indices[int(bad.nonzero()[0].item())]
        raise ValueError(f"samples[{i}].rollout_logprobs is not finite on a loss_mask == 1 token")
    # Off-mask rollout logprobs are meaningless (0.0 by contract); zero them for safety.
    rollout_logprobs = torch.where(on_mask, rollout_logprobs, torch.zeros_like(rollout_logprobs))
    return MicroBatch(
        indices=tuple(indices),
        token_ids=token_ids.to(device),
        attention_mask=attention_mask.to(device),
        loss_mask=loss_mask.to(device),
        rollout_logprobs=rollout_logprobs.to(device),
        advantages=adv.to(device),
        model_inputs=multimodal_model_inputs(
            rows, token_ids.to(device), image_token_id=image_token_id, device=device
        ),
    )
