"""Loading new weights into a running model from a checkpoint directory (synchronous).

Used by ``/update_weights_from_disk``. The directory must hold ``model.safetensors`` or a sharded
``model.safetensors.index.json`` with the same parameter names and shapes as the running model
(what ``save_pretrained`` writes); or the path is the ``manifest.json`` of a shared-memory
mailbox (:mod:`relaxtrio.shm_weights`), whose tensors are copied straight from memory.
Everything is checked before the first parameter is overwritten, so a bad checkpoint leaves the
running weights untouched.

Some architectures are saved under other tensor names than their modules use: transformers 5
writes Qwen2-VL as ``model.embed_tokens...`` / ``visual...`` while the loaded model names them
``model.language_model.embed_tokens...`` / ``model.visual...``. When a checkpoint's names are not
the model's own, they are mapped with the model's transformers key-renaming rules (renamings
only; a checkpoint that needs tensor conversions is refused).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file

from ..shm_weights import is_shm_manifest, read_shm_weights

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["WeightLoadError", "load_weights_from_disk"]


class WeightLoadError(Exception):
    """The checkpoint cannot be loaded into the running model; the message says why."""


def _read_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    if is_shm_manifest(path):  # the trainer's shared-memory mailbox: views, no disk read
        return read_shm_weights(path)
    if not path.is_dir():
        raise WeightLoadError(f"Model path {str(path)!r} is not a directory.")
    single = path / "model.safetensors"
    if single.is_file():
        return load_file(single, device="cpu")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        tensors: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(load_file(path / shard, device="cpu"))
        return tensors
    raise WeightLoadError(
        f"No model.safetensors or model.safetensors.index.json in {str(path)!r}."
    )


def _model_names(model: PreTrainedModel, tensors: dict[str, torch.Tensor], state: dict) -> dict[str, torch.Tensor]:
    """``tensors`` under the model's own parameter names (unchanged when they already match)."""
    if set(tensors) <= set(state):
        return tensors
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, rename_source_key

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if not isinstance(t, WeightRenaming)]
    prefix = getattr(model, "base_model_prefix", None)
    renamed: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        name, converter = rename_source_key(
            key, renamings, converters, base_model_prefix=prefix, meta_state_dict=state
        )
        if converter is not None:
            raise WeightLoadError(f"Checkpoint tensor {key} needs a conversion the engine does not perform.")
        renamed[name] = tensor
    return renamed


def load_weights_from_disk(model: PreTrainedModel, model_path: str | Path) -> int:
    """Copy a checkpoint's tensors into ``model`` in place.

    Args:
        model: the running model; its parameter names are the contract.
        model_path: checkpoint directory.

    Returns:
        Number of tensors copied.

    Raises:
        WeightLoadError: missing directory / file, unknown or missing names, or shape mismatch.
    """
    try:
        tensors = _read_checkpoint(Path(model_path))
    except WeightLoadError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise WeightLoadError(f"Failed to read checkpoint {str(model_path)!r}: {exc}") from exc
    state = model.state_dict()
    tensors = _model_names(model, tensors, state)
    unexpected = sorted(set(tensors) - set(state))
    if unexpected:
        raise WeightLoadError(f"Checkpoint has unknown tensors: {', '.join(unexpected[:5])}.")
    # A missing name is fine only when it shares storage with a provided one (tied embeddings).
    provided_ptrs = {state[name].data_ptr() for name in tensors}
    missing = sorted(n for n in set(state) - set(tensors) if state[n].data_ptr() not in provided_ptrs)
    if missing:
        raise WeightLoadError(f"Checkpoint lacks tensors: {', '.join(missing[:5])}.")
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise WeightLoadError(
                f"Shape mismatch for {name}: checkpoint {tuple(tensor.shape)}, "
                f"model {tuple(state[name].shape)}."
            )
    with torch.no_grad():
        for name, tensor in tensors.items():
            state[name].copy_(tensor)
    return len(tensors)
