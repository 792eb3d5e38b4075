"""The batched decode core of the embedded engine: one KV cache shared by all running rows.

Synchronous torch code; the scheduler calls it from a worker thread, one call at a time.

Continuous batching without a paged KV pool (transformers 5.24 ``DynamicCache``):

- a new request is **prefilled alone** with its own cache, so its keys/values are computed at
  positions ``0 .. P - 1`` without any padding; a prefix found in the prefix cache
  (:mod:`relaxtrio.engine._prefix_cache`) seeds that cache, and only the ids after it run;
- it then **joins the batch**: every layer's keys/values are left-padded along the sequence axis
  to a common length and concatenated along the batch axis into a fresh cache, and a ``(B, L)``
  attention mask marks the pads with 0;
- a **decode step** feeds each row's last sampled token, ``attention_mask = [mask, 1]`` and
  ``position_ids = mask.sum(1) - 1``, so every row sees exactly its own tokens at their own
  positions (max |logprob diff| against an unpadded forward about 1e-5 in fp32);
- finished rows are removed by index selection, and leading columns that are padding in every
  remaining row are trimmed;
- a request with images (vision-language models) is prefilled with its pixels and multimodal
  RoPE positions (:mod:`relaxtrio.engine._vision_inputs`); its text positions are then
  ``index + offset`` with a per-row ``offset <= 0``, so the decode step adds each row's offset
  (0 for text rows and text-only models).

Invariant: the cache of a row holds all its tokens except the last sampled one, which the next
decode step feeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

import torch
from transformers import DynamicCache

from ._prefix_cache import CachedPrefix
from ._vision_inputs import EngineMedia, prefill_inputs

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["DecodeBatch"]

RowT = TypeVar("RowT")


def _pad_left(t: torch.Tensor, pad: int) -> torch.Tensor:
    """Left-pad the sequence axis (-2) of a ``(B, H, L, D)`` tensor with zeros."""
    if pad == 0:
        return t
    zeros = t.new_zeros((*t.shape[:-2], pad, t.shape[-1]))
    return torch.cat([zeros, t], dim=-2)


class DecodeBatch(Generic[RowT]):
    """Running rows of one model plus their shared KV cache and attention mask.

    Rows are opaque objects (the scheduler's requests); their order is the batch order.

    Args:
        model: a causal LM in eval mode (e.g. ``LlamaForCausalLM``).
    """

    def __init__(self, model: PreTrainedModel):
        self.model = model
        self.rows: list[RowT] = []
        self._cache: DynamicCache | None = None
        self._mask: torch.Tensor | None = None  # (B, L) int64, 1 = real token
        self._offsets: torch.Tensor | None = None  # (B,) int64, text position - token index

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def num_cached_tokens(self) -> int:
        """Real (non-pad) tokens held in the cache over all rows."""
        return 0 if self._mask is None else int(self._mask.sum())

    @torch.inference_mode()
    def prefill(
        self,
        token_ids: Sequence[int],
        media: EngineMedia | None = None,
        prefix: CachedPrefix | None = None,
    ) -> tuple[DynamicCache, torch.Tensor, int]:
        """Run one sequence alone and return its cache, its next-token logits and position offset.

        Args:
            token_ids: the full sequence (image placeholders expanded), length P >= 1.
            media: the request's images, or None.
            prefix: keys/values of ``token_ids[:prefix.length]`` from the prefix cache (text
                requests only); only the ids after it are computed.

        Returns:
            ``(cache, logits, offset)``: a cache holding P positions, ``(V,)`` logits for
            position P, and the row's text position offset (0 without images).
        """
        cache = DynamicCache(config=self.model.config)
        start = 0
        if prefix is not None and media is None:
            for layer, (keys, values) in enumerate(zip(prefix.keys, prefix.values, strict=True)):
                cache.update(keys, values, layer)  # (1, H_kv, length, D)
            start = prefix.length
        ids = torch.tensor([list(token_ids[start:])], dtype=torch.long)  # (1, P - start)
        extra, offset = ({}, 0) if media is None else prefill_inputs(self.model, ids, media)
        out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1, **extra)
        return cache, out.logits[0, -1], offset  # (V,)

    def row_cache(self, row: RowT) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of one row's keys and values: per layer ``(1, H_kv, n, D)``, n = its tokens."""
        assert self._cache is not None and self._mask is not None
        index = next(i for i, r in enumerate(self.rows) if r is row)
        n = int(self._mask[index].sum())  # a row's tokens are the last n columns (left padding)
        layers = self._cache.layers
        keys = [layer.keys[index : index + 1, :, -n:, :].clone() for layer in layers]
        values = [layer.values[index : index + 1, :, -n:, :].clone() for layer in layers]
        return keys, values

    @torch.inference_mode()
    def add(self, joins: Sequence[tuple[RowT, DynamicCache, int]]) -> None:
        """Append prefilled rows ``(row, cache, position offset)`` to the batch (one merged cache)."""
        if not joins:
            return
        parts: list[tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]] = []
        offsets = [] if self._offsets is None else [self._offsets]
        offsets.append(torch.tensor([offset for _, _, offset in joins], dtype=torch.long))
        if self._cache is not None and self._mask is not None:
            layers = self._cache.layers
            parts.append(([l.keys for l in layers], [l.values for l in layers], self._mask))
        for _, cache, _ in joins:
            length = cache.get_seq_length()
            layers = cache.layers
            mask = torch.ones((1, length), dtype=torch.long)
            parts.append(([l.keys for l in layers], [l.values for l in layers], mask))
        total = max(mask.shape[1] for _, _, mask in parts)
        merged = DynamicCache(config=self.model.config)
        num_layers = len(parts[0][0])
        for layer in range(num_layers):
            keys = torch.cat([_pad_left(k[layer], total - m.shape[1]) for k, _, m in parts])
            values = torch.cat([_pad_left(v[layer], total - m.shape[1]) for _, v, m in parts])
            merged.update(keys, values, layer)  # (B, H_kv, total, D)
        masks = [torch.nn.functional.pad(m, (total - m.shape[1], 0)) for _, _, m in parts]
        self._cache = merged
        self._mask = torch.cat(masks)  # (B, total)
        self._offsets = torch.cat(offsets)  # (B,)
        self.rows.extend(row for row, _, _ in joins)

    @torch.inference_mode()
    def remove(self, rows: Sequence[RowT]) -> None:
        """Drop rows (missing ones are ignored) and trim columns that are padding everywhere."""
        drop = {id(r) for r in rows}
        keep = [i for i, r in enumerate(self.rows) if id(r) not in drop]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        if not keep or self._cache is None or self._mask is None:
            self.clear()
            return
        index = torch.tensor(keep, dtype=torch.long)
        if self._offsets is not None:
            self._offsets = self._offsets.index_select(0, index)  # (B',)
        mask = self._mask.index_select(0, index)  # (B', L)
        lead = int((mask.sum(0) == 0).long().cumprod(0).sum())  # all-pad leading columns
        self._mask = mask[:, lead:]
        for layer in self._cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, lead:, :]
            layer.values = layer.values.index_select(0, index)[:, :, lead:, :]

    def clear(self) -> None:
        """Forget every row and the cache."""
        self.rows = []
        self._cache = None
        self._mask = None
        self._offsets = None

    @torch.inference_mode()
    def step(self, last_token_ids: Sequence[int]) -> torch.Tensor:
        """Feed one token per row and return the next-token logits.

        Args:
            last_token_ids: length B, each row's last sampled token (not yet in the cache).

        Returns:
            ``(B, V)`` logits.
        """
        assert self._cache is not None and self._mask is not None and self._offsets is not None
        ids = torch.tensor(list(last_token_ids), dtype=torch.long).unsqueeze(1)  # (B, 1)
        mask = torch.cat([self._mask, self._mask.new_ones((len(self.rows), 1))], dim=1)  # (B, L+1)
        positions = mask.sum(1, keepdim=True) - 1 + self._offsets.unsqueeze(1)  # (B, 1)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            cache=self._cache,
            use_cache=True,
        )
        self._mask = mask
        return out.logits[:, -1, :]  # (B, V)
