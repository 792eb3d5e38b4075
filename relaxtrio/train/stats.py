"""What one trainer step did (a frozen attrs record)."""

from __future__ import annotations

import attrs

__all__ = ["TrainStats"]


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
