"""The fast render path (``chat/_fast_render.py``) against transformers' own calls.

For every template case and scenario: the rendered text equals ``apply_chat_template(...,
tokenize=False)``, the ids equal ``encode(text, add_special_tokens=False)``, decoding them (and
every prefix and single id) equals ``decode(ids, skip_special_tokens=False,
clean_up_tokenization_spaces=False)``, and a delta that tokenizes only the text after the dummy
prefix equals the full-text encoding minus the trim ids.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.chat.compiler_testkit import CASES, SCENARIOS, scenario

from relaxtrio.chat import _template_inputs as inputs
from relaxtrio.chat._fast_render import fast_decode, fast_encode
from relaxtrio.chat.compiler import DUMMY_PREFIX, ChatCompiler
from relaxtrio.models import load_tokenizer

KWARGS: tuple[dict[str, Any], ...] = ({}, {"enable_thinking": False}, {"custom_flag": [1, "x"]})


def _hf_text(compiler: ChatCompiler, messages: list[dict[str, Any]], tools: Any, kwargs: dict,
             add_generation_prompt: bool) -> str | type[Exception]:
    prepared = inputs.template_messages(messages, compiler.arguments_form, 0)
    try:
        return compiler.tokenizer.apply_chat_template(
            prepared, tools=[dict(t) for t in tools] or None, tokenize=False,
            add_generation_prompt=add_generation_prompt, **kwargs)
    except Exception as exc:  # the fast path must fail the same way
        return type(exc)


@pytest.mark.parametrize("case_name", sorted(CASES))
@pytest.mark.parametrize("scenario_name", sorted(SCENARIOS))
@pytest.mark.parametrize("kwargs", KWARGS, ids=["none", "thinking_off", "custom"])
def test_fast_render_equals_apply_chat_template(
    compilers: dict[str, ChatCompiler], case_name: str, scenario_name: str, kwargs: dict
) -> None:
    compiler = compilers[case_name]
    messages, tools = scenario(CASES[case_name], scenario_name)
    for add_generation_prompt in (True, False):
        expected = _hf_text(compiler, messages, tools, kwargs, add_generation_prompt)
        prepared = inputs.template_messages(messages, compiler.arguments_form, 0)
        if isinstance(expected, type):
            with pytest.raises(expected):
                compiler._renderer.render(prepared, [dict(t) for t in tools] or None,
                                          add_generation_prompt, kwargs)
            continue
        text = compiler._renderer.render(prepared, [dict(t) for t in tools] or None,
                                         add_generation_prompt, kwargs)
        assert text == expected
        ids = fast_encode(compiler.tokenizer, text)
        assert ids == compiler.tokenizer.encode(text, add_special_tokens=False)
        _assert_decodes_alike(compiler, ids)


def _assert_decodes_alike(compiler: ChatCompiler, ids: list[int]) -> None:
    """fast_decode equals transformers' decode on ``ids``, its prefixes and its single ids
    (split multi-byte characters and lone special tokens included)."""
    for part in [ids, *(ids[:n] for n in range(1, len(ids), 7)), *([i] for i in ids[::5])]:
        assert fast_decode(compiler.tokenizer, part) == compiler.tokenizer.decode(
            part, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert compiler.decode(part) == fast_decode(compiler.tokenizer, part)


@pytest.mark.parametrize("case_name", sorted(CASES))
def test_fast_decode_equals_decode_on_text_the_model_may_sample(
    compilers: dict[str, ChatCompiler], case_name: str
) -> None:
    compiler = compilers[case_name]
    texts = ["", " leading and  double  spaces ,punctuation .", "naïve café — 日本語 🙂\n\ttabs",
             "<think>\nhmm</think>\n\nanswer", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
             "don't won't it's", "x" * 40]
    for text in texts:
        _assert_decodes_alike(compiler, fast_encode(compiler.tokenizer, text))
    stops = list(compiler.stop_token_ids)
    _assert_decodes_alike(compiler, [*fast_encode(compiler.tokenizer, "done"), *stops])


@pytest.mark.parametrize("case_name", sorted(CASES))
@pytest.mark.parametrize("scenario_name", sorted(SCENARIOS))
def test_suffix_tokenized_delta_equals_full_text_delta(
    compilers: dict[str, ChatCompiler], case_name: str, scenario_name: str
) -> None:
    compiler = compilers[case_name]
    messages, tools = scenario(CASES[case_name], scenario_name)
    delta = [m for m in messages if m["role"] != "system"][-1:]
    try:
        ids = compiler.render_delta(delta, tools).token_ids
    except Exception as exc:
        pytest.skip(f"no delta for this case: {exc}")
    prepared = inputs.template_messages([*DUMMY_PREFIX, *delta], compiler.arguments_form, 0)
    text = compiler.tokenizer.apply_chat_template(
        prepared, tools=[dict(t) for t in tools] or None, tokenize=False, add_generation_prompt=True)
    trim_text = compiler.tokenizer.apply_chat_template(
        [dict(m) for m in DUMMY_PREFIX], tools=[dict(t) for t in tools] or None, tokenize=False,
        add_generation_prompt=False).removesuffix("\n")
    full = compiler.tokenizer.encode(text, add_special_tokens=False)
    trim = compiler.tokenizer.encode(trim_text, add_special_tokens=False)
    assert tuple(full[: len(trim)]) == tuple(trim)
    assert ids == tuple(full[len(trim):])


def test_smollm2_chatml_deltas_take_the_suffix_path(tiny_model_dir) -> None:
    compiler = ChatCompiler(load_tokenizer(tiny_model_dir))
    assert compiler._dummy_trim((), {}).suffix_ok
