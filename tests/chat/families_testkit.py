"""Offline tokenizers and conversations for the model-family tests (tests/chat).

No tokenizer of these families ships on PyPI in a form transformers loads offline (mistral-common's
Tekken files pin numpy below our pin; openai-harmony downloads its vocabulary at run time), so each
family gets a small byte-level BPE trained in milliseconds with the family's special tokens added
the way its tokenizer declares them. Token-exactness is then checked where it can go wrong: every
special token is one id, and the text between special tokens is encoded on its own
(:func:`reference_ids`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from relaxtrio import InvalidRequestError
from relaxtrio.chat.compiler import ChatCompiler

TEMPLATES = Path(__file__).resolve().parents[2] / "relaxtrio" / "chat" / "templates"

_CORPUS = [
    "You are a terse assistant. Weather in Paris and Rome? It is 20C in Paris and 18C in Rome.",
    '{"city": "Paris"} {"code": "if (a) { print(\\"}\\") }"} get_weather run_code city code',
    "Need both cities. Both answered. The user wants the weather. Thanks! Bye",
]


@attrs.frozen
class Family:
    """One model family: template file, special tokens, EOS and the parsers to use."""

    name: str
    template: str
    special: tuple[str, ...]
    eos: str
    bos: str | None = None
    tool_call_parser: str = ""
    reasoning_parser: str | None = None

    def compiler(self) -> ChatCompiler:
        return ChatCompiler(build_tokenizer(self))


def _ds(name: str) -> str:
    return f"<｜{name}｜>"


FAMILIES = {
    "deepseek_v3_1": Family(
        "deepseek_v3_1", "deepseek_v3_1.jinja",
        tuple(_ds(n) for n in ("begin▁of▁sentence", "end▁of▁sentence", "User", "Assistant", "tool▁calls▁begin",
                               "tool▁calls▁end", "tool▁call▁begin", "tool▁call▁end", "tool▁sep",
                               "tool▁output▁begin", "tool▁output▁end")) + ("<think>", "</think>"),
        eos=_ds("end▁of▁sentence"), bos=_ds("begin▁of▁sentence"),
        tool_call_parser="deepseekv31", reasoning_parser="deepseek-v3",
    ),
    "glm4_6": Family(
        "glm4_6", "glm4_6.jinja",
        ("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<|endoftext|>",
         "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
         "</arg_value>", "<tool_response>", "</tool_response>"),
        eos="<|endoftext|>", tool_call_parser="glm45", reasoning_parser="glm45",
    ),
    "kimi_k2": Family(
        "kimi_k2", "kimi_k2_thinking.jinja",
        ("<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
         "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
         "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<think>", "</think>"),
        eos="<|im_end|>", tool_call_parser="kimi_k2", reasoning_parser="kimi_k2",
    ),
    "gpt_oss": Family(
        "gpt_oss", "gpt_oss.jinja",
        ("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>", "<|end|>",
         "<|message|>", "<|call|>"),
        eos="<|return|>", tool_call_parser="gpt-oss", reasoning_parser="gpt-oss",
    ),
    "mistral": Family(
        "mistral", "mistral_small_3_2.jinja",
        ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
         "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[CALL_ID]", "[ARGS]",
         "[TOOL_CONTENT]", "[THINK]", "[/THINK]"),
        eos="</s>", bos="<s>", tool_call_parser="mistral", reasoning_parser="mistral",
    ),
}


def build_tokenizer(family: Family) -> PreTrainedTokenizerFast:
    """A byte-level BPE with ``family``'s special tokens and its published template."""
    model = Tokenizer(models.BPE())
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    model.train_from_iterator(_CORPUS, trainer)
    model.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in family.special])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, bos_token=family.bos, eos_token=family.eos)
    tokenizer.chat_template = (TEMPLATES / family.template).read_text(encoding="utf-8")
    return tokenizer


def reference_ids(compiler: ChatCompiler, family: Family, text: str) -> list[int]:
    """Ids of ``text`` built by hand: one id per special token, the rest encoded piecewise."""
    tokenizer = compiler.tokenizer
    ids: list[int] = []
    position = 0
    while position < len(text):
        hits = [(text.find(t, position), t) for t in family.special if text.find(t, position) >= 0]
        start, token = min(hits, key=lambda hit: (hit[0], -len(hit[1]))) if hits else (len(text), "")
        if start > position:
            ids.extend(tokenizer.backend_tokenizer.encode(text[position:start], add_special_tokens=False).ids)
        if token:
            ids.append(tokenizer.convert_tokens_to_ids(token))
        position = start + len(token) if token else len(text)
    return ids


# ---------------------------------------------------------------------------------- conversation

# Canonical order (name, parameters, description): what relaxtrio hands templates that print the
# tool list as JSON (Kimi-K2, GLM, Mistral).
TOOLS = (
    {"type": "function", "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "description": "Current weather of a city."}},
    {"type": "function", "function": {
        "name": "run_code",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}, "timeout": {"type": "integer"}},
                       "required": ["code"]},
        "description": "Runs code."}},
)
TRICKY_CODE = 'if (a) { print("}") }'
"""An argument with braces and quotes, the text call parsers most often cut at the wrong brace."""


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def conversation(ids: Sequence[str], *, reasoning: bool, parallel: bool = True) -> list[dict[str, Any]]:
    """system, user, assistant (calls), tool results, assistant (call), tool, assistant, user.

    Args:
        ids: the four call ids to use (templates that render ids need the model's form).
        reasoning: assistant turns carry ``reasoning_content``.
        parallel: the first turn makes two calls (gpt-oss's template renders one call per turn).
    """
    first_calls = [call(ids[0], "get_weather", '{"city":"Paris"}')]
    if parallel:
        first_calls.append(call(ids[1], "get_weather", '{"city":"Rome"}'))

    def assistant(content: str, think: str, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = think
        if calls:
            message["tool_calls"] = calls
        return message

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        assistant("", "Need both cities.", first_calls),
        {"role": "tool", "tool_call_id": ids[0], "content": '{"temp": "20C"}'},
    ]
    if parallel:
        messages.append({"role": "tool", "tool_call_id": ids[1], "content": '{"temp": "18C"}'})
    messages += [
        assistant("", "Check with code.", [call(ids[2], "run_code", '{"code":' + _json(TRICKY_CODE) + ',"timeout":5}')]),
        {"role": "tool", "tool_call_id": ids[2], "content": "}"},
        assistant("It is 20C in Paris and 18C in Rome.", "Both answered."),
        {"role": "user", "content": "Thanks!"},
    ]
    return messages


def _json(value: str) -> str:
    import json

    return json.dumps(value)


def rendered_turn(
    compiler: ChatCompiler, messages: Sequence[Mapping[str, Any]], index: int, kwargs: Mapping[str, Any] | None = None
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``(prompt_ids, turn_ids)``: the generation prompt before ``messages[index]`` and the ids a
    full render places after it, through the first stop id (what the model samples); None when
    the prompt is not a prefix of that render."""
    try:
        prompt = compiler.render(messages[:index], TOOLS, kwargs).token_ids
        full = compiler.render(messages[: index + 1], TOOLS, kwargs, add_generation_prompt=False).token_ids
    except InvalidRequestError:
        return None
    if full[: len(prompt)] != prompt:
        return None
    rest = full[len(prompt) :]
    stops = set(compiler.stop_token_ids)
    end = next((k + 1 for k, token in enumerate(rest) if token in stops), len(rest))
    return prompt, rest[:end]
