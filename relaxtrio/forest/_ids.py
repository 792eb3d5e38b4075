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
hash, slices are tuples, ``+`` gives the concatenated ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, overload

__all__ = ["LineageIds"]


class LineageIds(Sequence[int]):
    """``[n]`` token ids: a read-only view of the first ``n`` ids of a shared, append-only list.

    Build one with :meth:`of` and grow it with :meth:`extended`; the ids a view shows never
    change (the list is only appended to, and only past every view's end, see
    :meth:`extended`).

    Args:
        buffer: the shared list (never written below ``len(buffer)`` after this).
        length: ``n``, at most ``len(buffer)``.
    """

    __slots__ = ("_buffer", "_len")

    def __init__(self, buffer: list[int], length: int) -> None:
        if not 0 <= length <= len(buffer):
            raise ValueError(f"LineageIds length {length} is outside [0, {len(buffer)}]")
        self._buffer = buffer
        self._len = length

    @classmethod
    def of(cls, ids: Iterable[int]) -> LineageIds:
        """A view of a new buffer holding ``ids``."""
        buffer = list(ids)
        return cls(buffer, len(buffer))

    def extended(self, ids: Iterable[int]) -> LineageIds:
        """These ids followed by ``ids``: O(len(ids)) when this is the buffer's longest view.

        Otherwise (a branch: a longer view of this buffer exists) this view's ids are copied into
        a new buffer first. Neither case changes an id any existing view shows; no new ids give
        this view itself.
        """
        new = ids if type(ids) is tuple or type(ids) is list else tuple(ids)
        if not new:
            return self
        buffer, n = self._buffer, self._len
        if len(buffer) != n:
            buffer = buffer[:n]
        buffer.extend(new)
        return LineageIds(buffer, len(buffer))

    def extends(self, other: LineageIds) -> bool:
        """True when ``other``'s ids are known to start these ids, in O(1): both are views of
        one buffer and ``other`` is no longer. False says nothing (compare them to know)."""
        return other._buffer is self._buffer and other._len <= self._len

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...
    def __getitem__(self, index: int | slice) -> int | tuple[int, ...]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            return tuple(self._buffer[start:stop:step])
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("LineageIds index out of range")
        return self._buffer[index]

    def __iter__(self) -> Iterator[int]:
        return islice(self._buffer, self._len)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LineageIds):
            if other._buffer is self._buffer:
                return other._len == self._len
            return other._len == self._len and other._buffer[:other._len] == self._buffer[:self._len]
        if isinstance(other, tuple):
            return len(other) == self._len and tuple(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other: Any) -> LineageIds:
        if not isinstance(other, (tuple, LineageIds)):
            return NotImplemented
        return self.extended(other)

    def __radd__(self, other: Any) -> tuple[int, ...]:
        if not isinstance(other, tuple):
            return NotImplemented
        return other + tuple(self)

    def __repr__(self) -> str:
        shown = ", ".join(map(str, islice(self._buffer, min(self._len, 8))))
        more = ", ..." if self._len > 8 else ""
        return f"LineageIds([{shown}{more}], len={self._len})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (LineageIds.of, (list(self),))

