"""Model inputs of an image request in the embedded engine (torch; Qwen2-VL family).

A request with images is prefilled alone (like every request) with ``pixel_values``,
``image_grid_thw``, ``mm_token_type_ids`` (1 on image placeholders) and explicit multimodal RoPE
positions ``(3, 1, P)`` from the model's own ``get_rope_index``. Passing the positions keeps the
model's cached ``rope_deltas`` attribute out of the picture: that attribute is per model, not per
request, so it cannot serve a batch of rows with different images.

After the image the text positions no longer equal the token index: they are
``index + rope_delta`` (``rope_delta = max position + 1 - P <= 0``). The decode batch therefore
keeps one position offset per row (0 for text-only rows) and feeds ``(B, 1)`` text positions,
which Qwen2-VL broadcasts to its three RoPE sections.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["EngineMedia", "prefill_inputs"]


@attrs.frozen(eq=False)
class EngineMedia:
    """The processed images of one ``/generate`` request.

    Attributes:
        pixel_values: ``(num_patches, patch_dim) float32``.
        image_grid_thw: ``(num_images, 3) int64``.
    """

    pixel_values: np.ndarray
    image_grid_thw: np.ndarray


def prefill_inputs(
    model: PreTrainedModel, input_ids: torch.Tensor, media: EngineMedia
) -> tuple[dict[str, Any], int]:
    """Keyword inputs of a multimodal prefill, and the row's text position offset.

    Args:
        model: a Qwen2-VL-family model (``model.model.get_rope_index``, ``config.image_token_id``).
        input_ids: ``(1, P) long``, placeholders already expanded.
        media: the request's images.

    Returns:
        ``(kwargs, rope_delta)``: ``kwargs`` holds ``pixel_values``, ``image_grid_thw``,
        ``mm_token_type_ids`` ``(1, P)`` and ``position_ids`` ``(3, 1, P)``; ``rope_delta`` is the
        offset added to a token's index to get its text position after the prompt.

    Raises:
        RuntimeError: the model has no multimodal RoPE index function.
    """
    inner = getattr(model, "model", None)
    get_rope_index = getattr(inner, "get_rope_index", None)
    if get_rope_index is None:
        raise RuntimeError(f"{type(model).__name__} has no get_rope_index; only the Qwen2-VL family is supported")
    type_ids = (input_ids == int(model.config.image_token_id)).to(torch.int32)  # (1, P)
    grid = torch.tensor(media.image_grid_thw, dtype=torch.long)  # (n, 3)
    positions, deltas = get_rope_index(input_ids, mm_token_type_ids=type_ids, image_grid_thw=grid)  # (3, 1, P), (1, 1)
    kwargs = {
        "pixel_values": torch.tensor(media.pixel_values, dtype=torch.float32),  # (N, D)
        "image_grid_thw": grid,
        "mm_token_type_ids": type_ids,
        "position_ids": positions,
    }
    return kwargs, int(deltas.reshape(-1)[0])
