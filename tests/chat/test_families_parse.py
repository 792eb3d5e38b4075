"""Parsers of the 2026 model families on the text the models write (docs/model-families.md):
parallel calls, arguments with braces and quotes, reasoning before calls, malformed and undeclared
calls kept as text, and ``--agentic-tool-call-parser auto``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.chat.families_testkit import FAMILIES, TEMPLATES, TOOLS, TRICKY_CODE

from relaxtrio.chat.parsers import (
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    ParsedToolCall,
    parse_reasoning,
    parse_tool_calls_detailed,
    resolve_tool_call_parser,
)
from relaxtrio.chat.parsers._detect import template_tool_call_parsers

PARIS = ParsedToolCall("get_weather", '{"city":"Paris"}')
ROME = ParsedToolCall("get_weather", '{"city":"Rome"}')
CODE = ParsedToolCall("run_code", json.dumps({"code": TRICKY_CODE, "timeout": 5}, separators=(",", ":"),
                                              sort_keys=True))
CODE_ARGS = '{"code": "if (a) { print(\\"}\\") }", "timeout": 5}'


def test_registered_names() -> None:
    assert set(TOOL_CALL_PARSERS) >= {"deepseekv3", "deepseekv31", "glm45", "kimi_k2", "mistral", "gpt-oss", "auto"}
    assert set(REASONING_PARSERS) >= {"deepseek-v3", "glm45", "kimi_k2", "mistral", "gpt-oss"}


def ds(name: str) -> str:
    return f"<｜{name}｜>"


CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP = (
    ds("tool▁calls▁begin"), ds("tool▁calls▁end"), ds("tool▁call▁begin"), ds("tool▁call▁end"), ds("tool▁sep"))

# (parser, model output after the reasoning parser, content, calls)
CASES = {
    "deepseek_v31_parallel": (
        "deepseekv31",
        f"Checking.{CALLS_BEGIN}{CALL_BEGIN}get_weather{SEP}{{\"city\": \"Paris\"}}{CALL_END}"
        f"{CALL_BEGIN}run_code{SEP}{CODE_ARGS}{CALL_END}{CALLS_END}",
        "Checking.", [PARIS, CODE],
    ),
    "deepseek_v3_fenced": (
        "deepseekv3",
        f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}get_weather\n```json\n{{\"city\": \"Paris\"}}\n```{CALL_END}\n"
        f"{CALL_BEGIN}function{SEP}run_code\n```json\n{CODE_ARGS}\n```{CALL_END}{CALLS_END}",
        "", [PARIS, CODE],
    ),
    "glm45_parallel": (
        "glm45",
        "Let me look.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
        f"\n<tool_call>run_code\n<arg_key>code</arg_key>\n<arg_value>{TRICKY_CODE}</arg_value>\n"
        "<arg_key>timeout</arg_key>\n<arg_value>5</arg_value>\n</tool_call>",
        "Let me look.", [PARIS, CODE],
    ),
    "kimi_parallel": (
        "kimi_k2",
        "On it.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.run_code:1<|tool_call_argument_begin|>'
        f"{CODE_ARGS}<|tool_call_end|><|tool_calls_section_end|>",
        "On it.", [ParsedToolCall(PARIS.name, PARIS.arguments, "functions.get_weather:0"),
                   ParsedToolCall(CODE.name, CODE.arguments, "functions.run_code:1")],
    ),
    "mistral_v11_parallel": (
        "mistral",
        '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}'
        f"[TOOL_CALLS]run_code[CALL_ID]e9f0a1b2c[ARGS]{CODE_ARGS}",
        "", [ParsedToolCall(PARIS.name, PARIS.arguments, "a1b2c3d4e"),
             ParsedToolCall(CODE.name, CODE.arguments, "e9f0a1b2c")],
    ),
    "mistral_v13_no_ids": (
        "mistral",
        f'Sure.[TOOL_CALLS]get_weather[ARGS]{{"city": "Paris"}}[TOOL_CALLS]run_code[ARGS]{CODE_ARGS}',
        "Sure.", [PARIS, CODE],
    ),
    "mistral_v3_json_list": (
        "mistral",
        f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {{"city": "Paris"}}, "id": "a1b2c3d4e"}},'
        f' {{"name": "run_code", "arguments": {CODE_ARGS}}}]',
        "", [ParsedToolCall(PARIS.name, PARIS.arguments, "a1b2c3d4e"), CODE],
    ),
    "gpt_oss_call_after_reasoning_parser": (
        "gpt-oss",
        "<|start|>assistant to=functions.run_code<|channel|>commentary json<|message|>" + CODE_ARGS + "<|call|>",
        "", [CODE],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_family_goldens(case: str) -> None:
    parser, text, content, calls = CASES[case]
    result = parse_tool_calls_detailed(text, parser, TOOLS)
    assert (result.content, list(result.calls), result.rejected) == (content, calls, ())


@pytest.mark.parametrize(
    ("parser", "text", "reason"),
    [
        ("deepseekv31", f"{CALLS_BEGIN}{CALL_BEGIN}get_weather{SEP}{{\"city\": }}{CALL_END}{CALLS_END}", "malformed"),
        ("deepseekv31", f"{CALLS_BEGIN}{CALL_BEGIN}get_weather{SEP}{{\"city\": \"Paris\"}}", "malformed"),
        ("glm45", "<tool_call>get_weather\n<arg_value>Paris</arg_value>\n</tool_call>", "malformed"),
        ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0{}<|tool_call_end|>",
         "malformed"),
        ("mistral", "[TOOL_CALLS]get_weather[ARGS]{\"city\": ", "malformed"),
        ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.delete_all:0<|tool_call_argument_begin|>"
         "{}<|tool_call_end|><|tool_calls_section_end|>", "undeclared tool: delete_all"),
    ],
)
def test_bad_calls_stay_in_the_content(parser: str, text: str, reason: str) -> None:
    result = parse_tool_calls_detailed(text, parser, TOOLS)
    assert result.content == text and not result.calls
    assert [r.reason.startswith(reason) for r in result.rejected] == [True]


def test_a_malformed_block_keeps_its_valid_neighbour() -> None:
    bad = f"{CALL_BEGIN}get_weather{SEP}{{oops}}{CALL_END}"
    good = f"{CALL_BEGIN}get_weather{SEP}{{\"city\": \"Rome\"}}{CALL_END}"
    result = parse_tool_calls_detailed(f"{CALLS_BEGIN}{bad}{good}{CALLS_END}", "deepseekv31", TOOLS)
    assert (result.content, list(result.calls)) == (bad, [ROME])


def test_glm_values_follow_the_schema() -> None:
    text = ("<tool_call>run_code\n<arg_key>code</arg_key>\n<arg_value>5</arg_value>\n"
            "<arg_key>timeout</arg_key>\n<arg_value>5</arg_value>\n</tool_call>")
    calls = parse_tool_calls_detailed(text, "glm45", TOOLS).calls
    assert json.loads(calls[0].arguments) == {"code": "5", "timeout": 5}


# ------------------------------------------------------------------------------------------ reasoning


@pytest.mark.parametrize(
    ("parser", "text", "opened", "expected"),
    [
        # DeepSeek-V3.1 thinking: the prompt ends with <think>; the block closes before the calls.
        ("deepseek-v3", f"Need Paris.</think>{CALLS_BEGIN}x", True, ("Need Paris.", f"{CALLS_BEGIN}x")),
        # ... and a calls section closes a block the model left open.
        ("deepseek-v3", f"Need Paris.{CALLS_BEGIN}x", True, ("Need Paris.", f"{CALLS_BEGIN}x")),
        # non-thinking: the prompt ends with </think>, so nothing is reasoning.
        ("deepseek-v3", "Paris.", False, (None, "Paris.")),
        ("glm45", "\n<think>Need Paris.</think>\n<tool_call>get_weather", False, ("Need Paris.", "<tool_call>get_weather")),
        ("kimi_k2", "<think>Need Paris.</think><|tool_calls_section_begin|>", False,
         ("Need Paris.", "<|tool_calls_section_begin|>")),
        ("mistral", "[THINK]Need Paris.[/THINK]Paris.", False, ("Need Paris.", "Paris.")),
    ],
)
def test_think_formats(parser: str, text: str, opened: bool, expected: tuple) -> None:
    assert parse_reasoning(text, parser, prompt_opened_think=opened) == expected


def test_harmony_channels() -> None:
    """Analysis is reasoning, a preamble and the final answer are content, a call stays for the
    tool-call parser; the recipient may come before or after the channel."""
    text = ("<|channel|>analysis<|message|>Need the weather.<|end|>"
            "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
            "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
            '{"city": "Paris"}')
    reasoning, content = parse_reasoning(text, "gpt-oss")
    assert reasoning == "Need the weather."
    assert content == ("Checking.<|start|>assistant<|channel|>commentary to=functions.get_weather "
                       '<|constrain|>json<|message|>{"city": "Paris"}<|call|>')
    assert parse_tool_calls_detailed(content, "gpt-oss", TOOLS).calls == (PARIS,)
    assert parse_tool_calls_detailed(content, "gpt-oss", TOOLS).content == "Checking."
    final = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Paris."
    assert parse_reasoning(final, "gpt-oss") == ("Easy.", "Paris.")
    assert parse_reasoning("plain text", "gpt-oss") == (None, "plain text")


# ------------------------------------------------------------------------------------------------ auto


def test_auto_picks_each_family_from_its_published_template() -> None:
    expected = {"deepseek_v3_1": "deepseekv31", "glm4_6": "glm45", "kimi_k2": "kimi_k2", "gpt_oss": "gpt-oss",
                "mistral": "mistral"}
    for family, fam in FAMILIES.items():
        template = (TEMPLATES / fam.template).read_text(encoding="utf-8")
        assert resolve_tool_call_parser("auto", template) == expected[family] == fam.tool_call_parser


def test_auto_on_the_existing_templates() -> None:
    compiler_templates = Path(__file__).parent / "templates"
    found = {path.stem: template_tool_call_parsers(path.read_text(encoding="utf-8"))
             for path in compiler_templates.glob("*.jinja")}
    assert found == {"qwen2_5": ("hermes",), "qwen3": ("hermes",), "llama3_1": ("llama3",),
                     "deepseek_r1": ("deepseekv3",)}
    assert template_tool_call_parsers((TEMPLATES / "chatml_tools.jinja").read_text(encoding="utf-8")) == ("hermes",)


def test_auto_names_the_choices_when_it_cannot_decide() -> None:
    with pytest.raises(ValueError, match="no known tool-call markers.*one of: deepseekv3, deepseekv31"):
        resolve_tool_call_parser("auto", "{{ messages[0].content }}")
    with pytest.raises(ValueError, match=r"several tool-call formats \(kimi_k2, mistral\)"):
        resolve_tool_call_parser("auto", "[TOOL_CALLS] <|tool_calls_section_begin|>")
    assert resolve_tool_call_parser("hermes", "[TOOL_CALLS]") == "hermes"
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        resolve_tool_call_parser("nope", "")
