"""Template matrix: does relaxtrio's lineage equal a full render of the whole conversation?

relaxtrio never re-renders history. The ids it sends for turn n (the *lineage*) are the full render
of the first observation, then for every assistant turn the ids the model sampled (up to and
including its end-of-turn id) followed by the compiler's dummy-prefix delta for the next
observation. Here the sampled ids are simulated as the ids a full render places after the
generation prompt (or, where the template cannot show the turn, the text the model writes plus
EOS). A template is *prefix-stable* for a conversation when the lineage equals
``render(conversation).token_ids``.

Templates are offline reproductions (tests/chat/templates/, checked render-for-render against
the public templates), tokenizers are small offline BPE models with each family's markers.

=====================  =============  ======================  ===========================  ==========
template               text, 3 turns  tool round + new user   parallel + empty results     no system
=====================  =============  ======================  ===========================  ==========
SmolLM2 ChatML+tools   stable         stable                  stable                       stable
Qwen2.5                stable         stable                  stable                       stable
Qwen3, thinking on     think dropped  think dropped           stable                       think dropped
Qwen3, thinking off    empty think    empty think             empty think                  empty think
Llama 3.1              stable         stable                  full render rejects it       stable
DeepSeek-R1 (distill)  think dropped  think dropped           delta differs (see below)    think dropped
=====================  =============  ======================  ===========================  ==========

Documented exceptions (each is asserted below):

* **think dropped** (Qwen3 thinking on; docs/client-quirks.md#dropped-reasoning-on-replay): the
  template keeps ``<think>`` blocks only for assistant turns after the last real user message, so
  once a new user message arrives the full render drops every earlier block. DeepSeek-R1 drops them always (history keeps only the text
  after ``</think>``; its generation prompt's ``<think>\\n`` is not part of history either). The full
  render equals the lineage with exactly those ``<think>\\n…\\n</think>\\n\\n`` spans removed.
  Within one user query (the agentic tool loop) Qwen3 is stable when turns carry reasoning.
* **empty think** (Qwen3 ``enable_thinking=False``): the generation prompt ends with
  ``<think>\\n\\n</think>\\n\\n``, which therefore sits in front of every sampled turn in the
  lineage, while the full render shows no think block for earlier turns. The full render equals
  the lineage with all but the final empty block removed.
* **full render rejects it** (Llama 3.1): the template raises "This model only supports single
  tool-calls at once!" for an assistant message with two calls. The lineage never re-renders that
  message, so the conversation continues; only a full render of this history (a new subtree root)
  is a 400 ``InvalidRequestError``. Llama 3.1 also trims message text and drops an assistant's
  text when it has a call; both are tested below.
* **delta differs** (DeepSeek-R1): the template keeps an "outputs already opened" flag across the
  whole conversation, so a second group of tool outputs is written ``\\n<｜tool▁output▁begin｜>…``
  in a full render but ``<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>…`` after the dummy prefix.
  R1's template also ignores the tools list, never renders canonical tool calls (their content is
  ``""``, not ``None``) and omits the generation prompt after tool outputs: it is a text-only
  template.

What relaxtrio does in every exception: the lineage is authoritative. Generation input and the
exported training context are the sampled ids plus observation deltas, so each sampled token is
trained exactly once with the logprob it was sampled with; the model's own past reasoning (or the
empty think block) stays visible in later turns, which is what a "preserve thinking" template
would render. The full render is used only at a subtree root (a new or rewritten history), where
it is recorded verbatim as that subtree's prompt.
"""

from __future__ import annotations

import pytest
from tests.chat.compiler_testkit import CASES, SCENARIOS, lineage_ids, model_output_ids, rendered_turn_ids, scenario

from relaxtrio import InvalidRequestError
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.chat.parsers import decode_assistant

EXPECTED = {
    "smollm2_chatml": ("stable", "stable", "stable", "stable"),
    "qwen2_5": ("stable", "stable", "stable", "stable"),
    "qwen3_thinking": ("think_dropped", "think_dropped", "stable", "think_dropped"),
    "qwen3_no_thinking": ("empty_think", "empty_think", "empty_think", "empty_think"),
    "llama3_1": ("stable", "stable", "full_render_rejects", "stable"),
    "deepseek_r1": ("think_dropped", "think_dropped", "delta_differs", "think_dropped"),
}
SCENARIO_NAMES = tuple(SCENARIOS)
MATRIX = [(case, name, EXPECTED[case][k]) for case in CASES for k, name in enumerate(SCENARIO_NAMES)]


