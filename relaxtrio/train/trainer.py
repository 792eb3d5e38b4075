"""The synchronous policy trainer: samples + advantages in, one or more AdamW steps out.

Everything here blocks (torch). The trio driver calls it through
``await trio.to_thread.run_sync(trainer.train_step, samples, advantages)``; a :class:`Trainer`
is not thread-safe, so the driver never runs two of its methods at once. It never changes
torch's global state (thread count, default dtype, global RNG); the caller owns those.

One :meth:`Trainer.train_step` is GRPO/PPO on one rollout's samples (DeepSeekMath,
arXiv 2402.03300, section 4.1; PPO, arXiv 1707.06347):

1. pad the samples into micro-batches (right padding + attention mask);
2. old logprobs: the trainer's own logprobs before any update (no grad), or the engine's
   ``rollout_logprobs`` when ``TrainConfig.use_rollout_logprobs_as_old``; either way
   ``rollout_logprob_abs_diff`` is measured against the pre-update trainer logprobs;
3. per minibatch: forward/backward every micro-batch with the loss divided by the minibatch's
   trained-token count (so accumulation equals the big-batch token mean, DAPO's token-level loss),
   clip the gradient norm, AdamW step.

With a single minibatch the old logprobs are the detached logprobs of the same forward pass
(the weights have not moved yet), which saves one full forward per step and gives a ratio of
exactly 1. Samples whose advantage is 0 still count in the token denominator (the standard
GRPO/DAPO choice: they dilute the step rather than being dropped).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import Tensor

from ..config import TrainConfig
from .batching import (
    MicroBatch,
    SampleLike,
    collate,
    plan_micro_batches,
    split_minibatches,
    validate_samples,
)
from .checkpoint import OPTIMIZER_FILE, save_checkpoint_dir, save_weights_dir
from .loss import (
    _forward_logits,
    entropy_from_logits,
    logprob_temperature,
    logprobs_from_logits,
    policy_loss,
)
from .stats import TrainStats

__all__ = ["Trainer"]


class Trainer:
    """Owns a causal LM and its AdamW optimizer; trains it on exported samples.

    The model is kept in ``eval()`` mode: dropout stays off in every pass (gradients still
    flow), so old and new logprobs come from the same function. SmolLM2/Llama have no dropout.

    Args:
        model: a transformers causal LM (``PreTrainedModel``); moved to ``config.device``.
        config: optimizer, clipping and batching settings.

    Attributes:
        model: the policy being trained.
        config: the :class:`TrainConfig` in use.
        optimizer: ``torch.optim.AdamW`` over the trainable parameters.
        num_optimizer_steps: optimizer steps taken since construction (or the loaded state).
    """

    def __init__(self, model: torch.nn.Module, config: TrainConfig | None = None) -> None:
        self.config = config if config is not None else TrainConfig()
        self.model = model.to(self.config.device)
        self.model.eval()
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self._params,
            lr=self.config.lr,
            betas=self.config.betas,
            eps=self.config.adam_eps,
            weight_decay=self.config.weight_decay,
        )
        self.num_optimizer_steps = 0
        self._temperature = logprob_temperature(self.config.temperature)
        self._rng = random.Random(self.config.seed)
        model_config = getattr(model, "config", None)
        text_config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
        pad = getattr(text_config, "pad_token_id", None)
        vocab = getattr(text_config, "vocab_size", None)
        image_token = getattr(model_config, "image_token_id", None)
        self._image_token_id: int | None = image_token if isinstance(image_token, int) else None
        ok = isinstance(pad, int) and pad >= 0 and (vocab is None or pad < vocab)
        self._pad_token_id = pad if ok else 0  # any valid id: padding is masked out

    @classmethod
    def from_pretrained(cls, model_dir: Path, config: TrainConfig | None = None) -> Trainer:
        """Load ``model_dir`` (HF layout) in float32 and build a trainer around it.

        Args:
            model_dir: a directory ``AutoModelForCausalLM.from_pretrained`` accepts (local only),
                or a vision-language model directory (its ``config.json`` has a
                ``vision_config``; loaded with ``AutoModelForImageTextToText``).
            config: trainer settings; defaults to ``TrainConfig()``.
        """
        import json

        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        config_file = Path(model_dir) / "config.json"
        is_vlm = config_file.is_file() and "vision_config" in json.loads(config_file.read_text("utf-8"))
        auto = AutoModelForImageTextToText if is_vlm else AutoModelForCausalLM
        model = auto.from_pretrained(Path(model_dir), dtype=torch.float32, local_files_only=True)
        return cls(model, config)

    # ------------------------------------------------------------------ training

    def train_step(
        self, samples: Sequence[SampleLike], advantages: Sequence[float]
    ) -> TrainStats:
        """Run ``config.num_minibatches`` policy-gradient steps on one rollout's samples.

        Args:
            samples: ``TrainingSample``-like objects (see :class:`~relaxtrio.train.SampleLike`).
            advantages: one finite float per sample, broadcast over its ``loss_mask == 1``
                tokens; ``len(advantages) == len(samples)``.

        Returns:
            The step's :class:`TrainStats`.

        Raises:
            ValueError: the samples break their length/mask invariants, an advantage is not
                finite, or a rollout logprob on a trained token is not finite.
        """
        t0 = time.perf_counter()
        validate_samples(samples, advantages)
        cfg = self.config
        lengths = [len(s.token_ids) for s in samples]
        minibatches = split_minibatches(len(samples), cfg.num_minibatches, self._rng)
        acc = _StepAccumulator()
        fused = len(minibatches) == 1
        old_by_sample = None if fused else self._pre_update_logprobs(samples, lengths, acc)
        steps = micro = padded = 0
        for mb in minibatches:
            mb_tokens = sum(sum(samples[i].loss_mask) for i in mb)
            plan = plan_micro_batches(
                mb,
                lengths,
                micro_batch_size=cfg.micro_batch_size,
                max_tokens_per_micro_batch=cfg.max_tokens_per_micro_batch,
            )
            if mb_tokens == 0:
                continue  # nothing to learn from; an AdamW step would still move the weights
            self.optimizer.zero_grad(set_to_none=True)
            for indices in plan:
                batch = self._collate(samples, advantages, indices)
                logits = _forward_logits(
                    self.model, batch.token_ids, batch.attention_mask,
                    autocast_bf16=cfg.bf16_autocast, model_inputs=batch.model_inputs,
                )  # (B, T, V)
                logprobs = logprobs_from_logits(
                    logits, batch.token_ids, batch.attention_mask,
                    chunk_tokens=cfg.logprob_chunk_tokens, temperature=self._temperature,
                )  # (B, T)
                if fused:  # weights untouched so far: this pass *is* the pre-update policy
                    pre = logprobs.detach()
                    self._observe_pre_update(batch, pre, logits, acc)
                else:
                    pre = _gather_rows(old_by_sample, batch)
                del logits
                old = batch.rollout_logprobs if cfg.use_rollout_logprobs_as_old else pre
                loss, stats = policy_loss(
                    logprobs, old, batch.advantages, batch.loss_mask,
                    clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high,
                    loss_denominator_tokens=mb_tokens,
                )
                loss.backward()
                acc.observe_loss(stats)
                micro += 1
                padded += batch.token_ids.numel()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self._params, cfg.max_grad_norm))
            acc.grad_norms.append(grad_norm)
            if math.isfinite(grad_norm):
                self.optimizer.step()
                steps += 1
            else:  # never let a nan/inf gradient reach the weights
                acc.num_nonfinite_grad_steps += 1
            self.optimizer.zero_grad(set_to_none=True)
        self.num_optimizer_steps += steps
        return acc.finish(
            num_samples=len(samples),
            num_optimizer_steps=steps,
            num_micro_batches=micro,
            num_padded_tokens=padded,
            lr=cfg.lr,
            elapsed_s=time.perf_counter() - t0,
        )

    @torch.no_grad()
    def compute_logprobs(self, samples: Sequence[SampleLike]) -> list[list[float]]:
        """Current-policy logprobs of every sample (no grad, micro-batched like training).

        Args:
            samples: ``TrainingSample``-like objects; only ``token_ids`` matter here, but all
                three fields are validated.

        Returns:
            One list per sample, ``len == len(sample.token_ids)``; entry ``t`` is
            ``log p(token_ids[t] | token_ids[:t])`` and entry 0 is 0.0.

        Raises:
            ValueError: a sample breaks its length invariants.
        """
        validate_samples(samples, None)
        lengths = [len(s.token_ids) for s in samples]
        per_sample = self._pre_update_logprobs(samples, lengths, None)
        return [per_sample[i].tolist() for i in range(len(samples))]

    @torch.no_grad()
    def _pre_update_logprobs(
        self,
        samples: Sequence[SampleLike],
        lengths: Sequence[int],
        acc: _StepAccumulator | None,
    ) -> dict[int, Tensor]:
        """No-grad logprobs of all samples; returns ``{index: (len_i,) float32}``."""
        cfg = self.config
        out: dict[int, Tensor] = {}
        plan = plan_micro_batches(
            range(len(samples)),
            lengths,
            micro_batch_size=cfg.micro_batch_size,
            max_tokens_per_micro_batch=cfg.max_tokens_per_micro_batch,
        )
        for indices in plan:
            batch = self._collate(samples, None, indices)
            logits = _forward_logits(
                self.model, batch.token_ids, batch.attention_mask, autocast_bf16=cfg.bf16_autocast,
                model_inputs=batch.model_inputs,
            )  # (B, T, V)
            logprobs = logprobs_from_logits(
                logits, batch.token_ids, batch.attention_mask, chunk_tokens=cfg.logprob_chunk_tokens,
                temperature=self._temperature,
            )  # (B, T)
            if acc is not None:
                self._observe_pre_update(batch, logprobs, logits, acc)
            for b, i in enumerate(indices):
                out[i] = logprobs[b, : lengths[i]].clone()
        return out

    def _observe_pre_update(
        self, batch: MicroBatch, pre: Tensor, logits: Tensor, acc: _StepAccumulator
    ) -> None:
        with torch.no_grad():
            mask = batch.loss_mask.bool()  # (B, T)
            diff = (batch.rollout_logprobs - pre).abs()[mask]  # (N,)
            entropy = None
            if self.config.compute_entropy:
                ent = entropy_from_logits(
                    logits.detach(), chunk_tokens=self.config.logprob_chunk_tokens,
                    temperature=self._temperature,
                )  # (B, T)
                entropy = float(ent[mask].sum().item())
            acc.observe_pre_update(diff, entropy)

    def _collate(
        self, samples: Sequence[SampleLike], advantages: Sequence[float] | None, indices: list[int]
    ) -> MicroBatch:
        return collate(
            samples, advantages, indices, pad_token_id=self._pad_token_id, device=self.config.device,
            image_token_id=self._image_token_id,
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
        return save_weights_dir(self.model, Path(out_dir))

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
        state = None
        if include_optimizer:
            state = {
                "optimizer": self.optimizer.state_dict(),
                "num_optimizer_steps": self.num_optimizer_steps,
            }
        return save_checkpoint_dir(
            self.model, Path(out_dir), tokenizer_dir=tokenizer_dir, optimizer_state=state
        )

    def load_optimizer_state(self, checkpoint_dir: Path) -> None:
        """Restore the AdamW state and step counter written by ``save_checkpoint``.

        Args:
            checkpoint_dir: a directory saved with ``include_optimizer=True``.

        Raises:
            FileNotFoundError: ``checkpoint_dir / "optimizer.pt"`` does not exist.
        """
        state = torch.load(
            Path(checkpoint_dir) / OPTIMIZER_FILE,
            map_location=self.config.device,
            weights_only=True,
        )
        self.optimizer.load_state_dict(state["optimizer"])
        self.num_optimizer_steps = int(state["num_optimizer_steps"])

    def resume_state(self) -> dict[str, Any]:
        """JSON state a resumed run needs besides weights and optimizer (``state.json["trainer"]``).

        Holds the optimizer step count, the minibatch-shuffling RNG and the learning rate (it is
        constant: there is no LR scheduler whose state would need saving).
        """
        version, internal, gauss = self._rng.getstate()
        return {"num_optimizer_steps": self.num_optimizer_steps, "lr": self.config.lr,
                "lr_scheduler": None, "shuffle_rng": [version, list(internal), gauss]}

    def load_resume_state(self, checkpoint_dir: Path, state: Mapping[str, Any]) -> None:
        """Restores the optimizer (``optimizer.pt``) and :meth:`resume_state` from a run checkpoint.

        Args:
            checkpoint_dir: the checkpoint directory (its weights are loaded by the caller,
                e.g. :meth:`from_pretrained` on the same directory).
            state: ``state.json["trainer"]`` of that checkpoint.

        Raises:
            FileNotFoundError: the checkpoint has no ``optimizer.pt``.
        """
        self.load_optimizer_state(checkpoint_dir)
        version, internal, gauss = state["shuffle_rng"]
        self._rng.setstate((version, tuple(internal), gauss))
        self.num_optimizer_steps = int(state["num_optimizer_steps"])


def _gather_rows(per_sample: dict[int, Tensor] | None, batch: MicroBatch) -> Tensor:
    """Pad precomputed per-sample logprobs back into the batch's ``(B, T)`` layout."""
    assert per_sample is not None
    out = torch.zeros_like(batch.rollout_logprobs)  # (B, T)
    for b, i in enumerate(batch.indices):
        row = per_sample[i]
        out[b, : row.shape[0]] = row
    return out


