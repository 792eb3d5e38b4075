"""Golden renders of the published chat templates of DeepSeek-V3.1, GLM-4.6, Kimi-K2-Thinking,
gpt-oss and Mistral Small 3.2 (relaxtrio/chat/templates/): one multi-turn tool conversation
(parallel calls, an argument with braces and quotes, tool results, a final answer, a new user
message), rendered to the exact text each template produces and to token ids in which every special
token is one id (docs/model-families.md).

What each template does with history is part of the golden: DeepSeek-V3.1 writes no reasoning,
GLM-4.6 and Kimi-K2-Thinking write an empty think block for turns before the last user message (or
the last final answer), gpt-oss drops the analysis of a tool turn once a final answer follows and
sends tool output as a JSON string, Mistral Small 3.2 writes the tool list before the last user
message and the 9-character call ids.
"""

from __future__ import annotations

import datetime
import json

import pytest
from tests.chat.families_testkit import FAMILIES, TOOLS, conversation, reference_ids

TOOLS_JSON = json.dumps(list(TOOLS))
GLM_TOOLS = "\n".join(json.dumps(tool) for tool in TOOLS)
CALL_IDS = {
    "kimi_k2": ("functions.get_weather:0", "functions.get_weather:1", "functions.run_code:2", ""),
    "mistral": ("a1b2c3d4e", "f5a6b7c8d", "e9f0a1b2c", ""),
}

GOLDEN = {
    'deepseek_v3_1': (
        '<｜begin▁of▁sentence｜>You are a terse assistant.<｜User｜>Weather in Paris and Rome?'
        + '<｜Assistant｜></think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>'
        + '{"city":"Paris"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>'
        + '{"city":"Rome"}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'
        + '<｜tool▁output▁begin｜>{"temp": "20C"}<｜tool▁output▁end｜><｜tool▁output▁begin｜>'
        + '{"temp": "18C"}<｜tool▁output▁end｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>run_code'
        + '<｜tool▁sep｜>{"code":"if (a) { print(\\"}\\") }","timeout":5}<｜tool▁call▁end｜>'
        + '<｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁output▁begin｜>}<｜tool▁output▁end｜>'
        + 'It is 20C in Paris and 18C in Rome.<｜end▁of▁sentence｜><｜User｜>Thanks!<｜Assistant｜>'
        + '</think>'
    ),
    'glm4_6': (
        '[gMASK]<sop><|system|>'
        + '\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n'
        + 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n'
        + GLM_TOOLS
        + '\n</tools>\n\n'
        + 'For each function call, output the function name and arguments within the following XML format:\n'
        + '<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}'
        + '</arg_value>\n<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>'
        + '\n...\n</tool_call><|system|>\nYou are a terse assistant.<|user|>'
        + '\nWeather in Paris and Rome?<|assistant|>\n<think></think>\n<tool_call>get_weather\n'
        + '<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>\n<tool_call>'
        + 'get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n</tool_call>'
        + '<|observation|>\n<tool_response>\n{"temp": "20C"}\n</tool_response>\n<tool_response>'
        + '\n{"temp": "18C"}\n</tool_response><|assistant|>\n<think></think>\n<tool_call>run_code\n'
        + '<arg_key>code</arg_key>\n<arg_value>if (a) { print("}") }</arg_value>\n<arg_key>'
        + 'timeout</arg_key>\n<arg_value>5</arg_value>\n</tool_call><|observation|>\n'
        + '<tool_response>\n}\n</tool_response><|assistant|>\n<think></think>'
        + '\nIt is 20C in Paris and 18C in Rome.<|user|>\nThanks!<|assistant|>'
    ),
    'kimi_k2': (
        '<|im_system|>tool_declare<|im_middle|>'
        + TOOLS_JSON
        + '<|im_end|><|im_system|>system<|im_middle|>You are a terse assistant.<|im_end|>'
        + '<|im_user|>user<|im_middle|>Weather in Paris and Rome?<|im_end|><|im_assistant|>'
        + 'assistant<|im_middle|><think></think><|tool_calls_section_begin|><|tool_call_begin|>'
        + 'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}'
        + '<|tool_call_end|><|tool_call_begin|>functions.get_weather:1'
        + '<|tool_call_argument_begin|>{"city": "Rome"}<|tool_call_end|>'
        + '<|tool_calls_section_end|><|im_end|><|im_system|>tool<|im_middle|>'
        + '## Return of functions.get_weather:0\n{"temp": "20C"}<|im_end|><|im_system|>tool'
        + '<|im_middle|>## Return of functions.get_weather:1\n{"temp": "18C"}<|im_end|>'
        + '<|im_assistant|>assistant<|im_middle|><think></think><|tool_calls_section_begin|>'
        + '<|tool_call_begin|>functions.run_code:2<|tool_call_argument_begin|>'
        + '{"code": "if (a) { print(\\"}\\") }", "timeout": 5}<|tool_call_end|>'
        + '<|tool_calls_section_end|><|im_end|><|im_system|>tool<|im_middle|>'
        + '## Return of functions.run_code:2\n}<|im_end|><|im_assistant|>assistant<|im_middle|>'
        + '<think></think>It is 20C in Paris and 18C in Rome.<|im_end|><|im_user|>user'
        + '<|im_middle|>Thanks!<|im_end|><|im_assistant|>assistant<|im_middle|>'
    ),
    'gpt_oss': (
        '<|start|>system<|message|>'
        + 'You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n'
        + 'Current date: {date}\n\nReasoning: medium\n\n'
        + '# Valid channels: analysis, commentary, final. Channel must be included for every message.\n'
        + "Calls to these tools must go to the commentary channel: 'functions'."
        + '<|end|><|start|>developer<|message|>'
        + '# Instructions\n\nYou are a terse assistant.\n\n# Tools\n\n## functions\n\nnamespace functions {\n'
        + '\n// Current weather of a city.\ntype get_weather = (_: {\ncity: string,\n}) => any;\n\n'
        + '// Runs code.\ntype run_code = (_: {\ncode: string,\ntimeout?: number,\n}) => any;\n\n'
        + '} // namespace functions'
        + '<|end|><|start|>user<|message|>Weather in Paris and Rome?<|end|><|start|>'
        + 'assistant to=functions.get_weather<|channel|>commentary json<|message|>'
        + '{"city": "Paris"}<|call|><|start|>functions.get_weather to=assistant<|channel|>'
        + 'commentary<|message|>"{\\"temp\\": \\"20C\\"}"<|end|><|start|>'
        + 'assistant to=functions.run_code<|channel|>commentary json<|message|>'
        + '{"code": "if (a) { print(\\"}\\") }", "timeout": 5}<|call|><|start|>'
        + 'functions.run_code to=assistant<|channel|>commentary<|message|>"}"<|end|><|start|>'
        + 'assistant<|channel|>final<|message|>It is 20C in Paris and 18C in Rome.<|end|>'
        + '<|start|>user<|message|>Thanks!<|end|><|start|>assistant'
    ),
    'mistral': (
        '<s>[SYSTEM_PROMPT]You are a terse assistant.[/SYSTEM_PROMPT][INST]'
        + 'Weather in Paris and Rome?[/INST][TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]'
        + '{"city": "Paris"}[TOOL_CALLS]get_weather[CALL_ID]f5a6b7c8d[ARGS]{"city": "Rome"}</s>'
        + '[TOOL_RESULTS]a1b2c3d4e[TOOL_CONTENT]{"temp": "20C"}[/TOOL_RESULTS][TOOL_RESULTS]'
        + 'f5a6b7c8d[TOOL_CONTENT]{"temp": "18C"}[/TOOL_RESULTS][TOOL_CALLS]run_code[CALL_ID]'
        + 'e9f0a1b2c[ARGS]{"code": "if (a) { print(\\"}\\") }", "timeout": 5}</s>[TOOL_RESULTS]'
        + 'e9f0a1b2c[TOOL_CONTENT]}[/TOOL_RESULTS]It is 20C in Paris and 18C in Rome.</s>'
        + '[AVAILABLE_TOOLS]'
        + TOOLS_JSON
        + '[/AVAILABLE_TOOLS][INST]Thanks![/INST]'
    ),
}


