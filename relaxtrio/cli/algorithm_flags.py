"""The ``train`` flags of the training algorithm and the trainer, and the
:class:`~relaxtrio.config.TrainConfig` they make.

* "algorithm": rewards and filters, the advantage estimator, the policy loss;
* "training": optimizer, batching, LoRA, the trainer's threads.

Defaults of the TrainConfig flags are None / False so that TrainConfig's documented defaults stay
the one source (docs/export-and-credit.md#what-the-trainer-does-with-an-advantage).
"""

from __future__ import annotations

import argparse
from typing import get_args

from .._errors import ConfigError
from ..config import ADVANTAGE_ESTIMATORS, KlLossType, LossAggregation, PolicyRatio, TrainConfig

__all__ = ["add_algorithm_flags", "add_training_flags", "train_section"]

# flag dest → TrainConfig field (None and False values keep the default).
_TRAIN_FIELDS = {
    "lr": "lr", "eps_clip": "clip_eps_low", "eps_clip_high": "clip_eps_high",
    "micro_batch_size": "micro_batch_size", "seed": "seed", "num_steps_per_rollout": "num_minibatches",
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

# TrainConfig field → flag, for error messages in the user's words.
_TRAIN_FLAGS = {"lr": "--lr", "clip_eps_low": "--eps-clip", "clip_eps_high": "--eps-clip-high",
                "micro_batch_size": "--micro-batch-size", "num_minibatches": "--num-steps-per-rollout",
                "seed": "--seed", "clip_ratio_c": "--eps-clip-c", "kl_coef": "--kl-coef",
                "loss_norm_tokens": "--loss-norm-tokens", "tis_clip_low": "--tis-clip-low",
                "tis_clip": "--tis-clip", "icepop_low": "--icepop-low", "icepop_high": "--icepop-high",
                "opsm_delta": "--opsm-delta", "entropy_coef": "--entropy-coef",
                "kl_loss_coef": "--kl-loss-coef", "max_tokens_per_gpu": "--max-tokens-per-gpu",
                "lora_rank": "--lora-rank", "lora_alpha": "--lora-alpha"}


def add_algorithm_flags(p: argparse.ArgumentParser) -> None:
    """Adds the "algorithm" group: rewards and filters, the advantage estimator, the policy loss
    (docs/export-and-credit.md)."""
    g = p.add_argument_group("algorithm", "rewards and filters, the advantage estimator, the policy loss")
    _add_reward_flags(g)
    _add_estimator_flags(g)
    _add_policy_loss_flags(g)


def _add_reward_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--reward-key", default=None, help="primary key of object rewards")
    g.add_argument("--eval-reward-key", default=None,
                   help="primary key of object rewards in evaluation (unset: --reward-key)")
    g.add_argument("--custom-rm-path", default=None,
                   help="package.module.fn(sample) -> reward (sync or async) for samples without "
                        "an agent reward; with --group-rm fn(samples) -> [reward, ...]")
    g.add_argument("--group-rm", action="store_true",
                   help="call --custom-rm-path once per Group: fn(samples) -> [reward, ...]")
    g.add_argument("--log-passrate", action="store_true",
                   help="log rollout/pass@k (one rewarded 0/1 context per Session)")
    g.add_argument("--dynamic-sampling-filter-path", default=None,
                   help="package.module.fn(samples, rewards) -> bool | DynamicFilterOutput; "
                        "filtered train Groups are replaced (built in: "
                        "relaxtrio.rollout.filters.check_reward_nonzero_std)")
    g.add_argument("--agentic-custom-advantage-path", default=None,
                   help="package.module.fn(metadata_by_slot) -> per-context credits "
                        "(required when a Session exports several contexts)")


def _add_estimator_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--advantage-estimator", default="grpo", choices=ADVANTAGE_ESTIMATORS,
                   help="how a Group's rewards become each context's base credit (gspo: GRPO "
                        "credit with the sequence-level ratio)")
    g.add_argument("--disable-grpo-std-normalization", action="store_true",
                   help="grpo/gspo: only center rewards in the Group (Dr. GRPO)")
    g.add_argument("--normalize-advantages", action="store_true",
                   help="whiten the step's token advantages (a later, generic step)")
    g.add_argument("--kl-coef", type=float, default=None,
                   help="reference-KL reward shaping in the returns (rloo, "
                        "reinforce_plus_plus_baseline; unset: 0)")