@attrs.define(eq=False, kw_only=True)
class _StepAccumulator:
    """Token-weighted running sums for one train step's statistics."""

    loss_sum: float = 0.0
    clip_sum: float = 0.0
    kl_sum: float = 0.0
    k3_sum: float = 0.0
    loss_tokens: float = 0.0
    entropy_sum: float | None = None
    diff_sum: float = 0.0
    diff_max: float = 0.0
    pre_tokens: int = 0
    grad_norms: list[float] = attrs.Factory(list)
    num_nonfinite_grad_steps: int = 0

    def observe_loss(self, stats: dict[str, float]) -> None:
        n = stats["num_tokens"]
        self.loss_sum += stats["pg_loss"] * n
        self.clip_sum += stats["clip_fraction"] * n
        self.kl_sum += stats["ppo_kl"] * n
        self.k3_sum += stats["approx_kl_k3"] * n
        self.loss_tokens += n

    def observe_pre_update(self, abs_diff: Tensor, entropy_sum: float | None) -> None:
        if abs_diff.numel():
            self.diff_sum += float(abs_diff.sum().item())
            self.diff_max = max(self.diff_max, float(abs_diff.max().item()))
        self.pre_tokens += abs_diff.numel()
        if entropy_sum is not None:
            self.entropy_sum = (self.entropy_sum or 0.0) + entropy_sum

    def finish(self, **fields: float) -> TrainStats:
        def mean(total: float | None, count: float) -> float:
            return total / count if total is not None and count > 0 else math.nan

        norms = self.grad_norms
        return TrainStats(
            loss=mean(self.loss_sum, self.loss_tokens),
            clip_fraction=mean(self.clip_sum, self.loss_tokens),
            ppo_kl=mean(self.kl_sum, self.loss_tokens),
            approx_kl_k3=mean(self.k3_sum, self.loss_tokens),
            entropy=mean(self.entropy_sum, self.pre_tokens),
            grad_norm=sum(norms) / len(norms) if norms else math.nan,
            rollout_logprob_abs_diff=mean(self.diff_sum, self.pre_tokens),
            rollout_logprob_abs_diff_max=self.diff_max if self.pre_tokens else math.nan,
            num_tokens=self.pre_tokens,
            num_nonfinite_grad_steps=self.num_nonfinite_grad_steps,
            **fields,
        )
