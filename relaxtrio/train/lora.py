"""LoRA adapters (peft) on the policy, and the merged weights the engines serve.

With ``TrainConfig.lora_rank > 0`` the trainer wraps its causal LM with a peft LoRA adapter
(Hu et al., "LoRA", arXiv 2106.09685): every base weight is frozen and only the low-rank ``A``
and ``B`` matrices train. ``B`` starts at zero, so before the first update the adapted model is
exactly the base model.

The engines never see an adapter: after each step the trainer writes the *merged* weights
``W + (alpha / r) * B @ A`` in the base model's own layout (:func:`merged_state_dict`), and the
usual ``update_weights_from_disk`` push loads them. Rollouts are therefore always sampled from
base + adapter, never from the bare base model. The merge is computed out of place: the
trainer's base weights are never modified (an in-place merge and unmerge would drift them by
rounding every step).

peft is imported when a LoRA trainer is built, never at ``import relaxtrio.train``.
"""

from __future__ import annotations

import warnings
from typing import Any, Final

import torch

from .._errors import ConfigError
from ..config import TrainConfig

__all__ = ["ADAPTER_NAME", "apply_lora", "merged_state_dict", "require_linear_lora"]

ADAPTER_NAME: Final = "default"
"""peft's name of the one adapter the trainer adds."""


def apply_lora(model: torch.nn.Module, config: TrainConfig) -> torch.nn.Module:
    """Wraps ``model`` with a fresh LoRA adapter as ``config`` says.

    Args:
        model: a transformers causal LM.
        config: ``lora_rank`` (> 0), ``lora_alpha`` (None: ``2 * rank``) and
            ``lora_target_modules`` (module names, or ``("all-linear",)``: every linear layer
            but the output head).

    Returns:
        The peft model; only adapter parameters have ``requires_grad``. The adapter's random
        initialization (peft's Kaiming ``A``; ``B`` is zero) draws from a CPU generator seeded
        with ``config.seed``, not from the process's global RNG (which is left as it was): W
        ranks each build their adapter before FSDP2 shards it, and must all build the same one.
    """
    from peft import LoraConfig, get_peft_model

    targets: Any = list(config.lora_target_modules)
    if targets == ["all-linear"]:
        targets = "all-linear"
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha if config.lora_alpha is not None else 2 * config.lora_rank,
        target_modules=targets,
        lora_dropout=0.0,
        bias="none",
    )
    # peft builds and initializes each adapter on the CPU, then moves it to its layer's device.
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(config.seed)
        # peft 0.21.2 reads transformers' deprecated ``is_gradient_checkpointing`` property,
        # which warns on transformers 5.24; the value it reads (False) is still right.
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                category=FutureWarning)
        return get_peft_model(model, lora, adapter_name=ADAPTER_NAME)


@torch.no_grad()
def merged_state_dict(
    peft_model: Any, state: dict[str, torch.Tensor] | None = None
) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The base model and its state dict with every adapter merged in, in the base layout.

    Args:
        peft_model: a model returned by :func:`apply_lora`.
        state: the tensors to merge instead of the live ones, keyed like the base model's own
            ``state_dict()`` (``...q_proj.base_layer.weight``, ``...q_proj.lora_A.default.weight``):
            a sharded trainer's full weights gathered on rank 0
            (:mod:`relaxtrio.train.distributed`). Only linear LoRA layers merge this way.

    Returns:
        ``(base_model, state_dict)``: the wrapped transformers model (for its config and
        ``save_pretrained``) and ``{base key: tensor}`` with LoRA layers replaced by
        ``W + delta`` and no ``lora_`` keys; untouched tensors are the live parameters
        (tied embeddings stay one tensor), or those of ``state``.

    Raises:
        TypeError: ``state`` is given and a LoRA layer is not linear (see
            :func:`require_linear_lora`).
    """
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    source = base.state_dict(keep_vars=False) if state is None else state
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER_NAME in module.lora_A:
            deltas[name] = (module.get_delta_weight(ADAPTER_NAME) if state is None
                            else _delta_weight(module, name, state))
    out: dict[str, torch.Tensor] = {}
    for key, value in source.items():
        if ".lora_" in key:
            continue
        if ".base_layer." in key:
            module_name, _, leaf = key.rpartition(".base_layer.")
            if leaf == "weight" and module_name in deltas:
                value = value + deltas[module_name].to(value.dtype)
            key = f"{module_name}.{leaf}"
        out[key] = value
    return base, out


def require_linear_lora(peft_model: Any) -> None:
    """Checks that every LoRA layer is linear (what :func:`merged_state_dict` merges from
    gathered tensors).

    Raises:
        ConfigError: a targeted module is not a linear layer (``--lora-target-modules``).
    """
    from peft.tuners.lora import Linear, LoraLayer

    for name, module in peft_model.get_base_model().named_modules():
        if isinstance(module, LoraLayer) and not isinstance(module, Linear):
            raise ConfigError(f"--lora-target-modules: {name} is a {type(module).__name__}; the "
                              "sharded trainer merges LoRA into linear layers only",
                              param="lora_target_modules")


def _delta_weight(module: Any, name: str, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """``(alpha / r) * B @ A`` of one linear LoRA layer from gathered tensors, as peft computes it
    from the live ones (``Linear.get_delta_weight`` in float32)."""
    from peft.tuners.lora import Linear
    from peft.utils.other import transpose

    if not isinstance(module, Linear):  # require_linear_lora refused it when the trainer was built
        raise TypeError(f"LoRA layer {name} is a {type(module).__name__}, not linear")
    weight_a = state[f"{name}.lora_A.{ADAPTER_NAME}.weight"]  # (r, in)
    weight_b = state[f"{name}.lora_B.{ADAPTER_NAME}.weight"]  # (out, r)
    return transpose(weight_b @ weight_a, module.fan_in_fan_out) * module.scaling[ADAPTER_NAME]