def _add_policy_loss_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--eps-clip", type=float, default=None, help="PPO clip, low side (unset: 0.2)")
    g.add_argument("--eps-clip-high", type=float, default=None,
                   help="PPO clip, high side (unset: 0.28)")
    g.add_argument("--eps-clip-c", type=float, default=None,
                   help="dual-clip bound c > 1 for negative advantages (unset: off)")
    g.add_argument("--policy-ratio", default=None, choices=get_args(PolicyRatio),
                   help="token (PPO) or sequence (GSPO) importance ratio (unset: token)")
    g.add_argument("--loss-aggregation", default=None, choices=get_args(LossAggregation),
                   help="token_mean (DAPO), sequence_mean (GRPO), sequence_sum_norm (Dr. GRPO) "
                        "(unset: token_mean)")
    g.add_argument("--loss-norm-tokens", type=int, default=None,
                   help="sequence_sum_norm's constant in tokens (unset: longest in minibatch)")
    g.add_argument("--use-rollout-logprobs", action="store_true",
                   help="use the engine's rollout logprobs as the PPO ratio's old policy")
    g.add_argument("--use-tis", action="store_true",
                   help="truncated importance sampling between trainer and rollout logprobs")
    g.add_argument("--tis-clip", type=float, default=None, help="TIS upper clamp (unset: 2.0)")
    g.add_argument("--tis-clip-low", type=float, default=None, help="TIS lower clamp (unset: 0)")
    g.add_argument("--use-icepop", action="store_true",
                   help="IcePop: mask tokens whose trainer/rollout probability ratio is outside "
                        "[--icepop-low, --icepop-high]")
    g.add_argument("--icepop-low", type=float, default=None, help="IcePop lower bound (unset: 0.5)")
    g.add_argument("--icepop-high", type=float, default=None, help="IcePop upper bound (unset: 5)")
    g.add_argument("--use-opsm", action="store_true",
                   help="off-policy sequence masking of negative-advantage samples")
    g.add_argument("--opsm-delta", type=float, default=None,
                   help="OPSM threshold, nats per token (unset: 1e-4)")
    g.add_argument("--mask-offpolicy-in-partial-rollout", action="store_true",
                   help="train only tokens sampled by each context's newest weight version "
                        "(needs --partial-rollout or --fully-async)")
    g.add_argument("--entropy-coef", type=float, default=None, help="entropy bonus (unset: 0)")
    g.add_argument("--use-kl-loss", action="store_true",
                   help="add a KL loss against a frozen copy of the initial weights")
    g.add_argument("--kl-loss-coef", type=float, default=None, help="KL loss coefficient (unset: 0)")
    g.add_argument("--kl-loss-type", default=None, choices=get_args(KlLossType),
                   help="KL loss estimator (unset: k1)")


def add_training_flags(p: argparse.ArgumentParser) -> None:
    """Adds the "training" group: optimizer, batching, LoRA and the trainer's threads."""
    g = p.add_argument_group("training", "optimizer, batching, LoRA and the trainer process")
    g.add_argument("--lr", type=float, default=None, help="AdamW learning rate (unset: 5e-6)")
    g.add_argument("--micro-batch-size", type=int, default=None,
                   help="samples per forward/backward (unset: 4)")
    g.add_argument("--num-steps-per-rollout", type=int, default=None,
                   help="optimizer steps per rollout (unset: 1 = fully on-policy)")
    g.add_argument("--seed", type=int, default=1234, help="trainer seed")
    g.add_argument("--trainer-num-threads", type=int, default=None, metavar="N",
                   help="torch threads of the one-process CPU trainer (0: torch's default; "
                        "unset: half the cores when embedded engines run here too)")
    g.add_argument("--use-dynamic-batch-size", action="store_true",
                   help="pack micro-batches by --max-tokens-per-gpu instead of --micro-batch-size")
    g.add_argument("--max-tokens-per-gpu", type=int, default=None,
                   help="padded-token budget of one micro-batch with dynamic batching")
    g.add_argument("--lora-rank", type=int, default=None,
                   help="train a LoRA adapter of this rank (peft) instead of every weight; the "
                        "engines get the merged weights after each step (unset: off)")
    g.add_argument("--lora-alpha", type=float, default=None, help="LoRA alpha (unset: 2 * rank)")
    g.add_argument("--lora-target-modules", nargs="+", default=None,
                   help="module names to adapt (unset: all-linear, every linear layer but the head)")


def train_section(args: argparse.Namespace) -> TrainConfig:
    """The :class:`~relaxtrio.config.TrainConfig` of the flags (unset flags keep its defaults;
    store_true flags count only when given).

    Raises:
        ConfigError: a field validator refused a value; ``param`` is the flag the user typed.
    """
    overrides = {field: getattr(args, dest) for dest, field in _TRAIN_FIELDS.items()}
    try:
        return TrainConfig(**{k: v for k, v in overrides.items() if v is not None and v is not False})
    except ConfigError as exc:  # the validators name the field; the user typed the flag
        flag = _TRAIN_FLAGS.get(exc.param or "")
        if flag is None:
            raise
        raise exc.at_param(flag) from exc
