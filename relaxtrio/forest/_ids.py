"""Lineage token ids that share one append-only buffer along a branch.

A Session's turn ``n`` generates from the rollout ids of its whole lineage: the ids of turn
``n - 1``'s prompt, its sampled ids and the new observation's. Building that as a fresh tuple
every turn copies the history (tens of thousands of ids at a thousand turns), and whoever then
needs to know that the new prompt extends the previous one (the engine client reuses the JSON
text of a prompt it sent before) compares them id by id. A :class:`LineageIds` is instead the
first ``len`` ids of a list that only ever grows at its end: extending the longest view of a
buffer appends to it (a branch off a shorter view copies that view's ids into a new buffer), so
a turn costs O(new ids), and two views of one buffer are prefixes of one another by construction
(:meth:`LineageIds.extends`), an O(1) check.

A view behaves as the tuple of its ids: equal to an equal tuple (and to an equal view), the same
hash, slices are tuples, ``+`` gives the concatenated ids. It is the token-id case of
:class:`~relaxtrio.forest._shared.SharedRun`, with the O(1) prefix check.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import Any

from ._shared import SharedRun

__all__ = ["LineageIds"]


class LineageIds(SharedRun[int]):
    """``[n]`` token ids: a read-only view of the first ``n`` ids of a shared, append-only list.

    Build one with :meth:`of` and grow it with :meth:`extended`; the ids a view shows never
    change (the list is only appended to, and only past every view's end, see
    :meth:`extended`).

    Args:
        buffer: the shared list (never written below ``len(buffer)`` after this).
        length: ``n``, at most ``len(buffer)``.
    """

    __slots__ = ()

    def extended(self, ids: Iterable[int]) -> LineageIds:
        """These ids followed by ``ids``: O(len(ids)) when this is the buffer's longest view.

        Otherwise (a branch: a longer view of this buffer exists) this view's ids are copied into
        a new buffer first. Neither case changes an id any existing view shows; no new ids give
        this view itself.
        """
        return super().extended(ids if type(ids) is tuple or type(ids) is list else tuple(ids))

    def extends(self, other: LineageIds) -> bool:
        """True when ``other``'s ids are known to start these ids, in O(1): both are views of
        one buffer and ``other`` is no longer. False says nothing (compare them to know)."""
        return other._buffer is self._buffer and other._len <= self._len

    def __add__(self, other: Any) -> LineageIds:  # type: ignore[override]
        if not isinstance(other, (tuple, LineageIds)):
            return NotImplemented
        return self.extended(other)

    def __repr__(self) -> str:
        shown = ", ".join(map(str, islice(self._buffer, min(self._len, 8))))
        more = ", ..." if self._len > 8 else ""
        return f"LineageIds([{shown}{more}], len={self._len})"
