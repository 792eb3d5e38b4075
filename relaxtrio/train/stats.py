"""What one trainer step did (a frozen attrs record), and the running sums that build it."""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs
from torch import Tensor

__all__ = ["TrainStats"]


@attrs.frozen(kw_only=True)
class TrainStats:
    """What one :meth:`~relaxtrio.train.Trainer.train_step` did.

    Token-level values are token-weighted means over all trained (``loss_mask == 1``) tokens of the
    step, across every minibatch and micro-batch. A value that does not apply to the step's
    configuration is NaN. The three meanings of KL have three names: ``ppo_kl`` (old/current
    ratio), ``kl_loss`` (independent reference-KL loss) and ``reward_shaping_kl`` (reference KL
    in the estimator's returns).

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
        num_tokens: trained tokens (``sum(loss_mask)`` over samples, after off-policy masking).
        num_padded_tokens: tokens the forwards actually processed, padding included (per pass).
        num_samples: samples in the step.
        num_optimizer_steps: optimizer steps taken (minibatches with at least one trained token).
        num_micro_batches: forward/backward passes with grad.
        num_nonfinite_grad_steps: minibatches whose gradient norm was nan/inf; their optimizer
            step was skipped (the weights stay finite).
        lr: the learning rate used.
        elapsed_s: wall-clock seconds the whole step took.
        dual_clip_fraction: trained tokens capped by the dual clip (``--eps-clip-c``).
        kl_loss: mean per-token KL(current || reference) estimate of the KL loss
            (``--use-kl-loss``), before its coefficient.
        reward_shaping_kl: mean per-token ``old - ref`` logprob used by ``--kl-coef`` shaping.
        tis_weight_mean: mean truncated importance weight (``--use-tis``).
        tis_clip_fraction: fraction of tokens whose importance weight was truncated.
        icepop_masked_fraction: fraction of tokens masked by ``--use-icepop``.
        opsm_masked_fraction: fraction of tokens masked by ``--use-opsm``.
        offpolicy_masked_tokens: trained tokens removed by
            ``--mask-offpolicy-in-partial-rollout`` (sampled by an older weight version).
        advantage_mean: mean token advantage the loss used (after shaping and whitening).
        advantage_std: its population standard deviation.
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
    dual_clip_fraction: float = math.nan
    kl_loss: float = math.nan
    reward_shaping_kl: float = math.nan
    tis_weight_mean: float = math.nan
    tis_clip_fraction: float = math.nan
    icepop_masked_fraction: float = math.nan
    opsm_masked_fraction: float = math.nan
    offpolicy_masked_tokens: int = 0
    advantage_mean: float = math.nan
    advantage_std: float = math.nan


_TOKEN_MEANS = ("clip_fraction", "dual_clip_fraction", "ppo_kl", "approx_kl_k3", "kl_loss",
                "tis_weight_mean", "tis_clip_fraction", "icepop_masked_fraction",
                "opsm_masked_fraction")


@attrs.define(eq=False, kw_only=True)
class StepAccumulator:
    """Token-weighted running sums for one train step's statistics."""

    loss_sum: float = 0.0
    loss_tokens: float = 0.0
    sums: dict[str, float] = attrs.Factory(dict)
    entropy_sum: float | None = None
    diff_sum: float = 0.0
    diff_max: float = 0.0
    pre_tokens: int = 0
    grad_norms: list[float] = attrs.Factory(list)
    num_nonfinite_grad_steps: int = 0
    extra: dict[str, float] = attrs.Factory(dict)

    def observe_loss(self, stats: Mapping[str, float]) -> None:
        """Adds one micro-batch's token-mean stats, weighted by ``stats["num_tokens"]``."""
        n = stats["num_tokens"]
        self.loss_sum += stats["pg_loss"] * n
        self.loss_tokens += n
        for name in _TOKEN_MEANS:
            if name in stats:
                self.sums[name] = self.sums.get(name, 0.0) + stats[name] * n

    def observe_pre_update(self, abs_diff: Tensor, entropy_sum: float | None) -> None:
        """Adds the pre-update engine/trainer differences (``(N,)``) and entropy sum."""
        if abs_diff.numel():
            self.diff_sum += float(abs_diff.sum().item())
            self.diff_max = max(self.diff_max, float(abs_diff.max().item()))
        self.pre_tokens += abs_diff.numel()
        if entropy_sum is not None:
            self.entropy_sum = (self.entropy_sum or 0.0) + entropy_sum

    def finish(self, **fields: float) -> TrainStats:
        """The step's :class:`TrainStats`; ``fields`` are the counts only the caller knows."""

        def mean(total: float | None, count: float) -> float:
            return total / count if total is not None and count > 0 else math.nan

        norms = self.grad_norms
        token_means = {name: mean(self.sums.get(name), self.loss_tokens) for name in _TOKEN_MEANS}
        return TrainStats(
            loss=mean(self.loss_sum, self.loss_tokens),
            entropy=mean(self.entropy_sum, self.pre_tokens),
            grad_norm=sum(norms) / len(norms) if norms else math.nan,
            rollout_logprob_abs_diff=mean(self.diff_sum, self.pre_tokens),
            rollout_logprob_abs_diff_max=self.diff_max if self.pre_tokens else math.nan,
            num_tokens=self.pre_tokens,
            num_nonfinite_grad_steps=self.num_nonfinite_grad_steps,
            **token_means,
            **self.extra,
            **fields,
        )