@pytest.mark.parametrize(("case_name", "scenario_name", "outcome"), MATRIX)
def test_lineage_against_full_render(
    compilers: dict[str, ChatCompiler], case_name: str, scenario_name: str, outcome: str
) -> None:
    case, compiler = CASES[case_name], compilers[case_name]
    messages, tools = scenario(case, scenario_name)
    lineage = lineage_ids(compiler, case, messages, tools)
    if outcome == "full_render_rejects":
        with pytest.raises(InvalidRequestError, match="single tool-calls") as info:
            compiler.render(messages, tools, case.template_kwargs).token_ids
        assert info.value.param == "messages"
        # ... while the lineage went on: sampled parallel calls, then one ipython turn per result.
        text = compiler.decode(lineage)
        assert '{"name": "read_file", "parameters": {"path":"a.py"}}; {"name": "read_file"' in text
        assert '<|start_header_id|>ipython<|end_header_id|>\n\n"A"<|eot_id|>' in text
        assert text.count("<|start_header_id|>ipython<|end_header_id|>") == 3
        return
    full = compiler.render(messages, tools, case.template_kwargs).token_ids
    if outcome == "stable":
        assert lineage == full
        return
    assert lineage != full
    lineage_text, full_text = compiler.decode(lineage), compiler.decode(full)
    if outcome == "think_dropped":
        expected, removed = lineage_text, 0
        for message in messages:
            block = f"<think>\n{message.get('reasoning_content')}\n</think>\n\n"
            if message.get("reasoning_content") and block in expected:
                expected, removed = expected.replace(block, "", 1), removed + 1
        assert removed >= 1
        assert full_text == expected
        assert full == tuple(compiler.tokenizer.encode(expected, add_special_tokens=False))
    elif outcome == "empty_think":
        block = "<think>\n\n</think>\n\n"
        assert lineage_text.count(block) == sum(m["role"] == "assistant" for m in messages) + 1
        head, sep, tail = lineage_text.rpartition(block)
        assert full_text == head.replace(block, "") + sep + tail
    elif outcome == "delta_differs":
        second_group = "<｜end▁of▁sentence｜><｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>"
        assert "<｜tool▁outputs▁end｜>" + second_group in lineage_text
        assert "<｜tool▁outputs▁end｜><｜end▁of▁sentence｜>\n<｜tool▁output▁begin｜>" in full_text
    else:  # pragma: no cover - table typo
        raise AssertionError(outcome)


ROUND_TRIP = [(case, name) for case, name, outcome in MATRIX if not (case == "deepseek_r1" and SCENARIOS[name][1])]


@pytest.mark.parametrize(("case_name", "scenario_name"), ROUND_TRIP)
def test_sampled_turns_parse_back_to_the_conversation(
    compilers: dict[str, ChatCompiler], case_name: str, scenario_name: str
) -> None:
    """The template's own assistant format, parsed with the case's parsers, gives the message back
    (call ids aside), and the EOS stays in the ids but not in the content."""
    case, compiler = CASES[case_name], compilers[case_name]
    messages, tools = scenario(case, scenario_name)
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        turn = rendered_turn_ids(compiler, messages, index, tools, case.template_kwargs) or model_output_ids(
            compiler, case, message
        )
        earlier_turns = any(m["role"] == "assistant" for m in messages[:index])
        prompt = (
            lineage_ids(compiler, case, messages[:index], tools)
            if earlier_turns
            else compiler.render(messages[:index], tools, case.template_kwargs).token_ids
        )
        decoded = decode_assistant(
            turn,
            "stop",
            compiler=compiler,
            parent_state_hash="f" * 64,
            stop_token_ids=compiler.stop_token_ids,
            reasoning_parser=case.reasoning_parser,
            tool_call_parser=case.tool_call_parser,
            tools=tools,
            prompt_opened_think=compiler.prompt_opens_think(prompt),
        )
        got = dict(decoded.message)
        assert decoded.finish_reason == ("tool_calls" if message.get("tool_calls") else "stop")
        got_calls = [c["function"] for c in got.pop("tool_calls", [])]
        want = dict(message)
        want_calls = [c["function"] for c in want.pop("tool_calls", [])]
        assert got == want
        assert got_calls == want_calls
        assert turn[-1] == compiler.turn_end_token_id
        assert compiler.tokenizer.decode([turn[-1]]) not in got["content"]


def test_qwen3_is_stable_inside_one_tool_loop_but_not_across_user_turns(compilers: dict[str, ChatCompiler]) -> None:
    """Dropped think blocks seen through the lineage: the same turn is stable until a new user message arrives."""
    case, compiler = CASES["qwen3_thinking"], compilers["qwen3_thinking"]
    messages, tools = scenario(case, "tool_round_then_user")
    loop_only = messages[:4]  # system, user, assistant(call), tool → next prompt
    assert lineage_ids(compiler, case, loop_only, tools) == compiler.render(loop_only, tools).token_ids
    assert lineage_ids(compiler, case, messages, tools) != compiler.render(messages, tools).token_ids


def test_llama3_trims_text_and_drops_text_next_to_a_call(compilers: dict[str, ChatCompiler]) -> None:
    case, compiler = CASES["llama3_1"], compilers["llama3_1"]
    messages, tools = scenario(case, "tool_round_then_user")
    eot = compiler.turn_end_token_id
    # The model wrote whitespace around its answer: sampled ids keep it, the template trims it.
    padded = (*compiler.tokenizer.encode("  It is 20C in Paris.\n", add_special_tokens=False), eot)

    def sampled(index: int) -> tuple[int, ...]:
        return padded if index == 4 else rendered_turn_ids(compiler, messages, index, tools, {}) or ()

    lineage = lineage_ids(compiler, case, messages, tools, generated=sampled)
    full = compiler.render(messages, tools).token_ids
    assert lineage != full
    assert compiler.decode(full) == compiler.decode(lineage).replace("  It is 20C in Paris.\n", "It is 20C in Paris.")
    # Text before a call: the parsed message keeps it, the template does not render it.
    with_text = [*messages[:2], {**messages[2], "content": "Let me check."}]
    rendered = compiler.decode(compiler.render([*with_text, messages[3]], tools).token_ids)
    assert "Let me check." not in rendered
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>' in rendered


def test_deepseek_r1_ignores_tools_and_canonical_calls(compilers: dict[str, ChatCompiler]) -> None:
    case, compiler = CASES["deepseek_r1"], compilers["deepseek_r1"]
    messages, tools = scenario(case, "tool_round_then_user")
    text = compiler.decode(compiler.render(messages[:4], tools).token_ids)
    assert "get_weather" not in text  # neither the tool list nor the call
    assert text.endswith("<｜tool▁outputs▁end｜>")  # and no generation prompt after tool outputs
    assert compiler.prompt_opens_think(compiler.render(messages[:2], tools).token_ids)
