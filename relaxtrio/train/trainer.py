"""The synchronous policy trainer: scored contexts in, one or more AdamW steps out.

Everything here blocks (torch). The trio driver calls it through
``await trio.to_thread.run_sync(trainer.train_step, scored)`` with the step's
:class:`~relaxtrio.rollout.scored.ScoredSample` s (contexts with their credits); a :class:`Trainer`
is not thread-safe, so the driver never runs two of its methods at once. It never changes
torch's global state (thread count, default dtype, global RNG); the caller owns those.

One :meth:`Trainer.train_step` is GRPO/PPO on one rollout's samples (DeepSeekMath,
arXiv 2402.03300, section 4.1; PPO, arXiv 1707.06347), in the order of
docs/export-and-credit.md#what-the-trainer-does-with-an-advantage:

1. loss masks: with ``mask_offpolicy_in_partial_rollout``, tokens sampled by an older weight
   version are removed (:func:`~relaxtrio.train.offpolicy.newest_version_loss_mask`);
2. no-grad passes where needed: the frozen reference model's logprobs (KL loss or shaping), and
   the pre-update ("old") logprobs when there are several minibatches or KL shaping needs them
   before any loss; ``rollout_logprob_abs_diff`` is measured against the pre-update logprobs;
3. token advantages: each sample's base credit broadcast over its trained tokens, KL-shaped
   returns (``kl_coef``), whitening (``normalize_advantages``), see
   :mod:`relaxtrio.train.estimators`;
4. per minibatch: forward/backward every micro-batch (``micro_batch_size`` samples, or packed by
   ``max_tokens_per_gpu`` with dynamic batching) with the loss reduced against the *minibatch's*
   denominators, so accumulation equals the unsplit loss; the loss is the clipped surrogate with
   its ratio options and off-policy weights (TIS, IcePop, OPSM), minus the entropy bonus, plus
   the KL loss; clip the gradient norm, AdamW step.

With a single minibatch and no KL shaping the old logprobs are the detached logprobs of the same
forward pass (the weights have not moved yet), which saves one full forward per step and gives a
ratio of exactly 1. Samples whose advantage is 0 still count in the denominators (the standard
GRPO/DAPO choice: they dilute the step rather than being dropped). All logprobs use
``config.temperature``, the rollout's sampling temperature.
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..config import TrainConfig
from .batching import (
    MicroBatch,
    SampleLike,
    ScoredLike,
    collate,
    plan_configured_micro_batches,
    special_token_ids,
    split_minibatches,
    validate_samples,
)
from .checkpoint import load_model_dir, save_checkpoint_dir, save_run_checkpoint, save_weights_dir
from .estimators import token_advantages
from .logprobs import logprob_temperature, takes_logits_to_keep
from .lora import apply_lora, merged_state_dict
from .loss import LossDenominators
from .objective import (
    gather_rows,
    micro_batch_forward,
    micro_batch_objective,
    minibatch_denominators,
    observe_pre_update,
)
from .offpolicy import trained_loss_masks
from .optim_state import fused_adamw_fits, keep_adamw_kernel, load_optimizer_into_one_process
from .stats import StepAccumulator, TrainStats

__all__ = ["Trainer"]


class Trainer:
    """Owns a causal LM and its AdamW optimizer; trains it on exported samples.

    The model is kept in ``eval()`` mode: dropout stays off in every pass (gradients still
    flow), so old and new logprobs come from the same function. SmolLM2/Llama have no dropout.

    Args:
        model: a transformers causal LM (``PreTrainedModel``); moved to ``config.device``.
        config: optimizer, loss and batching settings.

    Attributes:
        model: the policy being trained.
        config: the :class:`TrainConfig` in use.
        optimizer: ``torch.optim.AdamW`` over the trainable parameters; its fused kernel where
            :func:`fused_adamw_fits` (on CPU 4-5x faster per step than torch's default).
        num_optimizer_steps: optimizer steps taken since construction (or the loaded state).
        ref_model: a frozen copy of the initial weights when the KL loss or KL shaping needs a
            reference policy (``config.needs_reference_model``), else None (also with LoRA,
            whose reference is the base model with the adapter disabled).
        lora: whether the model carries a LoRA adapter (``config.lora_rank > 0``): only the
            adapter trains, and :meth:`save_weights` / :meth:`save_checkpoint` write the merged
            weights.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: TrainConfig | None = None,
        *,
        reference_model: torch.nn.Module | None = None,
    ) -> None:
        self.config = config if config is not None else TrainConfig()
        self.lora = self.config.lora_rank > 0
        self.model = self._prepare_policy(model)
        self.model.eval()
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self._logits_to_keep = takes_logits_to_keep(self.model)
        self._fused_adamw = fused_adamw_fits(self._params)
        self.optimizer = torch.optim.AdamW(
            self._params,
            lr=self.config.lr,
            betas=self.config.betas,
            eps=self.config.adam_eps,
            weight_decay=self.config.weight_decay,
            fused=self._fused_adamw or None,
        )
        self.num_optimizer_steps = 0
        self._temperature = logprob_temperature(self.config.temperature)
        self.ref_model: torch.nn.Module | None = None
        if self.config.needs_reference_model and not self.lora:
            # With LoRA, the KL reference policy is the base model itself, with the adapter disabled.
            reference = reference_model if reference_model is not None else self._initial_reference()
            self.ref_model = self._prepare_reference(reference)
        self._rng = random.Random(self.config.seed)
        self._threads: Callable[[], int] | None = None
        self._pad_token_id, self._image_token_id = special_token_ids(model)

    def _prepare_policy(self, model: torch.nn.Module) -> torch.nn.Module:
        """The trained module: ``model`` with its LoRA adapter (if any), on ``config.device``."""
        return (apply_lora(model, self.config) if self.lora else model).to(self.config.device)

    def _initial_reference(self) -> torch.nn.Module:
        """The reference policy when none is given: a copy of the initial weights."""
        return copy.deepcopy(self.model)

    def _prepare_reference(self, model: torch.nn.Module) -> torch.nn.Module:
        """The frozen KL reference policy, on ``config.device``, in eval mode."""
        return model.to(self.config.device).requires_grad_(False).eval()

    @classmethod
    def from_pretrained(
        cls, model_dir: Path, config: TrainConfig | None = None, *, reference_dir: Path | None = None
    ) -> Trainer:
        """Load ``model_dir`` (HF layout) in float32 and build a trainer around it.

        Args:
            model_dir: a directory ``AutoModelForCausalLM.from_pretrained`` accepts (local only),
                or a vision-language model directory (its ``config.json`` has a
                ``vision_config``; loaded with ``AutoModelForImageTextToText``).
            config: trainer settings; defaults to ``TrainConfig()``.
            reference_dir: where the frozen reference policy's weights come from when the
                config needs one (a resumed run passes the original model here, so the KL terms
                keep measuring the distance from the initial policy); None: ``model_dir``.
        """
        reference = None
        cfg = config if config is not None else TrainConfig()
        if reference_dir is not None and cfg.needs_reference_model and cfg.lora_rank == 0:
            reference = load_model_dir(Path(reference_dir))
        return cls(load_model_dir(Path(model_dir)), config, reference_model=reference)

    # ------------------------------------------------------------------ training

    def train_step(
        self, scored: Sequence[ScoredLike], *, threads: Callable[[], int] | None = None,
    ) -> TrainStats:
        """Run ``config.num_minibatches`` policy-gradient steps on one rollout's scored contexts.

        Args:
            scored: the step's contexts with their credits
                (``relaxtrio.rollout.scored.ScoredSample``, or anything with the fields of
                :class:`~relaxtrio.train.ScoredLike`): each ``sample`` is ``TrainingSample``-like
                (:class:`~relaxtrio.train.SampleLike`); each ``advantage`` is one finite base
                credit (an estimator's or the custom advantage function's), broadcast over the
                sample's ``loss_mask == 1`` tokens before KL shaping and whitening.
            threads: asked (in the calling thread) before every micro-batch forward and every
                optimizer step for the torch compute threads to use next (``> 0``; a CPU
                trainer sharing cores with engines that may stop generating mid-update:
                :meth:`relaxtrio.cpu_threads.ThreadSplit.update_threads`); the thread count
                at entry is restored on return. None: leave torch's setting alone.

        Returns:
            The step's :class:`TrainStats`.

        Raises:
            ValueError: ``scored`` is empty, a sample breaks its length/mask invariants
                (``samples[i]`` names ``scored[i].sample``), an advantage is not finite
                (``advantages[i]``), or a rollout logprob on a trained token is not finite.
        """
        before = torch.get_num_threads()
        self._threads = threads
        try:
            return self._train_step([s.sample for s in scored], [s.advantage for s in scored])
        finally:
            self._threads = None
            if threads is not None and torch.get_num_threads() != before:
                torch.set_num_threads(before)

    def _pace_threads(self) -> None:
        """Applies the thread count :meth:`train_step`'s ``threads`` asks for now."""
        if self._threads is not None:
            wanted = self._threads()
            if wanted > 0 and wanted != torch.get_num_threads():
                torch.set_num_threads(wanted)

    def _train_step(self, samples: Sequence[SampleLike], advantages: Sequence[float]) -> TrainStats:
        t0 = time.perf_counter()
        validate_samples(samples, advantages)
        cfg = self.config
        lengths = [len(s.token_ids) for s in samples]
        masks = trained_loss_masks(samples, mask_offpolicy=cfg.mask_offpolicy_in_partial_rollout)
        acc = StepAccumulator()
        acc.extra["offpolicy_masked_tokens"] = sum(sum(s.loss_mask) for s in samples) - sum(map(sum, masks))
        minibatches = split_minibatches(len(samples), cfg.num_minibatches, self._rng)
        fused = len(minibatches) == 1 and cfg.kl_coef <= 0
        old_by_sample = (None if fused else
                         self._no_grad_logprobs(self.model, samples, masks, acc, trained_only=True))
        ref_by_sample = self._reference_logprobs(samples, masks) if cfg.needs_reference_model else None
        token_adv, adv_stats = token_advantages(cfg, advantages, masks, old_by_sample, ref_by_sample)
        acc.extra.update(adv_stats)
        steps = micro = padded = 0
        for mb in minibatches:
            den = minibatch_denominators(mb, masks, norm_tokens=cfg.loss_norm_tokens)
            if den.num_tokens == 0:
                continue  # nothing to learn from; an AdamW step would still move the weights
            self.optimizer.zero_grad(set_to_none=True)
            for indices in self._plan(mb, lengths):
                self._pace_threads()
                batch = self._collate(samples, token_adv, indices, masks)
                loss, stats = self._micro_batch_loss(batch, den, old_by_sample, ref_by_sample, acc)
                loss.backward()
                acc.observe_loss(stats)
                micro += 1
                padded += batch.token_ids.numel()
            grad_norm = self._clip_grad_norm()
            acc.grad_norms.append(grad_norm)
            if math.isfinite(grad_norm):
                self._pace_threads()
                self.optimizer.step()
                steps += 1
            else:  # never let a nan/inf gradient reach the weights
                acc.num_nonfinite_grad_steps += 1
            self.optimizer.zero_grad(set_to_none=True)
        self.num_optimizer_steps += steps
        self._reduce_stats(acc)
        return acc.finish(
            num_samples=len(samples),
            num_optimizer_steps=steps,
            num_micro_batches=micro,
            num_padded_tokens=padded,
            lr=cfg.lr,
            elapsed_s=time.perf_counter() - t0,
        )

    def _micro_batch_loss(
        self,
        batch: MicroBatch,
        den: LossDenominators,
        old_by_sample: dict[int, Tensor] | None,
        ref_by_sample: dict[int, Tensor] | None,
        acc: StepAccumulator,
    ) -> tuple[Tensor, dict[str, float]]:
        """Forward one micro-batch and build its loss (policy, entropy, KL terms) with grad."""
        # Every term reads positions of the loss mask only: no logits before its first one.
        logits, logprobs = self._forward(self.model, batch, trained_only=True)
        if old_by_sample is None:  # weights untouched so far: this pass *is* the pre-update policy
            pre = logprobs.detach()
            observe_pre_update(acc, batch, pre, logits, config=self.config, temperature=self._temperature)
        else:
            pre = gather_rows(old_by_sample, batch)
        use_ref = ref_by_sample is not None and self.config.use_kl_loss
        ref = gather_rows(ref_by_sample, batch) if use_ref and ref_by_sample is not None else None
        return micro_batch_objective(self.config, batch, logits=logits, logprobs=logprobs, pre=pre,
                                     ref=ref, den=den, temperature=self._temperature)

    def _forward(self, model: torch.nn.Module, batch: MicroBatch, *, trained_only: bool) -> tuple[Tensor, Tensor]:
        """See :func:`~relaxtrio.train.objective.micro_batch_forward`; ``trained_only`` cuts the
        prompt where the model allows it."""
        return micro_batch_forward(model, batch, config=self.config, temperature=self._temperature,
                                   cut_prompt=trained_only and self._logits_to_keep)

    def _plan(self, indices: Sequence[int], lengths: Sequence[int]) -> list[list[int]]:
        return plan_configured_micro_batches(self.config, indices, lengths)

    def _reference_logprobs(
        self, samples: Sequence[SampleLike], masks: Sequence[Sequence[int]]
    ) -> dict[int, Tensor]:
        """The frozen reference policy's logprobs: the initial weights, or the bare LoRA base."""
        if self.lora:
            with self.model.disable_adapter():  # type: ignore[operator]
                return self._no_grad_logprobs(self.model, samples, masks, None, trained_only=True)
        assert self.ref_model is not None
        return self._no_grad_logprobs(self.ref_model, samples, masks, None, trained_only=True)

    @torch.no_grad()
    def compute_logprobs(self, samples: Sequence[SampleLike]) -> list[list[float]]:
        """Current-policy logprobs of every sample (no grad, micro-batched like training).

        Args:
            samples: ``TrainingSample``-like objects; only ``token_ids`` matter here, but all
                three fields are validated.

        Returns:
            One list per sample, ``len == len(sample.token_ids)``; entry ``t`` is
            ``log p(token_ids[t] | token_ids[:t])`` at ``config.temperature`` and entry 0 is 0.0.

        Raises:
            ValueError: a sample breaks its length invariants.
        """
        validate_samples(samples, None)
        per_sample = self._no_grad_logprobs(self.model, samples, [s.loss_mask for s in samples], None)
        return [per_sample[i].tolist() for i in range(len(samples))]

    @torch.no_grad()
    def _no_grad_logprobs(
        self,
        model: torch.nn.Module,
        samples: Sequence[SampleLike],
        masks: Sequence[Sequence[int]],
        acc: StepAccumulator | None,
        *,
        trained_only: bool = False,
    ) -> dict[int, Tensor]:
        """No-grad logprobs of all samples under ``model``; returns ``{index: (len_i,) float32}``.

        With ``trained_only`` (the old and reference passes, whose every consumer reads
        positions of ``masks`` only) the logprobs before each micro-batch's first trained token
        are 0.0 instead of computed (see :meth:`_forward`).
        """
        lengths = [len(s.token_ids) for s in samples]
        out: dict[int, Tensor] = {}
        for indices in self._plan(range(len(samples)), lengths):
            self._pace_threads()
            batch = self._collate(samples, None, indices, masks)
            logits, logprobs = self._forward(model, batch, trained_only=trained_only)
            if acc is not None:
                observe_pre_update(acc, batch, logprobs, logits, config=self.config, temperature=self._temperature)
            for b, i in enumerate(indices):
                out[i] = logprobs[b, : lengths[i]].clone()
        return out

    # Overridden by the sharded trainer (relaxtrio.train.distributed), with ``_plan`` above:
    # which micro-batches this process runs, the gradient norm over every rank, and the step's
    # statistics over every rank.

    def _clip_grad_norm(self) -> float:
        return float(torch.nn.utils.clip_grad_norm_(self._params, self.config.max_grad_norm))

    def _reduce_stats(self, acc: StepAccumulator) -> None:
        """One process holds the whole step's statistics already."""

    def _collate(
        self,
        samples: Sequence[SampleLike],
        advantages: Sequence[float | Tensor] | None,
        indices: list[int],
        masks: Sequence[Sequence[int]] | None = None,
    ) -> MicroBatch:
        return collate(
            samples, advantages, indices, pad_token_id=self._pad_token_id, device=self.config.device,
            image_token_id=self._image_token_id, loss_masks=masks,
        )

    # ------------------------------------------------------------------ saving

    def save_weights(self, out_dir: Path) -> Path:
        """Write the current weights for an engine: ``model.safetensors`` + ``config.json``.

        Atomic per file (temp file + rename, weights last); tied embeddings are stored once.
        SmolLM2-135M fp32 (538 MB) took 1.1-1.8 s on the 2-core CPU dev machine.

        Args:
            out_dir: directory to write into (created if missing; other files are kept).

        Returns:
            ``out_dir`` (pass it to the engine's update-weights-from-disk call).
        """
        if self.lora:  # the engines serve base + adapter, merged (train/lora.py)
            base, merged = merged_state_dict(self.model)
            return save_weights_dir(base, Path(out_dir), state_dict=merged)
        return save_weights_dir(self.model, Path(out_dir))

    def engine_weights(self) -> tuple[torch.nn.Module, Callable[[], dict[str, Tensor]] | None]:
        """What the engines load, for :meth:`relaxtrio.run.inference.Inference.push`.

        Returns:
            ``(model, state_dict)``: the policy itself and None; with LoRA the wrapped base
            model and a callable that merges the adapter into the base weights (blocking torch
            work: the push calls it in its writing thread), so the engines get plain weights in
            the base model's layout, as :meth:`save_weights` writes them.
        """
        if not self.lora:
            return self.model, None
        return self.model.get_base_model(), lambda: merged_state_dict(self.model)[1]  # type: ignore[operator]

    def save_checkpoint(
        self, out_dir: Path, tokenizer_dir: Path | None = None, *, include_optimizer: bool = False
    ) -> Path:
        """Write a full Hugging Face directory that ``from_pretrained`` can reload.

        Args:
            out_dir: the checkpoint directory; replaced as a whole (see
                :func:`~relaxtrio.train.checkpoint.save_checkpoint_dir`).
            tokenizer_dir: copy tokenizer files (and chat templates) from here, or None.
            include_optimizer: also write ``optimizer.pt`` (AdamW moments, 2x the weights'
                size, plus ``num_optimizer_steps``); reload it with :meth:`load_optimizer_state`.

        Returns:
            ``out_dir``.

        Raises:
            FileNotFoundError: ``tokenizer_dir`` is missing or has no tokenizer files.
        """
        state = self._optimizer_state() if include_optimizer else None
        model, merged = (merged_state_dict(self.model) if self.lora else (self.model, None))
        return save_checkpoint_dir(
            model, Path(out_dir), tokenizer_dir=tokenizer_dir, optimizer_state=state, state_dict=merged
        )

    def _optimizer_state(self) -> dict[str, Any]:
        """What ``optimizer.pt`` holds: the AdamW ``state_dict`` and ``num_optimizer_steps``."""
        return {"optimizer": self.optimizer.state_dict(), "num_optimizer_steps": self.num_optimizer_steps}

    def save_run_checkpoint(
        self, save_dir: Path, steps_done: int, *, state: Mapping[str, Any], tokenizer_dir: Path | None,
        keep: int,
    ) -> Path:
        """Writes a resumable run checkpoint (:func:`~relaxtrio.train.checkpoint.save_run_checkpoint`)
        with this trainer's weights, optimizer and :meth:`resume_state` under ``"trainer"``.

        Args:
            save_dir: the ``--save`` directory.
            steps_done: rollout steps completed.
            state: the rest of ``state.json`` (rollout cursor, metrics, ...).
            tokenizer_dir: tokenizer files to copy, or None.
            keep: newest checkpoints kept.

        Returns:
            The new checkpoint directory.
        """
        return save_run_checkpoint(
            Path(save_dir), steps_done, self.model, optimizer_state=self._optimizer_state(),
            state={**state, "trainer": self.resume_state()}, tokenizer_dir=tokenizer_dir, keep=keep,
        )

    def load_optimizer_state(self, checkpoint_dir: Path) -> None:
        """Restore the AdamW state and step counter written by ``save_checkpoint``.

        A checkpoint of W sharded ranks (``optimizer.dcp/`` instead of ``optimizer.pt``) loads
        too: its shards are read into full tensors (:mod:`relaxtrio.train.optim_state`).

        Args:
            checkpoint_dir: a directory saved with ``include_optimizer=True``.

        Raises:
            FileNotFoundError: ``checkpoint_dir`` has neither ``optimizer.pt`` nor ``optimizer.dcp/``.
            ConfigError: ``optimizer.dcp/`` holds another model's state.
        """
        self.num_optimizer_steps = load_optimizer_into_one_process(
            self.model, self.optimizer, checkpoint_dir, device=self.config.device)
        keep_adamw_kernel(self.optimizer, fused=self._fused_adamw)

    def resume_state(self) -> dict[str, Any]:
        """JSON state a resumed run needs besides weights and optimizer (``state.json["trainer"]``).

        Holds the optimizer step count, the minibatch-shuffling RNG and the learning rate (it is
        constant: there is no LR scheduler whose state would need saving).
        """
        version, internal, gauss = self._rng.getstate()
        return {"num_optimizer_steps": self.num_optimizer_steps, "lr": self.config.lr,
                "lr_scheduler": None, "shuffle_rng": [version, list(internal), gauss]}

    def load_resume_state(self, checkpoint_dir: Path, state: Mapping[str, Any]) -> None:
        """Restores the optimizer (``optimizer.pt`` or ``optimizer.dcp/``) and :meth:`resume_state`.

        Args:
            checkpoint_dir: the checkpoint directory (its weights are loaded by the caller,
                e.g. :meth:`from_pretrained` on the same directory).
            state: ``state.json["trainer"]`` of that checkpoint.

        Raises:
            FileNotFoundError: the checkpoint has no optimizer state.
            ConfigError: its optimizer state belongs to another model.
        """
        self.load_optimizer_state(checkpoint_dir)
        version, internal, gauss = state["shuffle_rng"]
        self._rng.setstate((version, tuple(internal), gauss))
        self.num_optimizer_steps = int(state["num_optimizer_steps"])
