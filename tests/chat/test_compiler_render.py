"""ChatCompiler: full render, dummy-prefix delta, argument forms, kwargs, stop ids.

The template quirks covered here are described in docs/client-quirks.md#chat-templates.
"""

from __future__ import annotations

import copy

import pytest
from tests.chat.compiler_testkit import CASES, FAMILIES, TOOLS, assistant, build_tokenizer, call, scenario, tool

from relaxtrio import InternalError, InvalidRequestError
from relaxtrio.chat.compiler import DUMMY_PREFIX, ChatCompiler

USER = {"role": "user", "content": "hi"}


def qwen_compiler(template: str, **kwargs: object) -> ChatCompiler:
    return ChatCompiler(build_tokenizer(FAMILIES["qwen"], template), **kwargs)


@pytest.mark.parametrize("case_name", ["llama3_1", "deepseek_r1"])
def test_exactly_one_bos_when_the_template_writes_it(compilers: dict[str, ChatCompiler], case_name: str) -> None:
    """The template writes BOS, so encoding must not add another one (docs/client-quirks.md#double-bos)."""
    compiler = compilers[case_name]
    bos = compiler.tokenizer.bos_token_id
    prompt = compiler.render([USER])
    assert prompt.token_ids[0] == bos
    assert prompt.token_ids.count(bos) == 1
    # The trap is real with this tokenizer: encoding with special tokens doubles the BOS.
    assert compiler.tokenizer.encode(prompt.text, add_special_tokens=True).count(bos) == 2
    # A delta never carries a BOS (the dummy prefix's BOS is trimmed off).
    assert bos not in compiler.render_delta([{"role": "user", "content": "more"}]).token_ids


def test_chatml_delta_starts_with_the_newline_after_im_end(compilers: dict[str, ChatCompiler]) -> None:
    """The delta begins with the "\\n" the template writes after the sampled <|im_end|>
    (docs/client-quirks.md#turn-separator-in-a-delta)."""
    compiler = compilers["smollm2_chatml"]
    delta = compiler.render_delta([tool("call_1", '{"temp":"20C"}')], TOOLS).token_ids
    text = compiler.decode(delta)
    assert text == (
        '\n<|im_start|>user\n<tool_response>\n{"temp":"20C"}\n</tool_response><|im_end|>\n<|im_start|>assistant\n'
    )


@pytest.mark.parametrize("case_name", ["smollm2_chatml", "qwen2_5", "qwen3_thinking"])
def test_consecutive_tool_results_share_one_user_turn(compilers: dict[str, ChatCompiler], case_name: str) -> None:
    """Two results (one of them empty) render as one user turn with two <tool_response> blocks
    (docs/client-quirks.md#grouped-tool-results)."""
    compiler = compilers[case_name]
    text = compiler.decode(compiler.render_delta([tool("a", "A"), tool("b", "")], TOOLS).token_ids)
    assert text.count("<|im_start|>user") == 1
    assert text.count("<tool_response>") == 2
    assert "<tool_response>\nA\n</tool_response>\n<tool_response>\n\n</tool_response><|im_end|>" in text


def test_arguments_reach_tojson_templates_as_mappings(compilers: dict[str, ChatCompiler]) -> None:
    """Qwen2.5 pipes arguments through tojson; a JSON string would come out double-encoded
    (docs/client-quirks.md#tool-call-arguments-mapping-or-string)."""
    compiler = compilers["qwen2_5"]
    assert compiler.arguments_form == "mapping"
    messages = [USER, assistant("", calls=[call("c1", "get_weather", '{"city":"Paris"}')]), tool("c1", "ok")]
    text = compiler.render(messages, TOOLS).text
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert '\\"city\\"' not in text


