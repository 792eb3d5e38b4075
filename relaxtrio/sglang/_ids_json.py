"""``/generate`` bodies whose ``input_ids`` text reuses the text of a recently sent prefix.

Turn ``n`` of a Session sends the ids of turn ``n - 1`` (its prompt and sampled ids) plus the new
observation; a 1,000-turn Session sends tens of thousands of ids per call, and encoding them as
JSON each time was a quarter of the engine client's work. :class:`IdsJsonEncoder` keeps the JSON
text of the most recently sent sequences and encodes only the ids after the longest one that is a
prefix of the new sequence. The result is byte for byte what ``json.dumps`` writes with
``separators=(",", ":")``.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = ["IdsJsonEncoder"]

_DEFAULT_ENTRIES: Final = 256  # sequences remembered (about one per Session in flight)


class IdsJsonEncoder:
    """Encodes ``/generate`` bodies, reusing id text of recent sequences.

    Args:
        max_entries: sequences remembered (least recently used ones are forgotten).
    """

    def __init__(self, max_entries: int = _DEFAULT_ENTRIES) -> None:
        self._max_entries = max_entries
        self._entries: OrderedDict[int, tuple[tuple[int, ...], str]] = OrderedDict()
        self._next = 0
        self.num_reused_ids = 0
        """Ids whose text came from a remembered prefix (for tests and benchmarks)."""

    def ids_text(self, input_ids: Sequence[int]) -> str:
        """``json.dumps(list(input_ids), separators=(",", ":"))`` without the brackets."""
        ids = tuple(input_ids)
        best_key, best_n, best_text = None, 0, ""
        for key, (seq, text) in reversed(self._entries.items()):
            n = len(seq)
            if best_n < n <= len(ids) and ids[n - 1] == seq[-1] and ids[:n] == seq:
                best_key, best_n, best_text = key, n, text
        rest = ids[best_n:]
        if rest:
            tail = json.dumps(rest, separators=(",", ":"))[1:-1]
            text = f"{best_text},{tail}" if best_text else tail
        else:
            text = best_text
        if best_key is not None:
            self.num_reused_ids += best_n
            if best_n == len(ids):
                self._entries.move_to_end(best_key)
                return text
            del self._entries[best_key]  # the longer sequence covers it
        if ids:
            self._entries[self._next] = (ids, text)
            self._next += 1
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        return text

    def body(self, input_ids: Sequence[int], fields: Mapping[str, Any]) -> bytes:
        """The UTF-8 JSON body ``{"input_ids": [...], **fields}`` (``input_ids`` first).

        Args:
            input_ids: the prompt ids.
            fields: every other key of the body (JSON values; must not hold ``input_ids``).
        """
        rest = json.dumps(dict(fields), separators=(",", ":"), ensure_ascii=False)
        joiner = "," if len(rest) > 2 else ""
        return f'{{"input_ids":[{self.ids_text(input_ids)}]{joiner}{rest[1:]}'.encode()
