"""``ChunkedEncoder`` (``chat/_chunked_encode.py``) against the tokenizer's own ``encode``.

The cut rule (before a space that follows a non-whitespace character) is exact only for
byte-level BPE tokenizers; these tests compare the chunked ids with ``encode(text,
add_special_tokens=False)`` on every bundled test tokenizer and the tiny model's, cold and warm,
over random texts built from the characters that decide pre-tokenization, and for every code point
of the first planes right before a space.
"""

from __future__ import annotations

import random

import pytest
from tests.chat.compiler_testkit import CASES

from relaxtrio.chat import _chunked_encode
from relaxtrio.chat._chunked_encode import ChunkedEncoder, chunkable_backend
from relaxtrio.chat.compiler import ChatCompiler

PIECES = (
    " ", "  ", "   ", "\n", "\n\n", " \n", "\t", "\r\n", "\u00a0", "\u3000", "\u2028", "\u0085", "\x1c",
    "\x0b", "a", "Paris", "weather", "The", "É", "日本", "🙂", "0", "42", "3.14", "'s", "'ll", "'t", "'",
    "?", "!", "...", ",", "{", '"', "}", "<", ">", "-", "_", "#", "<|im_start|>", "<|im_end|>",
    "<tool_call>", "<think>", "user", "assistant",
)


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, 40))) for _ in range(count)]


def _tokenizers(compilers: dict[str, ChatCompiler], tokenizer) -> dict[str, object]:
    return {**{name: c.tokenizer for name, c in compilers.items()}, "tiny_model": tokenizer}


def test_every_bundled_byte_level_tokenizer_is_chunkable(compilers, tokenizer) -> None:
    for name, tok in _tokenizers(compilers, tokenizer).items():
        assert chunkable_backend(tok) is not None, name


@pytest.mark.parametrize("name", [*sorted(CASES), "tiny_model"])
def test_chunked_ids_equal_encode_on_random_texts(compilers, tokenizer, name: str) -> None:
    tok = _tokenizers(compilers, tokenizer)[name]
    encoder = ChunkedEncoder(tok)
    texts = _texts(seed=len(name), count=400)
    for _ in range(2):  # cold cache, then warm
        for text in texts:
            assert encoder.encode(text) == tuple(tok.encode(text, add_special_tokens=False)), repr(text)


def test_every_code_point_before_a_space_cuts_exactly(tokenizer) -> None:
    """The cut rule relies on str.isspace covering the regex's \\s: a character for which it
    is False must end a pre-token piece when a space follows."""
    backend = chunkable_backend(tokenizer)
    encode = backend.encode
    for code in [*range(0x3100), 0x85, 0xA0, 0x1680, 0x180E, 0x200B, 0x2060, 0xFEFF, 0x3000]:
        char = chr(code)
        if char.isspace() or 0xD800 <= code <= 0xDFFF:
            continue
        whole = encode(f"x{char} y", add_special_tokens=False).ids
        assert whole == encode(f"x{char}", add_special_tokens=False).ids + encode(" y", add_special_tokens=False).ids, hex(code)


def test_long_novel_text_goes_in_one_call_after_many_misses(tokenizer, monkeypatch) -> None:
    monkeypatch.setattr(_chunked_encode, "_MAX_MISSES", 3)
    encoder = ChunkedEncoder(tokenizer)
    text = " ".join(f"w{i}x" for i in range(50)) + " tail  end\n next"
    assert encoder.encode(text) == tuple(tokenizer.encode(text, add_special_tokens=False))
    assert len(encoder._ids) == 3  # the chunks before the rest went in one call
    assert encoder.encode(text) == tuple(tokenizer.encode(text, add_special_tokens=False))


def test_tokenizers_it_cannot_cut_encode_whole_texts(tokenizer, monkeypatch) -> None:
    from tokenizers import pre_tokenizers

    backend = tokenizer.backend_tokenizer
    saved = backend.pre_tokenizer
    try:
        backend.pre_tokenizer = pre_tokenizers.Metaspace()
        assert chunkable_backend(tokenizer) is None
        encoder = ChunkedEncoder(tokenizer)
        assert encoder.encode("a b  c") == tuple(tokenizer.encode("a b  c", add_special_tokens=False))
        assert encoder._ids == {}
    finally:
        backend.pre_tokenizer = saved
