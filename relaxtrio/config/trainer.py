"""The trainer's configuration (:class:`TrainConfig`: optimizer, policy loss, batching, LoRA) and
the vocabulary of the algorithm flags (estimators, loss aggregations, ratios, KL estimators).

Re-exported by :mod:`relaxtrio.config` (import it from there).

May import: attrs, :mod:`relaxtrio._errors` and :mod:`relaxtrio._validate` only.
"""

from __future__ import annotations

from typing import Any, Final, Literal, get_args

import attrs

from .._errors import ConfigError
from .._validate import (
    is_real,
    non_negative_number,
    one_of,
    optional_positive_int,
    positive_int,
    positive_number,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ESTIMATORS_REJECTING_CUSTOM_ADVANTAGE",
    "ESTIMATORS_WITH_KL_SHAPING",
    "MULTI_CONTEXT_NEEDS_DYNAMIC_BATCHING",
    "AdvantageEstimator",
    "KlLossType",
    "LossAggregation",
    "PolicyRatio",
    "TrainConfig",
]


AdvantageEstimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline", "gspo"]
"""``--advantage-estimator``: how a Group's rewards become each context's base credit (see
:mod:`relaxtrio.rollout.advantages`; ``gspo`` is GRPO credit with GSPO's sequence-level ratio)."""

ADVANTAGE_ESTIMATORS: Final[tuple[str, ...]] = get_args(AdvantageEstimator)

ESTIMATORS_REJECTING_CUSTOM_ADVANTAGE: Final = ("rloo", "reinforce_plus_plus_baseline")
"""Their baseline is built from the Group's rewards, which custom advantage replaces."""

ESTIMATORS_WITH_KL_SHAPING: Final = ("rloo", "reinforce_plus_plus_baseline")
"""REINFORCE-style estimators whose returns may carry a reference-KL penalty (``--kl-coef``);
GRPO-style ones regularize with the KL loss instead (DeepSeekMath, arXiv 2402.03300, section 4.1)."""

LossAggregation = Literal["token_mean", "sequence_mean", "sequence_sum_norm"]
"""``--loss-aggregation``: how per-token loss terms become one number (see
:func:`relaxtrio.train.loss.aggregate`)."""

PolicyRatio = Literal["token", "sequence"]
"""``--policy-ratio``: PPO's per-token ratio, or GSPO's length-normalized sequence ratio."""

KlLossType = Literal["k1", "k2", "k3", "low_var_kl"]
"""``--kl-loss-type``: the estimator of KL(current || reference) in the KL loss."""


MULTI_CONTEXT_NEEDS_DYNAMIC_BATCHING: Final = (
    "a recipe that exports several contexts from a Session must also enable dynamic batching "
    "(--use-dynamic-batch-size --max-tokens-per-gpu N): the number of training rows, and their "
    "lengths, then vary from Session to Session and step to step, so micro-batches are packed by "
    "a token budget rather than a fixed sample count (docs/export-and-credit.md#multi-context-dynamic-batching)."
)
"""Why :meth:`TrainConfig.refuse_multi_context` refuses (the first multi-context export)."""


