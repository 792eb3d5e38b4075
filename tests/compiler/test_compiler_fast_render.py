"""The fast render path (``chat/_fast_render.py``) against transformers' own calls.

For every template case and scenario: the rendered text equals ``apply_chat_template(...,
tokenize=False)``, the ids equal ``encode(text, add_special_tokens=False)``, and a delta that
tokenizes only the text after the dummy prefix equals the full-text encoding minus the trim ids.
"""

from __future__ import annotations

from typing import Any

import pytest
from compiler_testkit import CASES, SCENARIOS, scenario

from relaxtrio.chat import _template_inputs as inputs
from relaxtrio.chat._fast_render import fast_encode
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
        assert fast_encode(compiler.tokenizer, text) == compiler.tokenizer.encode(
            text, add_special_tokens=False)


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
