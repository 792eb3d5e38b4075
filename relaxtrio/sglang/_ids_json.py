"""``/generate`` bodies whose ``input_ids`` text reuses the text of a recently sent prefix.

Turn ``n`` of a Session sends the ids of turn ``n - 1`` (its prompt and sampled ids) plus the new
observation; a 1,000-turn Session sends tens of thousands of ids per call, and encoding them as
JSON each time was a quarter of the engine client's work. :class:`IdsJsonEncoder` keeps the JSON
text of the most recently sent sequences and encodes only the ids after the longest one that is a
prefix of the new sequence. The result is byte for byte what ``json.dumps`` writes with
``separators=(",", ":")``.

Prompts built by the forest are :class:`~relaxtrio.forest.LineageIds`: for those the prefix is
recognized without looking at a single id (a remembered view of the same buffer is a prefix by
construction), so a turn costs the encoding of its new ids plus a copy of the text. Any other
sequence is compared id by id (at C speed) with the remembered ones.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from ..forest import LineageIds

__all__ = ["IdsJsonEncoder"]

_DEFAULT_ENTRIES: Final = 256  # sequences remembered without a key
_KEYED_ENTRIES: Final = 8  # sequences remembered per key (a Session's recent branches)
_DEFAULT_KEYS: Final = 4096  # keys remembered (about one per Session in flight)
# json.dumps with non-default arguments builds an encoder per call; these are shared (stateless).
_IDS: Final = json.JSONEncoder(separators=(",", ":"))
_FIELDS: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _ids_list_text(ids: Sequence[int]) -> bytes:
    """``ids`` as comma-separated decimal ASCII: orjson for a list or tuple of ints (the same
    text as :mod:`json`, several times faster), :mod:`json` for anything else."""
    try:
        return orjson.dumps(ids)[1:-1]
    except TypeError:  # not a list/tuple of machine-size ints (orjson.JSONEncodeError)
        return _IDS.encode(list(ids))[1:-1].encode("ascii")


class IdsJsonEncoder:
    """Encodes ``/generate`` bodies, reusing id text of recent sequences.

    Sequences are remembered per key (callers pass the Session id: a Session's next prompt
    extends one of its own recent ones, so only those few are compared); without a key they
    share one bucket of ``max_entries``, each compared in turn.

    Args:
        max_entries: sequences remembered without a key (least recently used ones are forgotten).
        keyed_entries: sequences remembered per key.
        max_keys: keys remembered (least recently used ones are forgotten with their sequences).
    """

    def __init__(self, max_entries: int = _DEFAULT_ENTRIES, *, keyed_entries: int = _KEYED_ENTRIES,
                 max_keys: int = _DEFAULT_KEYS) -> None:
        self._max_entries = max_entries
        self._keyed_entries = keyed_entries
        self._max_keys = max_keys
        # key -> entry number -> (ids, their JSON text without brackets, ASCII)
        self._buckets: OrderedDict[str | None, OrderedDict[int, tuple[Sequence[int], bytes]]] = OrderedDict()
        self._next = 0
        self.num_reused_ids = 0
        """Ids whose text came from a remembered prefix (for tests and benchmarks)."""

    def _bucket(self, key: str | None) -> OrderedDict[int, tuple[Sequence[int], bytes]]:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = OrderedDict()
            while len(self._buckets) > self._max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket

    def ids_text(self, input_ids: Sequence[int], key: str | None = None) -> str:
        """``json.dumps(list(input_ids), separators=(",", ":"))`` without the brackets.

        Args:
            input_ids: the ids.
            key: the sequence's family (a Session id), or None.
        """
        return self._ids_bytes(input_ids, key).decode("ascii")

    def _ids_bytes(self, input_ids: Sequence[int], key: str | None) -> bytes:
        """:meth:`ids_text` as ASCII bytes.

        A :class:`~relaxtrio.forest.LineageIds` is checked against the remembered views of its
        own buffer only (O(1) each: they are its prefixes by construction), so neither the ids
        nor their text are walked; any other sequence is compared with each remembered one.
        """
        entries = self._bucket(key)
        best_key, best_n, best_text = None, 0, b""
        ids: Sequence[int]
        if isinstance(input_ids, LineageIds):
            ids = input_ids
            for entry, (seq, text) in reversed(entries.items()):
                n = len(seq)
                if best_n < n and isinstance(seq, LineageIds) and ids.extends(seq):
                    best_key, best_n, best_text = entry, n, text
        else:
            ids = tuple(input_ids)
            for entry, (seq, text) in reversed(entries.items()):
                n = len(seq)
                if best_n < n <= len(ids) and ids[n - 1] == seq[-1] and ids[:n] == seq:
                    best_key, best_n, best_text = entry, n, text
        if best_n < len(ids):
            tail = _ids_list_text(ids[best_n:])
            text = b"".join((best_text, b",", tail)) if best_text else tail  # one copy
        else:
            text = best_text
        if best_key is not None:
            self.num_reused_ids += best_n
            if best_n == len(ids):
                entries.move_to_end(best_key)
                return text
            del entries[best_key]  # the longer sequence covers it
        if ids:
            entries[self._next] = (ids, text)
            self._next += 1
            limit = self._max_entries if key is None else self._keyed_entries
            while len(entries) > limit:
                entries.popitem(last=False)
        return text

    def body(self, input_ids: Sequence[int], fields: Mapping[str, Any], key: str | None = None) -> bytes:
        """The UTF-8 JSON body ``{"input_ids": [...], **fields}`` (``input_ids`` first).

        Args:
            input_ids: the prompt ids.
            fields: every other key of the body (JSON values; must not hold ``input_ids``).
            key: see :meth:`ids_text`.
        """
        try:  # orjson: the same JSON values as json (a float may be spelled differently)
            rest = orjson.dumps(fields if type(fields) is dict else dict(fields))
        except TypeError:  # a type orjson does not write (orjson.JSONEncodeError)
            rest = _FIELDS.encode(dict(fields)).encode()
        joiner = b"," if len(rest) > 2 else b""
        return b"".join((b'{"input_ids":[', self._ids_bytes(input_ids, key), b"]", joiner, rest[1:]))