CONCAT_TEMPLATE = (
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] -%}<tool_call>{{ '{\"name\": \"' + c.function.name + '\", \"arguments\": '"
    " + c.function.arguments + '}' }}</tool_call>{%- endfor -%}<|im_end|>\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)
REPR_TEMPLATE = CONCAT_TEMPLATE.replace(
    "{{ '{\"name\": \"' + c.function.name + '\", \"arguments\": ' + c.function.arguments + '}' }}",
    "{{ c.function.name }} {{ c.function.arguments }}",
)


@pytest.mark.parametrize("template", [CONCAT_TEMPLATE, REPR_TEMPLATE], ids=["concatenates", "prints"])
def test_templates_that_need_strings_get_the_canonical_string(template: str) -> None:
    """The other direction: a template that concatenates arguments (or would print a dict's
    Python repr) gets the canonical JSON string."""
    compiler = qwen_compiler(template)
    assert compiler.arguments_form == "string"
    messages = [USER, assistant("", calls=[call("c1", "get_weather", '{"city":"Paris"}')])]
    text = compiler.render(messages, TOOLS, add_generation_prompt=False).text
    assert '{"city":"Paris"}' in text
    assert "'city'" not in text


@pytest.mark.parametrize(
    ("arguments", "message"), [("{bad", "must be valid JSON"), ("[1, 2]", "must be a JSON object")]
)
def test_invalid_arguments_name_the_field(compilers: dict[str, ChatCompiler], arguments: str, message: str) -> None:
    compiler = compilers["qwen2_5"]
    bad = assistant("", calls=[call("c1", "get_weather", '{"city":"Paris"}'), call("c2", "get_weather", arguments)])
    with pytest.raises(InvalidRequestError, match=message) as info:
        compiler.render([USER, bad], TOOLS)
    assert info.value.param == "messages[1].tool_calls[1].function.arguments"
    with pytest.raises(InvalidRequestError) as info:
        compiler.render_delta([bad, tool("c1", "x")], TOOLS, message_offset=5)
    assert info.value.param == "messages[5].tool_calls[1].function.arguments"


@pytest.mark.parametrize(
    "key", ["tokenize", "add_generation_prompt", "tools", "chat_template", "messages", "return_dict"]
)
def test_reserved_template_kwargs_are_rejected(compilers: dict[str, ChatCompiler], key: str) -> None:
    with pytest.raises(InvalidRequestError, match="reserved") as info:
        compilers["qwen3_thinking"].render([USER], (), {key: True}).token_ids
    assert info.value.param == f"chat_template_kwargs.{key}"


def test_template_errors_are_client_errors(compilers: dict[str, ChatCompiler]) -> None:
    with pytest.raises(InvalidRequestError) as info:
        compilers["qwen2_5"].render([]).token_ids
    assert info.value.param == "messages"


MOVING_TOOLS_TEMPLATE = r"""
{%- for m in messages -%}
  {%- if m.role == 'user' and loop.last and tools -%}{{- '[TOOLS]' + (tools | tojson) + '[/TOOLS]' -}}{%- endif -%}
  {{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""


def test_a_template_that_rewrites_the_dummy_prefix_is_refused() -> None:
    """Like Mistral's [AVAILABLE_TOOLS], the tool list moves to the last user message, so the
    dummy prefix renders differently once a delta follows it: no silently wrong ids."""
    compiler = qwen_compiler(MOVING_TOOLS_TEMPLATE)
    with pytest.raises(InternalError, match="not prefix-stable"):
        compiler.render_delta([{"role": "user", "content": "next"}], TOOLS).token_ids
    # Without tools nothing moves and the delta is fine.
    assert compiler.decode(compiler.render_delta([{"role": "user", "content": "next"}]).token_ids) == (
        "\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"
    )


def test_empty_delta_is_a_caller_bug(compilers: dict[str, ChatCompiler]) -> None:
    with pytest.raises(InternalError):
        compilers["qwen2_5"].render_delta([]).token_ids


@pytest.mark.parametrize(
    ("case_name", "stops", "turn_end"),
    [
        ("smollm2_chatml", ["<|im_end|>"], "<|im_end|>"),
        ("qwen2_5", ["<|im_end|>"], "<|im_end|>"),
        ("qwen3_thinking", ["<|im_end|>"], "<|im_end|>"),
        ("llama3_1", ["<|eot_id|>", "<|eom_id|>"], "<|eot_id|>"),
        ("deepseek_r1", ["<｜end▁of▁sentence｜>"], "<｜end▁of▁sentence｜>"),
    ],
)
def test_stop_ids_and_turn_end(
    compilers: dict[str, ChatCompiler], case_name: str, stops: list[str], turn_end: str
) -> None:
    compiler = compilers[case_name]
    tokenizer = compiler.tokenizer
    assert compiler.stop_token_ids == tuple(sorted(tokenizer.convert_tokens_to_ids(stops)))
    assert compiler.turn_end_token_id == tokenizer.convert_tokens_to_ids(turn_end)
    assert compiler.turn_closed_by_stop_token


def test_extra_stop_ids_are_merged() -> None:
    """A model's generation_config EOS list (Qwen adds <|endoftext|>) is passed in explicitly."""
    tokenizer = build_tokenizer(FAMILIES["qwen"], CASES["qwen2_5"].template.read_text())
    endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert endoftext not in ChatCompiler(tokenizer).stop_token_ids
    merged = ChatCompiler(tokenizer, extra_stop_token_ids=[endoftext]).stop_token_ids
    assert merged == (endoftext, tokenizer.eos_token_id)


def test_empty_tools_are_passed_as_none_by_default() -> None:
    """Llama 3.1 tests `tools is not none`: an empty list would announce tools to a text chat."""
    template = CASES["llama3_1"].template.read_text()
    default = ChatCompiler(build_tokenizer(FAMILIES["llama3"], template))
    literal = ChatCompiler(build_tokenizer(FAMILIES["llama3"], template), pass_empty_tools=True)
    assert "Environment: ipython" not in default.render([USER], ()).text
    assert "Environment: ipython" in literal.render([USER], ()).text


def test_decode_keeps_special_tokens_and_spacing(compilers: dict[str, ChatCompiler]) -> None:
    compiler = compilers["qwen3_thinking"]
    text = "<think>\nhm , ok\n</think>\n\nYes .<|im_end|>"
    assert compiler.decode(compiler.tokenizer.encode(text, add_special_tokens=False)) == text


def test_prompt_opens_think(compilers: dict[str, ChatCompiler]) -> None:
    assert compilers["deepseek_r1"].prompt_opens_think(compilers["deepseek_r1"].render([USER]).token_ids)
    assert not compilers["qwen3_thinking"].prompt_opens_think(compilers["qwen3_thinking"].render([USER]).token_ids)
    no_think = compilers["qwen3_no_thinking"].render([USER], (), {"enable_thinking": False}).token_ids
    assert compilers["qwen3_no_thinking"].decode(no_think).endswith("<think>\n\n</think>\n\n")
    assert not compilers["qwen3_no_thinking"].prompt_opens_think(no_think)


def test_inputs_are_not_mutated_and_timings_are_reported(compilers: dict[str, ChatCompiler]) -> None:
    compiler = compilers["qwen3_thinking"]
    messages, tools = scenario(CASES["qwen3_thinking"], "parallel_and_empty_results")
    before = copy.deepcopy((messages, tools))
    full = compiler.render(messages, tools)
    delta = compiler.render_delta(messages[3:5], tools)
    assert (messages, tools) == before
    for encoded in (full, delta):
        assert encoded.apply_chat_template_s >= 0 and encoded.tokenizer_encode_s >= 0
        assert encoded.total_s >= encoded.apply_chat_template_s + encoded.tokenizer_encode_s
    assert delta.text.startswith(compiler.render(list(DUMMY_PREFIX), tools, add_generation_prompt=False).text)


def test_delta_depends_on_template_kwargs(compilers: dict[str, ChatCompiler]) -> None:
    compiler = compilers["qwen3_thinking"]
    on = compiler.decode(compiler.render_delta([USER]).token_ids)
    off = compiler.decode(compiler.render_delta([USER], (), {"enable_thinking": False}).token_ids)
    assert on == "\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert off == on + "<think>\n\n</think>\n\n"
