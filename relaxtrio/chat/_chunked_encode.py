"""Tokenize a text as the ids of its space-separated chunks, each chunk tokenized once.

An observation's text is mostly words the tokenizer has seen before (the template's role
headers, the task's phrasing, the tool output's field names), yet the Rust tokenizer runs its
pre-tokenizer regex over every character of every new text (about 2 µs per token here, the
largest single cost of rendering an observation). For a byte-level BPE tokenizer the ids of a
text are the concatenated ids of its *chunks*, cut before every space (U+0020) whose preceding
character is not whitespace, so :class:`ChunkedEncoder` keeps the ids of recent chunks and
tokenizes only the chunks it has not seen.

Why the cut is exact, for the tokenizers it is used with (:func:`chunkable_backend`: no
normalizer, GPT-2's byte-level pre-tokenizer with its regex and no prefix space, BPE without
dropout, added tokens without whitespace or strip flags, no padding or truncation):

* added tokens are split off first; none contains a space, so none spans a cut, and the
  segments between them are the same in the chunks as in the whole text;
* every piece of the pre-tokenizer's regex (``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+|
  ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``) holds a space only as its first character, unless it
  is all whitespace; a space after a non-whitespace character therefore starts a piece. The
  pieces before it do not look past it (the only look-ahead follows whitespace), and the pieces
  from it on do not look behind it, so both sides split alone exactly as inside the whole text;
* byte-level mapping and BPE work piece by piece (BPE without dropout is deterministic).

Python's ``str.isspace`` is true for every character the regex's ``\\s`` matches (and a few
more, where a chunk is then simply not cut). ``tests/chat`` compares both encodings on
every bundled tokenizer, over random texts and every code point next to a space.

Chunks of novel text cost a little more than tokenizing them inline (one backend call each);
after :data:`_MAX_MISSES` unknown chunks in one text, the rest of it is tokenized in one call.
"""

from __future__ import annotations

import threading
from itertools import islice
from typing import Any, Final

from ._fast_render import plain_backend

__all__ = ["ChunkedEncoder", "chunkable_backend"]

_CACHE_SIZE: Final = 1 << 16  # chunks remembered (the oldest is dropped first)
_MAX_CHUNK_CHARS: Final = 64  # longer chunks are tokenized every time (not remembered)
_MAX_MISSES: Final = 32  # unknown chunks per text before the rest goes in one call


def chunkable_backend(tokenizer: Any) -> Any:
    """The Rust backend when its ids may be computed chunk by chunk (module docstring), else
    None. Checked once per tokenizer (its padding and truncation again on every call)."""
    backend = plain_backend(tokenizer)
    if backend is None:
        return None
    try:
        from tokenizers import models, pre_tokenizers
    except ImportError:  # pragma: no cover - transformers' fast tokenizers need it
        return None
    pre = backend.pre_tokenizer
    model = backend.model
    if (
        backend.normalizer is not None
        or type(pre) is not pre_tokenizers.ByteLevel
        or not pre.use_regex
        or pre.add_prefix_space
        or type(model) is not models.BPE
        or model.dropout not in (None, 0.0)
    ):
        return None
    for token in backend.get_added_tokens_decoder().values():
        if (token.lstrip or token.rstrip or token.single_word or not token.content
                or any(char.isspace() for char in token.content)):
            return None
    return backend


class ChunkedEncoder:
    """``tokenizer.encode(text, add_special_tokens=False)`` as a tuple, through a cache of chunk
    ids where that is exact (:func:`chunkable_backend`), else through the backend or
    transformers as :func:`~relaxtrio.chat._fast_render.fast_encode` does.

    Thread-safe (the compiler may run in worker threads): lookups are single dict reads, and
    inserts take a lock.

    Args:
        tokenizer: a transformers tokenizer.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._chunkable = chunkable_backend(tokenizer) is not None
        self._ids: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()

    def encode(self, text: str) -> tuple[int, ...]:
        """The ids of ``text`` (``(T,)`` ints), exactly the tokenizer's."""
        backend = plain_backend(self._tokenizer)
        if backend is None:
            return tuple(int(i) for i in self._tokenizer.encode(text, add_special_tokens=False))
        if not self._chunkable:
            return tuple(backend.encode(text, add_special_tokens=False).ids)
        cache = self._ids
        ids: list[int] = []
        misses = 0
        pieces = text.split(" ")
        chunk = pieces[0]
        start = 0  # offset of ``chunk`` in ``text``
        for piece in islice(pieces, 1, None):
            if chunk and not chunk[-1].isspace():  # a space after a non-space: cut here
                known = cache.get(chunk)
                if known is None:
                    misses += 1
                    if misses > _MAX_MISSES:
                        ids += backend.encode(text[start:], add_special_tokens=False).ids
                        return tuple(ids)
                    known = self._learn(backend, chunk)
                ids += known
                start += len(chunk)
                chunk = " " + piece
            else:
                chunk = chunk + " " + piece
        known = cache.get(chunk)
        ids += known if known is not None else self._learn(backend, chunk)
        return tuple(ids)

    def _learn(self, backend: Any, chunk: str) -> tuple[int, ...]:
        ids = tuple(backend.encode(chunk, add_special_tokens=False).ids)
        if len(chunk) <= _MAX_CHUNK_CHARS:
            with self._lock:
                cache = self._ids
                if len(cache) >= _CACHE_SIZE:
                    cache.pop(next(iter(cache)))
                cache[chunk] = ids
        return ids
