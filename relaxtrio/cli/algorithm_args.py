"""The ``train`` flags of the training algorithm: rewards and filters, advantage estimator,
policy loss, LoRA and batching (kept apart from :mod:`relaxtrio.cli.train_args`, which builds the
whole parser and run config).
"""

from __future__ import annotations

import argparse
from typing import Any, get_args

from ..config import ADVANTAGE_ESTIMATORS, KlLossType, LossAggregation, PolicyRatio

# flag dest → TrainConfig field, for the algorithm flags (None values keep the default).
_ALGORITHM_FIELDS = {
    "normalize_advantages": "normalize_advantages", "kl_coef": "kl_coef",
    "eps_clip_c": "clip_ratio_c", "policy_ratio": "policy_ratio",
    "loss_aggregation": "loss_aggregation", "loss_norm_tokens": "loss_norm_tokens",
    "use_rollout_logprobs": "use_rollout_logprobs_as_old",
    "use_tis": "use_tis", "tis_clip": "tis_clip", "tis_clip_low": "tis_clip_low",
    "use_icepop": "use_icepop", "icepop_low": "icepop_low", "icepop_high": "icepop_high",
    "use_opsm": "use_opsm", "opsm_delta": "opsm_delta",
    "mask_offpolicy_in_partial_rollout": "mask_offpolicy_in_partial_rollout",
    "entropy_coef": "entropy_coef", "use_kl_loss": "use_kl_loss", "kl_loss_coef": "kl_loss_coef",
    "kl_loss_type": "kl_loss_type", "use_dynamic_batch_size": "use_dynamic_batch_size",
    "max_tokens_per_gpu": "max_tokens_per_gpu",
    "lora_rank": "lora_rank", "lora_alpha": "lora_alpha", "lora_target_modules": "lora_target_modules",
}


def add_reward_flags(p: argparse.ArgumentParser) -> None:
    """The reward-model, pass-rate and dynamic-filter flags (docs/export-and-credit.md#reward-models)."""
    rw = p.add_argument_group("rewards and filters")
    rw.add_argument("--group-rm", action="store_true",
                    help="call --custom-rm-path once per Group: fn(samples) -> [reward, ...]")
    rw.add_argument("--eval-reward-key", default=None,
                    help="primary key of object rewards in evaluation (unset: --reward-key)")
    rw.add_argument("--log-passrate", action="store_true",
                    help="log rollout/pass@k (one rewarded 0/1 context per Session)")
    rw.add_argument("--dynamic-sampling-filter-path", default=None,
                    help="package.module.fn(samples, rewards) -> bool | DynamicFilterOutput; "
                         "filtered train Groups are replaced (built in: "
                         "relaxtrio.rollout.filters.check_reward_nonzero_std)")


def add_algorithm_flags(p: argparse.ArgumentParser) -> None:
    """The estimator, policy-loss and batching flags (docs/export-and-credit.md#what-the-trainer-does-with-an-advantage).

    Defaults are None / False so that TrainConfig's documented defaults stay the one source.
    """
    adv = p.add_argument_group("advantage estimator")
    adv.add_argument("--advantage-estimator", default="grpo", choices=ADVANTAGE_ESTIMATORS,
                     help="how a Group's rewards become each context's base credit (gspo: GRPO "
                          "credit with the sequence-level ratio)")
    adv.add_argument("--disable-grpo-std-normalization", action="store_true",
                     help="grpo/gspo: only center rewards in the Group (Dr. GRPO)")
    adv.add_argument("--normalize-advantages", action="store_true",
                     help="whiten the step's token advantages (a later, generic step)")
    adv.add_argument("--kl-coef", type=float, default=None,
                     help="reference-KL reward shaping in the returns (rloo, "
                          "reinforce_plus_plus_baseline; unset: 0)")

    loss = p.add_argument_group("policy loss")
    loss.add_argument("--eps-clip-c", type=float, default=None,
                      help="dual-clip bound c > 1 for negative advantages (unset: off)")
    loss.add_argument("--policy-ratio", default=None, choices=get_args(PolicyRatio),
                      help="token (PPO) or sequence (GSPO) importance ratio (unset: token)")
    loss.add_argument("--loss-aggregation", default=None, choices=get_args(LossAggregation),
                      help="token_mean (DAPO), sequence_mean (GRPO), sequence_sum_norm (Dr. GRPO) "
                           "(unset: token_mean)")
    loss.add_argument("--loss-norm-tokens", type=int, default=None,
                      help="sequence_sum_norm's constant in tokens (unset: longest in minibatch)")
    loss.add_argument("--use-rollout-logprobs", action="store_true",
                      help="use the engine's rollout logprobs as the PPO ratio's old policy")
    loss.add_argument("--use-tis", action="store_true",
                      help="truncated importance sampling between trainer and rollout logprobs")
    loss.add_argument("--tis-clip", type=float, default=None, help="TIS upper clamp (unset: 2.0)")
    loss.add_argument("--tis-clip-low", type=float, default=None, help="TIS lower clamp (unset: 0)")
    loss.add_argument("--use-icepop", action="store_true",
                      help="IcePop: mask tokens whose trainer/rollout probability ratio is outside "
                           "[--icepop-low, --icepop-high]")
    loss.add_argument("--icepop-low", type=float, default=None, help="IcePop lower bound (unset: 0.5)")
    loss.add_argument("--icepop-high", type=float, default=None, help="IcePop upper bound (unset: 5)")
    loss.add_argument("--use-opsm", action="store_true",
                      help="off-policy sequence masking of negative-advantage samples")
    loss.add_argument("--opsm-delta", type=float, default=None,
                      help="OPSM threshold, nats per token (unset: 1e-4)")
    loss.add_argument("--mask-offpolicy-in-partial-rollout", action="store_true",
                      help="train only tokens sampled by each context's newest weight version "
                           "(needs --partial-rollout or --fully-async)")
    loss.add_argument("--entropy-coef", type=float, default=None, help="entropy bonus (unset: 0)")
    loss.add_argument("--use-kl-loss", action="store_true",
                      help="add a KL loss against a frozen copy of the initial weights")
    loss.add_argument("--kl-loss-coef", type=float, default=None, help="KL loss coefficient (unset: 0)")
    loss.add_argument("--kl-loss-type", default=None, choices=get_args(KlLossType),
                      help="KL loss estimator (unset: k1)")

    lora = p.add_argument_group("LoRA")
    lora.add_argument("--lora-rank", type=int, default=None,
                      help="train a LoRA adapter of this rank (peft) instead of every weight; the "
                           "engines get the merged weights after each step (unset: off)")
    lora.add_argument("--lora-alpha", type=float, default=None, help="LoRA alpha (unset: 2 * rank)")
    lora.add_argument("--lora-target-modules", nargs="+", default=None,
                      help="module names to adapt (unset: all-linear, every linear layer but the head)")

    batch = p.add_argument_group("batching")
    batch.add_argument("--use-dynamic-batch-size", action="store_true",
                       help="pack micro-batches by --max-tokens-per-gpu instead of --micro-batch-size")
    batch.add_argument("--max-tokens-per-gpu", type=int, default=None,
                       help="padded-token budget of one micro-batch with dynamic batching")


def algorithm_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """TrainConfig fields set by the algorithm flags (store_true flags only when given)."""
    out: dict[str, Any] = {}
    for dest, field in _ALGORITHM_FIELDS.items():
        value = getattr(args, dest)
        if value is not None and value is not False:
            out[field] = value
    return out