def _non_negative_int(instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError.at(attribute.name, f"must be an int >= 0, got {value!r}")


def _optional_positive_number(instance: Any, attribute: attrs.Attribute, value: float | None) -> None:
    if value is not None:
        positive_number(instance, attribute, value)


def _optional_above_one(instance: Any, attribute: attrs.Attribute, value: float | None) -> None:
    if value is not None and not (is_real(value) and value > 1):
        raise ConfigError.at(attribute.name, f"must be a finite number > 1, got {value!r}")


def _betas(instance: object, attribute: attrs.Attribute, value: tuple[float, float]) -> None:
    if len(value) != 2 or not all(0.0 <= b < 1.0 for b in value):
        raise ConfigError.at(attribute.name, f"must be two numbers in [0, 1), got {value!r}")


@attrs.frozen(kw_only=True)
class TrainConfig:
    """How :class:`~relaxtrio.train.Trainer` updates the policy.

    The fields after ``temperature`` follow what happens after the per-context base credit
    (docs/export-and-credit.md#what-the-trainer-does-with-an-advantage): returns with optional
    KL shaping, whitening, the ratio and its clipping, off-policy weights and masks, entropy and
    KL loss terms, reduction; then batching.

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
        seed: seeds the trainer's own minibatch shuffling RNG and the LoRA adapter's initial
            ``A`` matrices (it never touches global RNGs), so every rank of a sharded trainer
            starts from the same adapter.
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
        temperature: the rollouts' sampling temperature. Every trainer logprob (old, current,
            reference) and the entropy are computed as ``log_softmax(logits / temperature)``,
            SGLang's convention for the rollout logprobs, so ratios, KL terms and importance
            weights compare the distribution that was actually sampled from (a temperature
            below 1e-6 is greedy and uses 1.0, as the engine does). In a run it is not set by
            hand: :attr:`TrainRunConfig.trainer_config` copies ``GenerationConfig.temperature``.
        kl_coef: reference-KL reward shaping while the estimator builds returns
            (``--kl-coef``): token ``t`` gets ``A - kl_coef * sum_{s >= t} KL_s`` with
            ``KL_s = old - ref`` logprob (k1). Only REINFORCE-style estimators support it.
        normalize_advantages: whiten the step's token advantages over every trained token
            (``(A - mean) / sqrt(var + 1e-8)``), after shaping (``--normalize-advantages``).
            :attr:`TrainRunConfig.trainer_config` turns it on for
            ``reinforce_plus_plus_baseline``, whose batch normalization is part of the method.
        clip_ratio_c: dual-clip bound ``c > 1`` for negative advantages (``--eps-clip-c``), or
            None (off).
        policy_ratio: ``token`` (PPO) or ``sequence`` (GSPO's length-normalized sequence ratio,
            ``--policy-ratio``; set by ``--advantage-estimator gspo``).
        loss_aggregation: ``token_mean`` (DAPO token-level), ``sequence_mean`` (GRPO's mean over
            each sample's tokens, then over samples) or ``sequence_sum_norm`` (Dr. GRPO: each
            sample's token sum over a constant, then the mean over samples).
        loss_norm_tokens: the constant of ``sequence_sum_norm`` in tokens; None uses the
            minibatch's largest trained-token count.
        use_tis: truncated importance sampling: weight each token's policy loss by
            ``clamp(exp(old - rollout), tis_clip_low, tis_clip)`` (trainer old vs engine
            rollout logprobs; ``--use-tis``).
        tis_clip: upper clamp of the TIS weight (``--tis-clip``).
        tis_clip_low: lower clamp of the TIS weight (``--tis-clip-low``).
        use_icepop: IcePop-style masking: the same weight ``k = exp(old - rollout)`` is kept where
            ``icepop_low <= k <= icepop_high`` and the token is masked (weight 0) elsewhere.
        icepop_low: lower bound of the kept band.
        icepop_high: upper bound of the kept band.
        use_opsm: off-policy sequence masking (``--use-opsm``): a sample's negative-advantage
            tokens are masked when its mean ``rollout - current`` logprob exceeds
            ``opsm_delta``.
        opsm_delta: the OPSM threshold in nats per token (``--opsm-delta``).
        mask_offpolicy_in_partial_rollout: train only the tokens sampled by a sample's newest
            weight version; older attempts of a resumed request, and turns sampled in an
            earlier step, get loss mask 0 (``--mask-offpolicy-in-partial-rollout``).
        entropy_coef: entropy bonus: the loss gets ``- entropy_coef * entropy`` aggregated like
            the policy loss (``--entropy-coef``).
        use_kl_loss: add an independent KL(current || reference) loss term against a frozen
            copy of the initial weights (``--use-kl-loss``); reported as ``kl_loss`` even when
            its coefficient is 0.
        kl_loss_coef: its coefficient (``--kl-loss-coef``).
        kl_loss_type: its estimator (``k1``, ``k2``, ``k3``, ``low_var_kl``; ``--kl-loss-type``).
        use_dynamic_batch_size: pack each minibatch into micro-batches by a padded-token budget
            (longest first) instead of ``micro_batch_size`` samples (``--use-dynamic-batch-size``).
        max_tokens_per_gpu: that budget in padded tokens per forward (``--max-tokens-per-gpu``);
            a longer sample gets a micro-batch of its own.
        lora_rank: train a LoRA adapter of this rank instead of the full weights
            (``--lora-rank``; 0: off). The engines get the merged weights after every step (see
            :mod:`relaxtrio.train.lora`).
        lora_alpha: LoRA's scale numerator (``--lora-alpha``; None: ``2 * lora_rank``).
        lora_target_modules: module names to adapt (``--lora-target-modules``);
            ``("all-linear",)`` adapts every linear layer except the output head.

    Raises:
        ConfigError: a field out of range, or a combination that cannot work (naming the flags).
    """

    lr: float = attrs.field(default=5e-6, validator=positive_number)
    weight_decay: float = attrs.field(default=0.0, validator=non_negative_number)
    betas: tuple[float, float] = attrs.field(
        default=(0.9, 0.999), converter=tuple, validator=_betas
    )
    adam_eps: float = attrs.field(default=1e-8, validator=positive_number)
    clip_eps_low: float = attrs.field(default=0.2, validator=non_negative_number)
    clip_eps_high: float = attrs.field(default=0.28, validator=non_negative_number)
    max_grad_norm: float = attrs.field(default=1.0, validator=positive_number)
    micro_batch_size: int = attrs.field(default=4, validator=positive_int)
    max_tokens_per_micro_batch: int | None = attrs.field(
        default=None, validator=optional_positive_int
    )
    num_minibatches: int = attrs.field(default=1, validator=positive_int)
    seed: int = 0
    use_rollout_logprobs_as_old: bool = False
    bf16_autocast: bool = False
    compute_entropy: bool = True
    logprob_chunk_tokens: int = attrs.field(default=1024, validator=positive_int)
    device: str = "cpu"
    temperature: float = attrs.field(default=1.0, validator=non_negative_number)
    # advantages
    kl_coef: float = attrs.field(default=0.0, validator=non_negative_number)
    normalize_advantages: bool = False
    # policy loss
    clip_ratio_c: float | None = attrs.field(default=None, validator=_optional_above_one)
    policy_ratio: PolicyRatio = attrs.field(default="token", validator=one_of(get_args(PolicyRatio)))
    loss_aggregation: LossAggregation = attrs.field(
        default="token_mean", validator=one_of(get_args(LossAggregation))
    )
    loss_norm_tokens: int | None = attrs.field(default=None, validator=optional_positive_int)
    use_tis: bool = False
    tis_clip: float = attrs.field(default=2.0, validator=positive_number)
    tis_clip_low: float = attrs.field(default=0.0, validator=non_negative_number)
    use_icepop: bool = False
    icepop_low: float = attrs.field(default=0.5, validator=non_negative_number)
    icepop_high: float = attrs.field(default=5.0, validator=positive_number)
    use_opsm: bool = False
    opsm_delta: float = attrs.field(default=1e-4, validator=non_negative_number)
    mask_offpolicy_in_partial_rollout: bool = False
    entropy_coef: float = attrs.field(default=0.0, validator=non_negative_number)
    use_kl_loss: bool = False
    kl_loss_coef: float = attrs.field(default=0.0, validator=non_negative_number)
    kl_loss_type: KlLossType = attrs.field(default="k1", validator=one_of(get_args(KlLossType)))
    # batching
    use_dynamic_batch_size: bool = False
    max_tokens_per_gpu: int | None = attrs.field(default=None, validator=optional_positive_int)
    # LoRA
    lora_rank: int = attrs.field(default=0, validator=_non_negative_int)
    lora_alpha: float | None = attrs.field(default=None, validator=_optional_positive_number)
    lora_target_modules: tuple[str, ...] = attrs.field(default=("all-linear",), converter=tuple)

    def __attrs_post_init__(self) -> None:
        def refuse(condition: bool, message: str, param: str) -> None:
            if condition:
                raise ConfigError(message, param=param)

        refuse(self.use_dynamic_batch_size and self.max_tokens_per_gpu is None,
               "--use-dynamic-batch-size needs --max-tokens-per-gpu N (the padded-token budget "
               "of one micro-batch).", "max_tokens_per_gpu")
        refuse(self.use_tis and self.use_icepop,
               "--use-tis and --use-icepop are two corrections of the same rollout/trainer "
               "mismatch; choose one.", "use_icepop")
        refuse((self.use_tis or self.use_icepop) and self.use_rollout_logprobs_as_old,
               "--use-tis / --use-icepop weight by exp(old - rollout) logprobs; with rollout "
               "logprobs as the old policy that weight is always 1 (the ratio already corrects "
               "the mismatch).", "use_tis")
        refuse(self.tis_clip_low > self.tis_clip,
               f"--tis-clip-low {self.tis_clip_low:g} must be <= --tis-clip {self.tis_clip:g}.",
               "tis_clip_low")
        refuse(self.icepop_low >= self.icepop_high,
               f"--icepop-low {self.icepop_low:g} must be < --icepop-high {self.icepop_high:g}.",
               "icepop_low")
        refuse(self.kl_coef > 0 and self.kl_loss_coef > 0,
               "--kl-coef (KL reward shaping in the estimator's returns) and --kl-loss-coef (an "
               "independent KL loss) penalize the same reference KL twice; set only one.",
               "kl_coef")
        refuse(self.kl_loss_coef > 0 and not self.use_kl_loss,
               "--kl-loss-coef has no effect without --use-kl-loss.", "kl_loss_coef")
        refuse(not self.lora_target_modules or not all(isinstance(m, str) and m for m in self.lora_target_modules),
               "--lora-target-modules needs at least one module name (or all-linear).",
               "lora_target_modules")

    def refuse_multi_context(self, contexts_per_session: int, rollout_id: int) -> None:
        """Refuses to train a step in which a Session exported several contexts, unless dynamic
        batching is on. Checked on each step's samples rather than at start-up, so a
        single-context recipe with custom advantage needs no dynamic batching.

        Args:
            contexts_per_session: the most contexts one Session of the step exported.
            rollout_id: the step (named in the message).

        Raises:
            ConfigError: ``param="use_dynamic_batch_size"``, with
                :data:`MULTI_CONTEXT_NEEDS_DYNAMIC_BATCHING` as the reason.
        """
        if contexts_per_session > 1 and not self.use_dynamic_batch_size:
            raise ConfigError(f"rollout {rollout_id}: a Session exported {contexts_per_session} "
                              f"contexts; {MULTI_CONTEXT_NEEDS_DYNAMIC_BATCHING}",
                              param="use_dynamic_batch_size")

    @property
    def needs_reference_model(self) -> bool:
        """Whether a frozen reference copy of the initial weights is kept (KL loss or shaping)."""
        return self.use_kl_loss or self.kl_coef > 0
