"""Trainer configuration and per-step statistics (frozen attrs records)."""

from __future__ import annotations

import math

import attrs

__all__ = ["TrainConfig", "TrainStats"]


def _positive(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{attribute.name} must be a finite number > 0, got {value!r}")


def _non_negative(instance: object, attribute: attrs.Attribute, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


def _betas(instance: object, attribute: attrs.Attribute, value: tuple[float, float]) -> None:
    if len(value) != 2 or not all(0.0 <= b < 1.0 for b in value):
        raise ValueError(f"{attribute.name} must be two numbers in [0, 1), got {value!r}")


def _positive_int(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be an int >= 1, got {value!r}")


def _optional_positive_int(instance: object, attribute: attrs.Attribute, value: int | None) -> None:
    if value is not None:
        _positive_int(instance, attribute, value)


@attrs.frozen(kw_only=True)
class TrainConfig:
    """How :class:`~relaxtrio.train.Trainer` updates the policy.

    Attributes:
        lr: AdamW learning rate. Default 5e-6, chosen so a short demo run visibly moves
            SmolLM2-135M fp32: measured over 3 steps on 4 contexts (advantages +1/-1, ~10
            response tokens each) the +1 responses' summed logprobs rose by 1.6 and 1.1 nats
            and the -1 ones fell by 17 and 5.5 nats. Longer runs and bigger models usually want
            ~1e-6; the tiny random test model needs ~1e-3.
        weight_decay: AdamW decoupled weight decay (0.0: the usual choice for RL fine-tuning).
        betas: AdamW ``(beta1, beta2)``.
        adam_eps: AdamW epsilon.
        clip_eps_low: PPO lower clip range (ratio floor ``1 - clip_eps_low``).
        clip_eps_high: PPO upper clip range (ratio ceiling ``1 + clip_eps_high``). The default
            0.28 is DAPO's clip-higher (arXiv 2503.14476); set 0.2 for DeepSeekMath's symmetric
            GRPO clip. With one minibatch per rollout and trainer-side old logprobs the ratio is
            exactly 1, so clipping only matters with ``num_minibatches > 1`` or rollout logprobs.
        max_grad_norm: global L2 norm the gradient is clipped to before every optimizer step.
        micro_batch_size: samples per forward/backward pass (gradient accumulation unit).
        max_tokens_per_micro_batch: optional padded-token budget per forward
            (``num_samples * longest_length <= budget``; a single longer sample gets its own
            micro-batch). None: only ``micro_batch_size`` bounds a micro-batch.
        num_minibatches: optimizer steps per :meth:`~relaxtrio.train.Trainer.train_step`; the
            samples are shuffled (seeded) and split into this many minibatches.
        seed: seeds the trainer's own minibatch shuffling RNG (it never touches global RNGs).
        use_rollout_logprobs_as_old: False (default): the PPO ratio's old logprobs are the
            trainer's logprobs before the update (recomputed, so ratio == 1 on the first
            minibatch). True: use the engine's ``rollout_logprobs`` instead, which makes the
            ratio also correct for engine/trainer numerical mismatch and stale weights.
        bf16_autocast: run forwards under ``torch.autocast(bfloat16)`` (~3x faster on AVX512-BF16
            CPUs, but logprobs are off by ~0.05 nats on average, so ratios are noisier). Default
            fp32, which matches the embedded engine's logprobs to ~1e-5.
        compute_entropy: report the mean policy entropy over trained tokens (costs one extra
            softmax over the vocabulary per forward, no grad).
        logprob_chunk_tokens: positions per chunk when reducing over the vocabulary (bounds fp32
            temporaries to about ``logprob_chunk_tokens * V`` floats).
        device: torch device string the model and batches live on (``"cpu"``, ``"cuda"``).
    """

    lr: float = attrs.field(default=5e-6, validator=_positive)
    weight_decay: float = attrs.field(default=0.0, validator=_non_negative)
    betas: tuple[float, float] = attrs.field(
        default=(0.9, 0.999), converter=tuple, validator=_betas
    )
    adam_eps: float = attrs.field(default=1e-8, validator=_positive)
    clip_eps_low: float = attrs.field(default=0.2, validator=_non_negative)
    clip_eps_high: float = attrs.field(default=0.28, validator=_non_negative)
    max_grad_norm: float = attrs.field(default=1.0, validator=_positive)
    micro_batch_size: int = attrs.field(default=4, validator=_positive_int)
    max_tokens_per_micro_batch: int | None = attrs.field(
        default=None, validator=_optional_positive_int
    )
    num_minibatches: int = attrs.field(default=1, validator=_positive_int)
    seed: int = 0
    use_rollout_logprobs_as_old: bool = False
    bf16_autocast: bool = False
    compute_entropy: bool = True
    logprob_chunk_tokens: int = attrs.field(default=1024, validator=_positive_int)
    device: str = "cpu"


@attrs.frozen(kw_only=True)
class TrainStats:
    """What one :meth:`~relaxtrio.train.Trainer.train_step` did.

    Token-level values are token-weighted means over all trained (``loss_mask == 1``) tokens of the
    step, across every minibatch and micro-batch.

    Attributes:
        loss: the policy loss (token mean, see :func:`~relaxtrio.train.policy_loss`).
        clip_fraction: fraction of trained tokens whose clipped PPO term was active.
        ppo_kl: k1 estimate of KL(old || current), mean of ``old_logprobs - logprobs``.
        approx_kl_k3: k3 estimate of the same KL (non-negative).
        entropy: mean next-token entropy in nats at trained tokens, before the update; NaN when
            ``TrainConfig.compute_entropy`` is False.
        grad_norm: global gradient L2 norm before clipping, averaged over the step's minibatches.
        rollout_logprob_abs_diff: mean ``|rollout_logprobs - old_logprobs|`` over trained tokens,
            measured with the weights before this step's update (engine/trainer mismatch plus
            any staleness of the rollout weights).
        rollout_logprob_abs_diff_max: the largest such difference, same tokens.
        num_tokens: trained tokens (``sum(loss_mask)`` over samples).
        num_padded_tokens: tokens the forwards actually processed, padding included (per pass).
        num_samples: samples in the step.
        num_optimizer_steps: optimizer steps taken (minibatches with at least one trained token).
        num_micro_batches: forward/backward passes with grad.
        num_nonfinite_grad_steps: minibatches whose gradient norm was nan/inf; their optimizer
            step was skipped (the weights stay finite).
        lr: the learning rate used.
        elapsed_s: wall-clock seconds the whole step took.
    """

    loss: float
    clip_fraction: float
    ppo_kl: float
    approx_kl_k3: float
    entropy: float
    grad_norm: float
    rollout_logprob_abs_diff: float
    rollout_logprob_abs_diff_max: float
    num_tokens: int
    num_padded_tokens: int
    num_samples: int
    num_optimizer_steps: int
    num_micro_batches: int
    num_nonfinite_grad_steps: int
    lr: float
    elapsed_s: float
