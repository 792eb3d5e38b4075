"""One rank of a sharded trainer: torch.distributed FSDP2 around the ordinary :class:`Trainer`.

W ranks train one policy together. Every rank receives the *whole* step (all samples and
advantages: token ids are small next to the weights), so each computes the same minibatch split
and the same loss denominators as one process would; the only thing that differs per rank is
which micro-batches it runs:

* **split by token count.** Each minibatch's samples are dealt to the ranks greedily, longest
  first, to the rank holding the fewest tokens so far (:func:`split_by_tokens`); every rank then
  plans its own micro-batches exactly as one process plans its (``micro_batch_size``, token
  budget). FSDP2 runs collectives in every forward and backward, so a rank with fewer
  micro-batches runs *padding* micro-batches (a real sample with its loss mask zeroed: zero loss,
  zero gradient, same collectives) until all ranks have run the same number.
* **loss reduction.** The trainer divides each micro-batch's loss by the *minibatch's*
  denominators (token count for the token mean; sample count for the sequence mean), which every
  rank computes over the whole minibatch; the gradient over all ranks is therefore the sum of
  the ranks' gradients. FSDP2's reduce-scatter averages (divides by W; gloo has no pre-multiplied
  sum to do otherwise), so :meth:`ShardedTrainer._clip_grad_norm` multiplies the local gradient
  shards by W before clipping: W ranks then take the update one process takes on the whole batch
  (up to float summation order; the tests check 1e-5 in fp32).
* **global-norm clipping.** ``clip_grad_norm_`` on FSDP2's DTensor gradients reduces the norm over
  every rank's shard; every rank clips by the same factor.
* **statistics.** The step's token-weighted sums are all-reduced, so rank 0's :class:`TrainStats`
  describe the whole batch.
* **weights out.** :meth:`ShardedTrainer.save_weights` and the checkpoint writers gather the full
  state dict on rank 0 (``get_model_state_dict(full_state_dict=True, cpu_offload=True)``, a
  collective every rank joins), and rank 0 alone writes the Hugging Face files.
* **optimizer state** stays sharded: every rank writes its part through
  ``torch.distributed.checkpoint`` into ``optimizer.dcp/`` (instead of ``optimizer.pt``); loading
  reshards it, so a run may resume with another W, one process included, and W ranks resume a
  one-process ``optimizer.pt`` (:mod:`relaxtrio.train.optim_state`).
* **KL reference.** With ``use_kl_loss`` or ``kl_coef`` every rank also holds the frozen
  reference policy, sharded the same way (no gradients, no optimizer state); reference
  logprobs are computed like the old logprobs: each rank its share, then exchanged.
* **LoRA.** The peft adapter is added before sharding; each layer's FSDP2 unit holds its frozen
  base weights and its adapter, and only the adapter's shards have gradients and AdamW state.
  The weight push merges base + adapter on rank 0 from the gathered tensors, as one process
  merges its live ones (:func:`~relaxtrio.train.lora.merged_state_dict`).

Collectives use gloo on CPU and nccl on GPU; every one has the process group's timeout
(``DistributedConfig.collective_timeout_s``), so a rank whose peer died fails instead of hanging.
The driver side (starting ranks, naming the one that died) is :mod:`relaxtrio.train.ranks`.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import torch
import torch.distributed as dist
from torch import Tensor

from ..config import TrainConfig
from .batching import MicroBatch, SampleLike
from .checkpoint import (
    OPTIMIZER_DCP_DIR,
    OPTIMIZER_FILE,
    save_checkpoint_dir,
    save_run_checkpoint,
    save_weights_dir,
)
from .lora import merged_state_dict, require_linear_lora
from .optim_state import keep_adamw_kernel, named_optimizer_state, trainable_names
from .trainer import Trainer

__all__ = [
    "OPTIMIZER_DCP_DIR",
    "RankSpec",
    "ShardedTrainer",
    "init_rank",
    "shard_model",
    "split_by_tokens",
]

@attrs.frozen(kw_only=True)
class RankSpec:
    """Where one rank sits and how it reaches the others.

    Attributes:
        rank: this rank, ``0 <= rank < world_size``.
        world_size: W, the number of ranks.
        local_rank: index among the ranks of this node (its GPU index on GPU).
        master_addr: host of rank 0's rendezvous store.
        master_port: its TCP port.
        collective_timeout_s: seconds any collective may wait for a peer before it fails.
        device: ``"cpu"`` (gloo) or ``"cuda"`` (nccl, device ``cuda:<local_rank>``).
        node: the node's name (host name or Ray node id), for error messages.
    """

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    collective_timeout_s: float
    device: str = "cpu"
    node: str = "localhost"

    @property
    def torch_device(self) -> str:
        """The torch device this rank trains on."""
        return f"cuda:{self.local_rank}" if self.device == "cuda" else "cpu"


def init_rank(rank_spec: RankSpec) -> None:
    """Joins the default process group (gloo on CPU, nccl on GPU) with its collective timeout.

    Raises:
        RuntimeError: the rendezvous failed or timed out (torch's error).
    """
    backend = "nccl" if rank_spec.device == "cuda" else "gloo"
    if rank_spec.device == "cuda":
        torch.cuda.set_device(rank_spec.local_rank)
    dist.init_process_group(
        backend,
        init_method=f"tcp://{rank_spec.master_addr}:{rank_spec.master_port}",
        rank=rank_spec.rank,
        world_size=rank_spec.world_size,
        timeout=datetime.timedelta(seconds=rank_spec.collective_timeout_s),
    )


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """Applies FSDP2 (``fully_shard``) to each decoder layer, then to the whole model.

    Per-layer units keep one layer's full parameters alive at a time; the root unit holds the
    embeddings, the final norm and the (possibly tied) LM head. The model must already be on its
    rank's device. A peft model (LoRA) is sharded the same way: each layer's unit holds its
    frozen base weights and its trainable adapter together (FSDP2 reduces gradients only for
    the parameters that have them).

    Returns:
        ``model`` itself, now an ``FSDPModule`` whose parameters are DTensor shards.
    """
    from torch.distributed.fsdp import fully_shard

    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = getattr(causal_lm, "model", None)
    layers = getattr(inner, "layers", None)
    for layer in layers if layers is not None else ():
        fully_shard(layer)
    fully_shard(model)
    return model


def split_by_tokens(indices: Sequence[int], lengths: Sequence[int], num_ranks: int) -> list[list[int]]:
    """Deals sample indices to ``num_ranks`` ranks, balancing their token counts.

    Longest first (ties: lower index first), each sample goes to the rank with the fewest tokens
    so far (ties: the lower rank); every share keeps the input order. Deterministic, so every
    rank computes the same split without a collective.

    Args:
        indices: the samples to split (a minibatch), in order.
        lengths: token count of every sample of the step, indexed by sample index.
        num_ranks: W >= 1.

    Returns:
        ``num_ranks`` lists covering ``indices`` exactly once; some are empty when there are
        fewer samples than ranks.
    """
    loads = [0] * num_ranks
    shares: list[list[int]] = [[] for _ in range(num_ranks)]
    for i in sorted(indices, key=lambda i: (-lengths[i], i)):
        rank = min(range(num_ranks), key=lambda r: (loads[r], r))
        shares[rank].append(i)
        loads[rank] += lengths[i]
    position = {i: k for k, i in enumerate(indices)}
    return [sorted(share, key=position.__getitem__) for share in shares]


class _Padding(list):
    """A micro-batch run only to keep the ranks' collectives in step: its loss mask is zeroed."""


# Token-weighted sums of the step accumulator that are added over ranks (the rest, like the
# gradient norms, are already the same on every rank).
_SUMMED_STATS: Final = ("loss_sum", "loss_tokens", "clip_sum", "kl_sum", "k3_sum", "diff_sum", "pre_tokens")


class ShardedTrainer(Trainer):
    """One rank's :class:`Trainer` over an FSDP2-sharded model (see the module docstring).

    Every method is a collective: all W ranks call it in the same order with the same arguments
    (the whole step's samples), or the ranks wait until the collective timeout.

    The KL reference policy (``config.needs_reference_model``) is sharded like the policy, with
    no optimizer state; each rank computes the KL reference logprobs of its share of the samples
    and all ranks exchange them (:meth:`_no_grad_logprobs`). With LoRA, the adapter is added
    before sharding and only its shards train; the KL reference is the base with the adapter
    disabled, as in one process.

    Args:
        model: the policy, unsharded, on this rank's device (sharded here, after LoRA).
        config: trainer settings, equal on every rank (``device`` is this rank's device).
        rank: this rank.
        world_size: W.
        load_reference: loads the KL reference policy's unsharded weights (the initial policy,
            also when resuming) onto this rank's device; called once, after the policy is
            sharded, so a rank holds at most one unsharded model at a time. Needed when
            ``config.needs_reference_model`` without LoRA.

    Raises:
        ValueError: a reference policy is needed and ``load_reference`` is None.
    """

    def __init__(
        self, model: torch.nn.Module, config: TrainConfig, *, rank: int, world_size: int,
        load_reference: Callable[[], torch.nn.Module] | None = None,
    ) -> None:
        self._load_reference = load_reference
        super().__init__(model, config)
        self.rank = rank
        self.world_size = world_size
        self._owned: set[int] = set()  # samples this rank's planned micro-batches hold (not padding)

    def _prepare_policy(self, model: torch.nn.Module) -> torch.nn.Module:
        policy = super()._prepare_policy(model)
        if self.lora:
            require_linear_lora(policy)
        return shard_model(policy)

    def _initial_reference(self) -> torch.nn.Module:
        if self._load_reference is None:
            raise ValueError("a sharded trainer with a KL reference policy needs load_reference")
        return self._load_reference()

    def _prepare_reference(self, model: torch.nn.Module) -> torch.nn.Module:
        return shard_model(super()._prepare_reference(model))

    # ------------------------------------------------------------------ step hooks

    def _plan(self, indices: Sequence[int], lengths: Sequence[int]) -> list[list[int]]:
        shares = split_by_tokens(list(indices), lengths, self.world_size)
        plans = [super(ShardedTrainer, self)._plan(share, lengths) for share in shares]
        mine = plans[self.rank]
        self._owned.update(i for micro in mine for i in micro)
        first = next(iter(indices))
        mine += [_Padding([first]) for _ in range(max(map(len, plans)) - len(mine))]
        return mine

    def _collate(
        self,
        samples: Sequence[SampleLike],
        advantages: Sequence[float | Tensor] | None,
        indices: list[int],
        masks: Sequence[Sequence[int]] | None = None,
    ) -> MicroBatch:
        batch = super()._collate(samples, advantages, indices, masks)
        if not isinstance(indices, _Padding):
            return batch
        zero = torch.zeros_like(batch.loss_mask)  # (B, T)
        return attrs.evolve(batch, loss_mask=zero, advantages=torch.zeros_like(batch.advantages))

    def _clip_grad_norm(self) -> float:
        for p in self._params:
            if p.grad is not None:
                p.grad.mul_(self.world_size)  # FSDP2 averaged the ranks' gradients; we need their sum
        norm = torch.nn.utils.clip_grad_norm_(self._params, self.config.max_grad_norm)
        full = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        return float(full)

    def _reduce_stats(self, acc: Any) -> None:
        names = [n for n in _SUMMED_STATS if hasattr(acc, n)]
        sums = getattr(acc, "sums", None)
        keys = sorted(sums) if isinstance(sums, dict) else []
        has_entropy = acc.entropy_sum is not None
        values = [float(getattr(acc, n)) for n in names] + [float(sums[k]) for k in keys]  # type: ignore[index]
        values.append(float(acc.entropy_sum or 0.0))
        total = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(total)
        top = torch.tensor([acc.diff_max], dtype=torch.float64)
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        out = total.tolist()
        for n, v in zip(names, out, strict=False):
            setattr(acc, n, int(v) if isinstance(getattr(acc, n), int) else v)
        for k, v in zip(keys, out[len(names):], strict=False):
            sums[k] = v  # type: ignore[index]
        acc.entropy_sum = out[-1] if has_entropy else None
        acc.diff_max = float(top.item())

    @torch.no_grad()
    def _no_grad_logprobs(self, model: torch.nn.Module, samples: Sequence[SampleLike], masks: Any, acc: Any,
                          *, trained_only: bool = False) -> dict[int, Tensor]:
        # Each rank computes its share; all get all, because the minibatches split differently.
        parent = super()._no_grad_logprobs  # type: ignore[misc]
        self._owned = set()
        local = parent(model, samples, masks, acc, trained_only=trained_only)
        return _all_gather_rows({i: row for i, row in local.items() if i in self._owned}, self.world_size)

    # ------------------------------------------------------------------ weights and state

    def full_state_dict(self) -> dict[str, Tensor]:
        """Gathers the full weights on rank 0 (CPU); other ranks get ``{}``. A collective.

        Keys are the trained module's own (with LoRA: the peft model's, adapter included).
        """
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.model, options=options)
        # Tied parameters (SmolLM2's LM head is the embedding) are written once, as one process
        # writes them, so engines load the same file layout.
        seen: set[int] = set()
        for name, param in self.model.named_parameters(remove_duplicate=False):
            if id(param) in seen:
                state.pop(name, None)
            seen.add(id(param))
        return state

    def _hf_weights(self) -> tuple[torch.nn.Module, dict[str, Tensor]]:
        """The transformers model and the full weights rank 0 writes in its layout (a collective).

        With LoRA: the base model and base + adapter merged from the gathered tensors, what
        :func:`~relaxtrio.train.lora.merged_state_dict` gives one process.
        """
        state = self.full_state_dict()
        if not self.lora:
            return self.model, state
        base = self.model.get_base_model()  # type: ignore[operator]
        if self.rank != 0:
            return base, {}
        prefix = "base_model.model."  # the peft wrapper's prefix of the base model's keys
        return merged_state_dict(self.model, {k.removeprefix(prefix): v for k, v in state.items()})

    def save_weights(self, out_dir: Path) -> Path:
        """Rank 0 writes the gathered full weights for the engines (see :meth:`Trainer.save_weights`)."""
        model, state = self._hf_weights()
        if self.rank == 0:
            save_weights_dir(model, Path(out_dir), state_dict=state)
        dist.barrier()
        return Path(out_dir)

    def save_checkpoint(
        self, out_dir: Path, tokenizer_dir: Path | None = None, *, include_optimizer: bool = False
    ) -> Path:
        """Rank 0 writes the HF directory; with ``include_optimizer`` every rank adds its
        optimizer shard under ``optimizer.dcp/`` (after the directory is in place)."""
        model, state = self._hf_weights()
        if self.rank == 0:
            save_checkpoint_dir(model, Path(out_dir), tokenizer_dir=tokenizer_dir, state_dict=state)
        dist.barrier()
        if include_optimizer:
            self._save_optimizer(Path(out_dir) / OPTIMIZER_DCP_DIR)
        return Path(out_dir)

    def save_run_checkpoint(
        self, save_dir: Path, steps_done: int, *, state: Mapping[str, Any], tokenizer_dir: Path | None,
        keep: int,
    ) -> Path:
        """Writes a run checkpoint: optimizer shards staged by all ranks, moved in by rank 0.

        The shards go to ``save_dir/.optimizer-<steps_done>.staging`` first, then rank 0 writes
        the checkpoint atomically with that directory inside (see
        :func:`~relaxtrio.train.checkpoint.save_run_checkpoint`). With LoRA the weights are
        written as one process writes them, the peft model's adapter files (the driver refuses
        ``--lora-rank`` with ``--save`` / ``--load``, see :class:`~relaxtrio.config.TrainRunConfig`).
        """
        staging = Path(save_dir) / f".optimizer-{steps_done:07d}.staging"
        self._save_optimizer(staging)
        weights = self.full_state_dict()
        out = Path(save_dir) / "unused"
        if self.rank == 0:
            out = save_run_checkpoint(
                Path(save_dir), steps_done, self.model, optimizer_state=None,
                optimizer_dir=(OPTIMIZER_DCP_DIR, staging), state={**state, "trainer": self.resume_state()},
                tokenizer_dir=tokenizer_dir, keep=keep, state_dict=weights,
            )
        dist.barrier()
        return out

    def _save_optimizer(self, directory: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        optim = get_optimizer_state_dict(self.model, self.optimizer)
        dcp.save({"optimizer": optim, "num_optimizer_steps": self.num_optimizer_steps},
                 checkpoint_id=os.fspath(directory))

    def load_optimizer_state(self, checkpoint_dir: Path) -> None:
        """Loads ``optimizer.dcp/`` (resharded to this W), or a one-process ``optimizer.pt``.

        ``optimizer.pt`` holds full tensors keyed by parameter index; every rank reads it,
        names the entries (:func:`~relaxtrio.train.optim_state.named_optimizer_state`) and keeps
        its shard of each (``set_optimizer_state_dict`` with ``full_state_dict=True``).

        Raises:
            FileNotFoundError: the checkpoint has neither.
            ConfigError: the optimizer state belongs to another model.
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        directory = Path(checkpoint_dir) / OPTIMIZER_DCP_DIR
        if not directory.is_dir():
            path = Path(checkpoint_dir) / OPTIMIZER_FILE
            saved = torch.load(path, map_location="cpu", weights_only=True)  # FileNotFoundError
            names = trainable_names(self.model)
            shapes = {n: p.shape for n, p in self.model.named_parameters()}  # DTensor: the full shape
            named = named_optimizer_state(saved["optimizer"], names, shapes, path)
            set_optimizer_state_dict(self.model, self.optimizer, named,
                                     options=StateDictOptions(full_state_dict=True))
            self.num_optimizer_steps = int(saved["num_optimizer_steps"])
            keep_adamw_kernel(self.optimizer, fused=self._fused_adamw)
            return
        state: dict[str, Any] = {"optimizer": get_optimizer_state_dict(self.model, self.optimizer),
                                 "num_optimizer_steps": 0}
        dcp.load(state, checkpoint_id=os.fspath(directory))
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        self.num_optimizer_steps = int(state["num_optimizer_steps"])
        keep_adamw_kernel(self.optimizer, fused=self._fused_adamw)


def _all_gather_rows(local: dict[int, Tensor], world_size: int) -> dict[int, Tensor]:
    """Every rank's ``{sample index: (len_i,) float32}`` merged on every rank (CPU copies)."""
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, {i: row.cpu() for i, row in local.items()})
    device = next(iter(local.values())).device if local else torch.device("cpu")
    return {i: row.to(device) for part in gathered for i, row in part.items()}