def golden_conversation(family: str) -> list[dict]:
    ids = CALL_IDS.get(family, ("call_1", "call_2", "call_3", ""))
    # gpt-oss's template renders one call per assistant turn (harmony stops at <|call|>).
    return conversation(ids, reasoning=True, parallel=family != "gpt_oss")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_golden_render_text_and_ids(family: str) -> None:
    fam = FAMILIES[family]
    compiler = fam.compiler()
    before = datetime.date.today().isoformat()
    rendered = compiler.render(golden_conversation(family), TOOLS)
    after = datetime.date.today().isoformat()
    assert rendered.text in {GOLDEN[family].replace("{date}", day) for day in (before, after)}
    assert list(rendered.token_ids) == reference_ids(compiler, fam, rendered.text)
    specials = {compiler.tokenizer.convert_tokens_to_ids(token) for token in fam.special}
    number_of_specials = sum(rendered.text.count(token) for token in fam.special if not any(
        token != other and token in other for other in fam.special))
    assert sum(1 for i in rendered.token_ids if i in specials) == number_of_specials


def test_golden_stop_ids() -> None:
    """The ids that end a generation: each family's end-of-turn tokens, and for gpt-oss only
    <|call|> and <|return|> (its <|end|> closes the analysis message inside a reply)."""
    expected = {
        "deepseek_v3_1": {"<｜end▁of▁sentence｜>"},
        "glm4_6": {"<|endoftext|>", "<|user|>", "<|observation|>"},
        "kimi_k2": {"<|im_end|>"},
        "gpt_oss": {"<|return|>", "<|call|>"},
        "mistral": {"</s>"},
    }
    for family, fam in FAMILIES.items():
        compiler = fam.compiler()
        tokens = set(compiler.tokenizer.convert_ids_to_tokens(list(compiler.stop_token_ids)))
        assert tokens == expected[family], family
