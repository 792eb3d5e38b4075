"""Client logprobs cover exactly the content tokens (pitfall B-16)."""

from __future__ import annotations

from pathlib import Path

from relaxtrio.engine.compiler import ChatCompiler
from relaxtrio.engine.model import load_tokenizer
from relaxtrio.rollout.client_logprobs import content_logprobs


def _ids(tok, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def test_content_span_excludes_reasoning_markup_and_stop(tiny_model_dir: Path) -> None:
    tok = load_tokenizer(tiny_model_dir)
    compiler = ChatCompiler(tok)
    think, answer, call = _ids(tok, "<think>hmm</think>"), _ids(tok, "The answer is 4."), _ids(
        tok, '\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')
    ids = think + answer + call + [tok.eos_token_id]
    logprobs = [-float(i) for i in range(len(ids))]
    got = content_logprobs(compiler, ids, logprobs, "The answer is 4.")
    assert "".join(e.token for e in got) == "The answer is 4."
    assert [e.logprob for e in got] == logprobs[len(think): len(think) + len(answer)]


def test_plain_content_drops_only_the_stop_token(tiny_model_dir: Path) -> None:
    tok = load_tokenizer(tiny_model_dir)
    compiler = ChatCompiler(tok)
    ids = _ids(tok, "hello world") + [tok.eos_token_id]
    got = content_logprobs(compiler, ids, [-1.0] * len(ids), "hello world")
    assert len(got) == len(ids) - 1
    assert content_logprobs(compiler, ids, [-1.0] * len(ids), "") == ()
