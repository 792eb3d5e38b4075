"""Multimodal training inputs: a batch's image payloads → model keyword tensors.

A sample of a vision-language model carries, besides its (processor-expanded) ``token_ids``, the
media payloads of its lineage's observations in ``multimodal_inputs`` (lineage order). Each
payload exposes ``train_inputs``: a mapping of model keyword names to arrays whose first axis
concatenates (``pixel_values (num_patches, patch_dim)``, ``image_grid_thw (num_images, 3)``).

For a micro-batch the payloads of all rows are concatenated key by key along axis 0, rows in
batch order and each row's payloads in lineage order, which is the order the model fills image
placeholders in (row-major over ``(B, T)``; docs/canonical-contract.md#images). The
model's own position logic (Qwen2-VL multimodal RoPE) then needs ``mm_token_type_ids``: 1 where
a token is the model's ``image_token_id``.

The trainer does not import the engine: payloads are duck-typed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["merge_multimodal_inputs", "multimodal_model_inputs"]


def merge_multimodal_inputs(payloads: Sequence[Any]) -> dict[str, np.ndarray]:
    """Concatenates the payloads' ``train_inputs`` key by key along axis 0.

    Args:
        payloads: objects with a ``train_inputs`` mapping, in order.

    Returns:
        ``{key: array}``; empty without payloads.

    Raises:
        ValueError: a payload without ``train_inputs``, or payloads with different keys.
    """
    merged: dict[str, list[np.ndarray]] = {}
    keys: set[str] | None = None
    for i, payload in enumerate(payloads):
        inputs = getattr(payload, "train_inputs", None)
        if not isinstance(inputs, Mapping):
            raise ValueError(f"multimodal payload {i} ({type(payload).__name__}) has no train_inputs mapping")
        if keys is not None and set(inputs) != keys:
            raise ValueError(f"multimodal payload {i} has keys {sorted(inputs)}, expected {sorted(keys)}")
        keys = set(inputs)
        for key, value in inputs.items():
            merged.setdefault(key, []).append(np.asarray(value))
    return {key: np.concatenate(values, axis=0) for key, values in merged.items()}


def multimodal_model_inputs(
    rows: Sequence[Any], token_ids: Tensor, *, image_token_id: int | None, device: torch.device | str
) -> dict[str, Tensor]:
    """Model keyword tensors for a micro-batch's images (empty when no row has any).

    Args:
        rows: the micro-batch's samples in batch order (``multimodal_inputs`` read if present).
        token_ids: ``(B, T) long``, the padded batch.
        image_token_id: the model's image placeholder id (``config.image_token_id``); None for a
            model without one.
        device: where the tensors go.

    Returns:
        ``pixel_values`` etc. (one tensor per payload key) plus ``mm_token_type_ids`` ``(B, T)
        int32`` when ``image_token_id`` is known.

    Raises:
        ValueError: a sample has images but the model has no ``image_token_id``, or broken payloads.
    """
    payloads = [p for row in rows for p in (getattr(row, "multimodal_inputs", None) or ())]
    if not payloads:
        return {}
    if image_token_id is None:
        raise ValueError("a sample has multimodal inputs but the model has no image_token_id (not a VLM)")
    out = {key: torch.tensor(value).to(device) for key, value in merge_multimodal_inputs(payloads).items()}
    out["mm_token_type_ids"] = (token_ids == image_token_id).to(torch.int32)  # (B, T)
    return out
