"""Parse only what is new in a request body that repeats the Session's previous one.

Every request of a Session carries its whole history (``messages``, or ``input`` for Responses),
and clients serialize it the same way each time, so the bytes of turn ``n``'s body start with
the bytes of turn ``n - 1``'s up to somewhere in that array (usually its last element). Parsing
the whole body with :func:`json.loads` costs about a microsecond per message at C speed; at two
thousand messages that alone is more than the rest of a request. :class:`BodyMemo` keeps the
previous body's bytes, its members before the array and the array's elements with the byte
offset where each ends; for the next body it finds the longest run of leading elements whose
bytes are unchanged (``bytes.startswith`` of a view of the previous body: one ``memcmp``, no
copy, and nothing decoded), takes those elements as they are (the very objects of the previous
parse) and decodes only the bytes after them, with :mod:`json`'s own scanner.

The result is exactly ``json.loads(raw, parse_constant=...)``: equal bytes decode to equal
values (an element ends with an ASCII character, so the repeated bytes end on a character
boundary and decoding the rest alone gives the same text), the remaining members are decoded in
order (a repeated key keeps its first position and its last value, as :func:`json.loads` does),
and anything irregular (a body that is not a UTF-8 JSON object, a repeated history key, any
decoding error) is parsed by :func:`json.loads` itself, so its errors are the same too. Reused
objects are shared between consecutive bodies: the request parsers never mutate a body.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Callable
from typing import Any, Final, cast

import attrs

__all__ = ["BodyMemo"]

HISTORY_KEYS: Final = frozenset({"messages", "input"})
"""Top-level keys whose array value is the repeated history."""

_WS: Final = re.compile(r"[ \t\n\r]*")  # JSON whitespace, as json.decoder skips it
# ``_WS`` matches the empty string, so its ``match`` never returns None.
_ws_match: Final = cast("Callable[..., re.Match[str]]", _WS.match)
# The decoder's string scanner; typeshed does not list it (it is json.decoder's own name).
_scanstring: Final[Callable[[str, int, bool], tuple[str, int]]] = json.decoder.scanstring  # type: ignore[attr-defined]
_NUM_REMEMBERED: Final = 2  # bodies remembered per Session
_COLD_ELEMENTS: Final = 64  # fresh elements that always count as a warm request
_MAX_SKIP: Final = 32  # most requests parsed by json.loads alone after cold ones
_WS_CHARS: Final = " \t\n\r"  # (``"" in _WS_CHARS`` too: the regex then finds the end)


class _Irregular(Exception):
    """The text is not a body this parser handles; :func:`json.loads` decides."""


@attrs.define(eq=False)
class _Remembered:
    """One earlier body: its bytes, members before the history array, and the array.

    Offsets are byte offsets into ``raw``."""

    raw: bytes
    head: list[tuple[str, Any]]  # members before the history key, in order
    key: str  # the history key
    open: int  # offset just after the array's "["
    elements: list[Any]
    ends: array[int]  # offset just after each element (machine ints: sliced without increfs)

    def resume_point(self, raw: bytes) -> int | None:
        """How many leading elements ``raw`` repeats byte for byte (with everything before
        them), or None when it does not even repeat the bytes before the array."""
        prev, ends = memoryview(self.raw), self.ends  # startswith a view: memcmp, no copy
        if not raw.startswith(prev[:self.open]):
            return None
        if ends and raw.startswith(prev[:ends[-1]]):
            return len(ends)
        lo, hi = 0, len(ends)  # ends[:lo] repeated; ends[hi - 1] (if any) not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if raw.startswith(prev[:ends[mid - 1]]):
                lo = mid
            else:
                hi = mid
        return lo


class BodyMemo:
    """The previous bodies of one Session, for :meth:`loads`. Not thread-safe (trio thread only).

    Two bodies are remembered, so a harness that interleaves two conversations in one Session
    (a title request between turns) resumes each from its own. Decoding the array element by
    element costs more than :func:`json.loads` of the same text (a Python step per element), so
    after two requests in a row that repeated little of any remembered body, the next ones are
    parsed by :func:`json.loads` alone (1, 2, 4, ... up to 32 of them) before trying again.

    Args:
        parse_constant: as :func:`json.loads`' (called for ``NaN``, ``Infinity``, ``-Infinity``).
    """

    def __init__(self, parse_constant: Callable[[str], Any]) -> None:
        self._parse_constant = parse_constant
        # (set by JSONDecoder's constructor; typeshed does not list it)
        self._scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder(
            parse_constant=parse_constant).scan_once  # type: ignore[attr-defined]
        self._remembered: list[_Remembered] = []  # the most recent first
        self._cold_streak = 0  # requests in a row that repeated little
        self._skip = 0  # requests left to parse with json.loads alone
        self.num_reused = 0
        """Array elements taken from a remembered body so far (for tests and benchmarks)."""

    def loads(self, raw: bytes) -> Any:
        """``json.loads(raw, parse_constant=...)``, decoding only the new part of ``raw``.

        Raises:
            ValueError: as :func:`json.loads` (syntax, encoding, a rejected constant).
            RecursionError: nested too deeply, as :func:`json.loads`.
        """
        if self._skip:
            self._skip -= 1
        elif type(raw) is bytes:  # (immutable: remembered as it is)
            try:
                if raw[:1] == b"{" and json.detect_encoding(raw) == "utf-8":
                    # what json.loads decodes bytes with (decoded here as utf-8/surrogatepass)
                    return self._parse(raw)
            except (_Irregular, ValueError, RecursionError, StopIteration):
                pass
        return json.loads(raw, parse_constant=self._parse_constant)

    def _parse(self, raw: bytes) -> dict[str, Any]:
        scan = self._scan
        base, resume = None, None
        for remembered in self._remembered:
            point = remembered.resume_point(raw)
            if point is not None and (resume is None or point > resume):
                base, resume = remembered, point
        if base is None or resume is None:
            start = 0  # byte offset in ``raw`` of ``text[0]``
            text = raw.decode("utf-8", "surrogatepass")
            head, key, open_ = _read_head(text, scan)
            elements: list[Any] = []
            ends = array("q")
            pos = _ws_match(text, open_).end()
            closed = text[pos:pos + 1] == "]"
        else:
            head, key, open_ = base.head, base.key, base.open
            elements, ends = base.elements[:resume], base.ends[:resume]
            start = ends[-1] if ends else open_
            # Only the bytes after the repeated ones are decoded (they start on a character
            # boundary: an element, like "[", ends with an ASCII character).
            text = raw[start:].decode("utf-8", "surrogatepass")
            pos = _ws_match(text).end()
            closed = text[pos:pos + 1] == "]"
            if ends and not closed:  # after a reused element: "]" or "," and an element
                if text[pos:pos + 1] != ",":
                    raise _Irregular  # e.g. a number element that goes on
                pos = _ws_match(text, pos + 1).end()
        new_ends: list[int] = []  # offsets in ``text`` just after each new element
        if not closed:
            pos = _read_elements(text, pos, scan, elements, new_ends)
        idx, more = _after_value(text, pos + 1)
        tail: list[tuple[str, Any]] = []
        while more:
            name, idx = _member_name(text, idx)
            if name == key:
                raise _Irregular  # a repeated history key: json.loads' semantics decide
            value, idx = scan(text, idx)
            tail.append((name, value))
            idx, more = _after_value(text, idx)
        if _ws_match(text, idx).end() != len(text) or any(name == key for name, _ in head):
            raise _Irregular  # extra data, or a repeated history key
        body = dict(head)
        body[key] = elements
        body.update(tail)
        if base is None:
            open_, *byte_ends = _byte_offsets(text, 0, [open_, *new_ends])
        else:
            byte_ends = _byte_offsets(text, start, new_ends)
        ends.extend(byte_ends)
        self._remember(_Remembered(raw, head, key, open_, elements, ends), base, resume or 0)
        return body

    def _remember(self, parsed: _Remembered, base: _Remembered | None, reused: int) -> None:
        """Keeps ``parsed`` (first) for the next bodies; ``reused`` of its elements came from
        ``base``. Bodies that mostly repeat nothing make the memo skip the next ones."""
        self.num_reused += reused
        if base is not None and 2 * reused >= len(base.ends):
            self._remembered.remove(base)  # the new body supersedes the one it mostly repeats
        self._remembered = [parsed, *self._remembered][:_NUM_REMEMBERED]
        if len(parsed.elements) - reused > max(reused, _COLD_ELEMENTS):
            self._cold_streak += 1
            if self._cold_streak >= 2:
                self._skip = min(2 ** (self._cold_streak - 2), _MAX_SKIP)
        else:
            self._cold_streak = 0


_Scan = Callable[[str, int], tuple[Any, int]]
"""``json.JSONDecoder.scan_once``: the value at an offset and the offset after it."""


def _read_head(text: str, scan: _Scan) -> tuple[list[tuple[str, Any]], str, int]:
    """The members of a body object before its history array: ``(head, history key, offset in
    text just after the array's "[")``.

    Raises:
        _Irregular: an empty object, or no history array.
    """
    head: list[tuple[str, Any]] = []
    idx = _ws_match(text, 1).end()
    if text[idx:idx + 1] == "}":
        raise _Irregular  # {}: nothing to remember
    while True:  # the members up to the history array
        name, idx = _member_name(text, idx)
        if name in HISTORY_KEYS and text[idx:idx + 1] == "[":
            return head, name, idx + 1
        value, idx = scan(text, idx)
        head.append((name, value))
        idx, more = _after_value(text, idx)
        if not more:
            raise _Irregular  # no history array: one plain parse


def _read_elements(text: str, pos: int, scan: _Scan, elements: list[Any], ends: list[int]) -> int:
    """Scans array elements from ``pos`` (at an element) up to the closing "]"; appends each to
    ``elements`` and the offset just after it to ``ends``; returns the offset of the "]".

    Raises:
        _Irregular: something other than "," or "]" after an element.
    """
    ws = _ws_match
    while True:  # one element per step; whitespace is rare and skipped by regex
        value, pos = scan(text, pos)
        elements.append(value)
        ends.append(pos)
        char = text[pos:pos + 1]
        if char in _WS_CHARS:
            pos = ws(text, pos).end()
            char = text[pos:pos + 1]
        if char == ",":
            pos += 1
            if text[pos:pos + 1] in _WS_CHARS:
                pos = ws(text, pos).end()
        elif char == "]":
            return pos
        else:
            raise _Irregular


def _byte_offsets(text: str, start: int, offsets: list[int]) -> list[int]:
    """The byte offsets of ascending character offsets ``offsets`` into ``text``, whose first
    character is at byte ``start`` of a UTF-8 (``surrogatepass``) encoding; O(len(text))."""
    if text.isascii():  # O(1) for str; one byte per character
        return [start + offset for offset in offsets]
    out = []
    done = 0
    for offset in offsets:
        start += len(text[done:offset].encode("utf-8", "surrogatepass"))
        done = offset
        out.append(start)
    return out


def _member_name(text: str, idx: int) -> tuple[str, int]:
    """A member's name at ``idx`` and the offset of its value (after ``:`` and whitespace)."""
    if text[idx:idx + 1] != '"':
        raise _Irregular
    name, idx = _scanstring(text, idx + 1, True)
    idx = _ws_match(text, idx).end()
    if text[idx:idx + 1] != ":":
        raise _Irregular
    return name, _ws_match(text, idx + 1).end()


def _after_value(text: str, idx: int) -> tuple[int, bool]:
    """After a member's value: ``(next member's offset, True)`` after a ``,``, or
    ``(offset just past the closing brace, False)``."""
    idx = _ws_match(text, idx).end()
    char = text[idx:idx + 1]
    if char == ",":
        return _ws_match(text, idx + 1).end(), True
    if char == "}":
        return idx + 1, False
    raise _Irregular
