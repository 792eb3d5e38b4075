"""Parse only what is new in a request body that repeats the Session's previous one.

Every request of a Session carries its whole history (``messages``, or ``input`` for Responses),
and clients serialize it the same way each time, so the text of turn ``n``'s body starts with
the text of turn ``n - 1``'s up to somewhere in that array (usually its last element). Parsing
the whole body with :func:`json.loads` costs about a microsecond per message at C speed; at two
thousand messages that alone is more than the rest of a request. :class:`BodyMemo` keeps the
previous body's text, its members before the array and the array's elements with the offset
where each ends; for the next body it finds the longest run of leading elements whose text is
unchanged (string comparisons, run in C), takes those elements as they are (the very objects
of the previous parse) and decodes only the rest of the text with :mod:`json`'s own scanner.

The result is exactly ``json.loads(raw, parse_constant=...)``: equal text decodes to equal
values, the remaining members are decoded in order (a repeated key keeps its first position and
its last value, as :func:`json.loads` does), and anything irregular (a body that is not a UTF-8
JSON object, a repeated history key, any decoding error) is parsed by :func:`json.loads` itself,
so its errors are the same too. Reused objects are shared between consecutive bodies: the
request parsers never mutate a body.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from json.decoder import scanstring
from typing import Any, Final

__all__ = ["BodyMemo"]

HISTORY_KEYS: Final = frozenset({"messages", "input"})
"""Top-level keys whose array value is the repeated history."""

_WS: Final = re.compile(r"[ \t\n\r]*")  # JSON whitespace, as json.decoder skips it


class _Irregular(Exception):
    """The text is not a body this parser handles; :func:`json.loads` decides."""


class BodyMemo:
    """The previous body of one Session, for :meth:`loads`. Not thread-safe (trio thread only).

    Args:
        parse_constant: as :func:`json.loads`' (called for ``NaN``, ``Infinity``, ``-Infinity``).
    """

    def __init__(self, parse_constant: Callable[[str], Any]) -> None:
        self._parse_constant = parse_constant
        self._scan = json.JSONDecoder(parse_constant=parse_constant).scan_once
        self._text = ""  # the previous body's text ("" when it had no history array)
        self._head: list[tuple[str, Any]] = []  # its members before the history key
        self._key = ""  # the history key
        self._open = 0  # offset just after the array's "["
        self._elements: list[Any] = []
        self._ends: list[int] = []  # offset just after each element
        self.num_reused = 0
        """Array elements taken from the previous body so far (for tests and benchmarks)."""

    def loads(self, raw: bytes) -> Any:
        """``json.loads(raw, parse_constant=...)``, decoding only the new part of ``raw``.

        Raises:
            ValueError: as :func:`json.loads` (syntax, encoding, a rejected constant).
            RecursionError: nested too deeply, as :func:`json.loads`.
        """
        try:
            if raw[:1] != b"{" or json.detect_encoding(raw) != "utf-8":
                raise _Irregular
            text = raw.decode("utf-8", "surrogatepass")  # what json.loads decodes bytes with
            return self._parse(text)
        except (_Irregular, ValueError, RecursionError, StopIteration):
            self._text = ""
            return json.loads(raw, parse_constant=self._parse_constant)

    def _resume_point(self, text: str) -> int | None:
        """How many leading elements of the previous array ``text`` repeats verbatim (with
        everything before them), or None when it does not even repeat the text before the
        array."""
        prev, ends = self._text, self._ends
        if not prev or not text.startswith(prev[:self._open]):
            return None
        if ends and text.startswith(prev[:ends[-1]]):
            return len(ends)
        lo, hi = 0, len(ends)  # ends[:lo] repeated; ends[hi - 1] (if any) not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if text.startswith(prev[:ends[mid - 1]]):
                lo = mid
            else:
                hi = mid
        return lo

    def _parse(self, text: str) -> dict[str, Any]:
        scan = self._scan
        resume = self._resume_point(text)
        if resume is None:
            head: list[tuple[str, Any]] = []
            idx = _WS.match(text, 1).end()
            if text[idx:idx + 1] == "}":
                raise _Irregular  # {}: nothing to remember
            while True:  # the members up to the history array
                name, idx = _member_name(text, idx)
                if name in HISTORY_KEYS and text[idx:idx + 1] == "[":
                    key, open_ = name, idx + 1
                    break
                value, idx = scan(text, idx)
                head.append((name, value))
                idx, more = _after_value(text, idx)
                if not more:
                    raise _Irregular  # no history array: one plain parse
            elements: list[Any] = []
            ends: list[int] = []
            pos = _WS.match(text, open_).end()
        else:
            head, key, open_ = self._head, self._key, self._open
            elements, ends = self._elements[:resume], self._ends[:resume]
            pos = _WS.match(text, ends[-1] if ends else open_).end()
            if ends and text[pos:pos + 1] == ",":  # after a reused element: "," or "]"
                pos = _WS.match(text, pos + 1).end()
            elif ends and text[pos:pos + 1] != "]":
                raise _Irregular  # e.g. a number element that goes on
        closed = text[pos:pos + 1] == "]"
        while not closed:
            value, pos = scan(text, pos)
            elements.append(value)
            ends.append(pos)
            pos = _WS.match(text, pos).end()
            char = text[pos:pos + 1]
            if char == ",":
                pos = _WS.match(text, pos + 1).end()
            elif char == "]":
                closed = True
            else:
                raise _Irregular
        idx, more = _after_value(text, pos + 1)
        tail: list[tuple[str, Any]] = []
        while more:
            name, idx = _member_name(text, idx)
            if name == key:
                raise _Irregular  # a repeated history key: json.loads' semantics decide
            value, idx = scan(text, idx)
            tail.append((name, value))
            idx, more = _after_value(text, idx)
        if _WS.match(text, idx).end() != len(text) or any(name == key for name, _ in head):
            raise _Irregular  # extra data, or a repeated history key
        body = dict(head)
        body[key] = elements
        body.update(tail)
        if resume is not None:
            self.num_reused += resume
        self._text, self._head, self._key, self._open = text, head, key, open_
        self._elements, self._ends = elements, ends
        return body


def _member_name(text: str, idx: int) -> tuple[str, int]:
    """A member's name at ``idx`` and the offset of its value (after ``:`` and whitespace)."""
    if text[idx:idx + 1] != '"':
        raise _Irregular
    name, idx = scanstring(text, idx + 1, True)
    idx = _WS.match(text, idx).end()
    if text[idx:idx + 1] != ":":
        raise _Irregular
    return name, _WS.match(text, idx + 1).end()


def _after_value(text: str, idx: int) -> tuple[int, bool]:
    """After a member's value: ``(next member's offset, True)`` after a ``,``, or
    ``(offset just past the closing brace, False)``."""
    idx = _WS.match(text, idx).end()
    char = text[idx:idx + 1]
    if char == ",":
        return _WS.match(text, idx + 1).end(), True
    if char == "}":
        return idx + 1, False
    raise _Irregular
