"""Append-only shared sequences: a long conversation's parts grow without being copied.

A Session's next request extends its previous conversation by a message or two; building its
message tuple, message JSON tuple and prefix hash states as fresh tuples copies about 2,000
references each at a thousand turns, and each copy (and the later release of the one it
replaces) touches every history object's reference count: cache misses that grew with the
history, the largest growing part of a request in a profile of a long Session. A :class:`SharedRun` is
instead the first ``n`` items of a list that only ever grows at its end (the scheme of
:class:`~relaxtrio.forest._ids.LineageIds`): extending the longest view of a list appends to
it, extending a shorter one (a branch) copies that view first, and no item a view shows ever
changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, Generic, Self, TypeVar, overload

__all__ = ["SharedRun", "grown"]

T = TypeVar("T")


class SharedRun(Sequence[T], Generic[T]):
    """``[n]`` items: a read-only view of the first ``n`` items of a shared, append-only list.

    Behaves as the tuple of its items: equal to an equal tuple (or view), slices are tuples.
    Build one with :meth:`of` and grow it with :meth:`extended`.

    Args:
        buffer: the shared list (never written below ``len(buffer)`` after this).
        length: ``n``, at most ``len(buffer)``.
    """

    __slots__ = ("_buffer", "_len")

    def __init__(self, buffer: list[T], length: int) -> None:
        if not 0 <= length <= len(buffer):
            raise ValueError(f"{type(self).__name__} length {length} is outside [0, {len(buffer)}]")
        self._buffer = buffer
        self._len = length

    @classmethod
    def of(cls, items: Iterable[T]) -> Self:
        """A view of a new list holding ``items``."""
        buffer = list(items)
        return cls(buffer, len(buffer))

    def extended(self, items: Sequence[T]) -> Self:
        """These items followed by ``items``: O(len(items)) when this is the list's longest
        view, else this view's items are copied into a new list first. No existing view
        changes; no items give this view itself."""
        if not items:
            return self
        buffer, n = self._buffer, self._len
        if len(buffer) != n:
            buffer = buffer[:n]
        buffer.extend(items)
        return type(self)(buffer, len(buffer))

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...
    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            return tuple(self._buffer[start:stop:step])
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(f"{type(self).__name__} index out of range")
        return self._buffer[index]

    def __iter__(self) -> Iterator[T]:
        return islice(self._buffer, self._len)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SharedRun):
            if other._buffer is self._buffer:
                return other._len == self._len
            return other._len == self._len and other._buffer[:other._len] == self._buffer[:self._len]
        if isinstance(other, tuple):
            return len(other) == self._len and tuple(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other: Any) -> tuple[T, ...]:
        if not isinstance(other, (tuple, SharedRun)):
            return NotImplemented
        return tuple(self) + tuple(other)

    def __radd__(self, other: Any) -> tuple[T, ...]:
        if not isinstance(other, tuple):
            return NotImplemented
        return other + tuple(self)

    def __repr__(self) -> str:
        return f"SharedRun({list(islice(self._buffer, min(self._len, 4)))!r}, len={self._len})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self).of, (list(self),))


def grown(items: Sequence[T], more: Sequence[T]) -> SharedRun[T]:
    """``items`` followed by ``more`` as a view: no copy of ``items`` when it is the longest
    view of its list (a tuple is copied once into a new list)."""
    run = items if isinstance(items, SharedRun) else SharedRun.of(items)
    return run.extended(more)
