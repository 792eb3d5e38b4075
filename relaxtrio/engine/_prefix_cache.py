"""The embedded engine's prefix cache: keys/values of recent sequences, reused by later prefills.

A follow-up turn of a Session sends the previous turn's prompt + its sampled ids + the new
observation; the Group's other Sessions send the same first prompt. Both find their longest
common prefix here, and the prefill computes only the ids after it (at least one id is always
computed: its logits choose the first new token).

Entries are whole sequences with their per-layer keys and values (``(1, H_kv, n, D)`` each):

- at **prefill** the request's full input is stored (its cache tensors are fresh, so no copy);
- when a row **finishes** (or is aborted) its ``input + output[:-1]`` is stored (a copy out of
  the batch cache); entries that are a prefix of a new entry are dropped, since it covers them;
- least-recently-used entries are evicted beyond ``max_tokens`` cached tokens; ``max_tokens == 0``
  disables the cache;
- :meth:`PrefixCache.clear` runs on every weight update and ``/flush_cache``: keys and values
  computed with other weights must not be reused.

Requests with images are neither looked up nor stored (their ids do not determine their keys).
Synchronous; used only inside the scheduler's worker-thread call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import attrs
import torch

__all__ = ["CachedPrefix", "PrefixCache"]


@attrs.frozen(eq=False)
class CachedPrefix:
    """Reusable keys/values of the first ``length`` ids of a sequence.

    Attributes:
        length: ids covered, ``>= 1``.
        keys: per layer ``(1, H_kv, length, D)``.
        values: per layer ``(1, H_kv, length, D)``.
    """

    length: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


@attrs.define(eq=False)
class _Entry:
    ids: torch.Tensor  # (n,) int64
    keys: list[torch.Tensor]  # per layer (1, H_kv, n, D)
    values: list[torch.Tensor]


@attrs.define(eq=False)
class PrefixCache:
    """LRU cache of sequences' keys/values, bounded in cached tokens.

    Args:
        max_tokens: the most ids cached over all entries; 0 disables caching.

    Attributes:
        num_tokens: ids cached now.
        num_hit_tokens: prompt ids served from the cache so far (prefill saved).
        num_prefill_tokens: ids prefilled so far (computed plus served).
    """

    max_tokens: int
    num_tokens: int = 0
    num_hit_tokens: int = 0
    num_prefill_tokens: int = 0
    _entries: OrderedDict[int, _Entry] = attrs.field(factory=OrderedDict)
    _next_key: int = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, token_ids: Sequence[int]) -> CachedPrefix | None:
        """The longest cached prefix of ``token_ids``, leaving at least one id to compute.

        Also counts the prefill (:attr:`num_prefill_tokens`, :attr:`num_hit_tokens`).

        Args:
            token_ids: the sequence about to be prefilled, length P >= 1.

        Returns:
            The reusable prefix (``1 <= length <= P - 1``), or None.
        """
        self.num_prefill_tokens += len(token_ids)
        limit = len(token_ids) - 1
        if limit < 1 or not self._entries:
            return None
        query = torch.tensor(list(token_ids[:limit]), dtype=torch.long)  # (limit,) = all prompt ids but the last
        best_key, best_length = None, 0
        for key, entry in self._entries.items():
            n = min(limit, entry.ids.shape[0])
            if n <= best_length:
                continue
            differs = torch.nonzero(entry.ids[:n] != query[:n])
            length = n if differs.numel() == 0 else int(differs[0, 0])
            if length > best_length:
                best_key, best_length = key, length
        if best_key is None:
            return None
        entry = self._entries[best_key]
        self._entries.move_to_end(best_key)
        self.num_hit_tokens += best_length
        return CachedPrefix(
            best_length,
            [k[:, :, :best_length, :] for k in entry.keys],
            [v[:, :, :best_length, :] for v in entry.values],
        )

    def insert(self, token_ids: Sequence[int], keys: list[torch.Tensor],
               values: list[torch.Tensor]) -> None:
        """Store a sequence's keys/values (the tensors are kept, not copied: never mutate them).

        Args:
            token_ids: the n ids the tensors hold, n >= 1.
            keys: per layer ``(1, H_kv, n, D)``.
            values: per layer ``(1, H_kv, n, D)``.
        """
        n = len(token_ids)
        if self.max_tokens <= 0 or n == 0 or n > self.max_tokens:
            return
        ids = torch.tensor(list(token_ids), dtype=torch.long)  # (n,)
        for key, entry in list(self._entries.items()):
            m = entry.ids.shape[0]
            if m <= n and torch.equal(entry.ids, ids[:m]):  # covered by the new entry
                self._drop(key)
            elif m > n and torch.equal(entry.ids[:n], ids):  # the new one adds nothing
                self._entries.move_to_end(key)
                return
        self._entries[self._next_key] = _Entry(ids, keys, values)
        self._next_key += 1
        self.num_tokens += n
        while self.num_tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.num_tokens -= entry.ids.shape[0]

    def clear(self) -> None:
        """Forget every entry (weights changed, or ``/flush_cache``)."""
        self._entries.clear()
        self.num_tokens = 0
