"""Offline tokenizers, template cases and lineage simulation for the compiler tests.

Tokenizers are byte-level BPE models trained in a few milliseconds on a small corpus with the
``tokenizers`` library; each family declares its template markers as added tokens the way the real
model's tokenizer does (special or not), so encoding splits on them exactly as in production.
Nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from relaxtrio import InvalidRequestError
from relaxtrio.chat.compiler import ChatCompiler

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = Path(__file__).resolve().parent / "templates"
SMOLLM2_TEMPLATE = REPO / "relaxtrio" / "chat" / "templates" / "chatml_tools.jinja"

_CORPUS = [
    "You are a helpful assistant. I am a user. You are a terse assistant.",
    "What is the capital of France? Paris. And of Italy? Rome. Thanks! Hi Hello! Bye",
    "Weather in Paris? It is 20C in Paris. And in Rome? Compare a.py and b.py. Reading both files.",
    "The user asks about France. Need weather. Got it. Read both. Check weather too. Greeting.",
    '{"name": "get_weather", "arguments": {"city": "Paris"}} {"type": "function", "function": {}}',
    "# Tools You may call one or more functions to assist with the user query. parameters properties",
    "Cutting Knowledge Date: December 2023 Today Date: 26 Jul 2024 Environment: ipython",
    "def read_file(path: str) -> str: return open(path).read()  # the quick brown fox 0123456789",
]


@attrs.frozen
class Family:
    """Tokenizer family: special tokens (skipped by ``skip_special_tokens``), other added tokens."""

    name: str
    special: tuple[str, ...]
    added: tuple[str, ...] = ()
    bos: str | None = None
    eos: str = "<|im_end|>"
    pad: str | None = None
    prepend_bos: bool = False


FAMILIES = {
    # SmolLM2's tokenizer has only ChatML markers: <tool_call> and <think> are several ordinary tokens.
    "smollm2": Family("smollm2", ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), pad="<|im_end|>"),
    "qwen": Family(
        "qwen",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"),
        pad="<|endoftext|>",
    ),
    "llama3": Family(
        "llama3",
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
         "<|eom_id|>", "<|python_tag|>"),
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
        prepend_bos=True,
    ),
    "deepseek_r1": Family(
        "deepseek_r1",
        tuple(
            f"<｜{name}｜>"
            for name in (
                "begin▁of▁sentence", "end▁of▁sentence", "User", "Assistant", "tool▁calls▁begin", "tool▁calls▁end",
                "tool▁call▁begin", "tool▁call▁end", "tool▁sep", "tool▁outputs▁begin", "tool▁outputs▁end",
                "tool▁output▁begin", "tool▁output▁end",
            )
        ),
        ("<think>", "</think>"),
        bos="<｜begin▁of▁sentence｜>",
        eos="<｜end▁of▁sentence｜>",
        prepend_bos=True,
    ),
}


def build_tokenizer(family: Family, chat_template: str) -> PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer for ``family`` with ``chat_template`` attached."""
    model = Tokenizer(models.BPE())
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=list(family.special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    model.train_from_iterator(_CORPUS, trainer)
    model.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.added])
    if family.prepend_bos:
        assert family.bos is not None
        bos_id = model.token_to_id(family.bos)
        model.post_processor = processors.TemplateProcessing(
            single=f"{family.bos} $A", pair=f"{family.bos} $A {family.bos} $B", special_tokens=[(family.bos, bos_id)]
        )
    else:
        model.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=model, bos_token=family.bos, eos_token=family.eos, pad_token=family.pad
    )
    tokenizer.chat_template = chat_template
    return tokenizer


@attrs.frozen
class TemplateCase:
    """One row of the template matrix."""

    name: str
    family: str
    template: Path
    template_kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    thinks: bool = False  # assistant turns carry reasoning_content
    think_format: str | None = None  # how the model writes reasoning when the template cannot render it
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None


CASES = {
    "smollm2_chatml": TemplateCase("smollm2_chatml", "smollm2", SMOLLM2_TEMPLATE, tool_call_parser="hermes"),
    "qwen2_5": TemplateCase("qwen2_5", "qwen", TEMPLATES / "qwen2_5.jinja", tool_call_parser="qwen25"),
    "qwen3_thinking": TemplateCase(
        "qwen3_thinking",
        "qwen",
        TEMPLATES / "qwen3.jinja",
        thinks=True,
        reasoning_parser="qwen3",
        tool_call_parser="qwen25",
    ),
    "qwen3_no_thinking": TemplateCase(
        "qwen3_no_thinking",
        "qwen",
        TEMPLATES / "qwen3.jinja",
        {"enable_thinking": False},
        reasoning_parser="qwen3",
        tool_call_parser="qwen25",
    ),
    "llama3_1": TemplateCase("llama3_1", "llama3", TEMPLATES / "llama3_1.jinja", tool_call_parser="llama3"),
    "deepseek_r1": TemplateCase(
        "deepseek_r1",
        "deepseek_r1",
        TEMPLATES / "deepseek_r1.jinja",
        thinks=True,
        think_format="{r}\n</think>\n\n{c}",
        reasoning_parser="deepseek-r1",
    ),
}


def make_compiler(case: TemplateCase, **kwargs: Any) -> ChatCompiler:
    return ChatCompiler(build_tokenizer(FAMILIES[case.family], case.template.read_text(encoding="utf-8")), **kwargs)


# ---------------------------------------------------------------------------- conversations

TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
)


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(content: str, reasoning: str | None = None, calls: Sequence[dict] = ()) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = list(calls)
    return message


def tool(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


SYSTEM = {"role": "system", "content": "You are a terse assistant."}

SCENARIOS: dict[str, tuple[tuple[dict[str, Any], ...], bool]] = {
    # name: (messages, uses tools); every conversation ends with an observation (the next prompt)
    "text_multi_turn": (
        (
            SYSTEM,
            {"role": "user", "content": "What is the capital of France?"},
            assistant("Paris.", "The user asks about France."),
            {"role": "user", "content": "And of Italy?"},
            assistant("Rome.", "Italy's capital."),
            {"role": "user", "content": "Thanks!"},
        ),
        False,
    ),
    "tool_round_then_user": (
        (
            SYSTEM,
            {"role": "user", "content": "Weather in Paris?"},
            assistant("", "Need weather.", [call("call_w1", "get_weather", '{"city":"Paris"}')]),
            tool("call_w1", '{"temp":"20C"}'),
            assistant("It is 20C in Paris.", "Got it."),
            {"role": "user", "content": "And in Rome?"},
        ),
        True,
    ),
    "parallel_and_empty_results": (
        (
            SYSTEM,
            {"role": "user", "content": "Compare a.py and b.py."},
            assistant(
                "Reading both files.",
                "Read both.",
                [call("call_a", "read_file", '{"path":"a.py"}'), call("call_b", "read_file", '{"path":"b.py"}')],
            ),
            tool("call_a", "A"),
            tool("call_b", "B"),
            assistant("", "Check weather too.", [call("call_w2", "get_weather", '{"city":"Rome"}')]),
            tool("call_w2", ""),
        ),
        True,
    ),
    "no_system": (
        (
            {"role": "user", "content": "Hi"},
            assistant("Hello!", "Greeting."),
            {"role": "user", "content": "Bye"},
        ),
        False,
    ),
}


def scenario(case: TemplateCase, name: str) -> tuple[list[dict[str, Any]], tuple[dict[str, Any], ...]]:
    """Messages (reasoning removed for non-thinking cases) and tools of a scenario."""
    messages, uses_tools = SCENARIOS[name]
    out = []
    for message in messages:
        copy = dict(message)
        if not case.thinks:
            copy.pop("reasoning_content", None)
        out.append(copy)
    return out, (TOOLS if uses_tools else ())


# ---------------------------------------------------------------------------- lineage simulation


def rendered_turn_ids(
    compiler: ChatCompiler, messages: Sequence[Mapping[str, Any]], index: int, tools: Sequence[Mapping], kwargs: Mapping
) -> tuple[int, ...] | None:
    """Ids of ``messages[index]`` (an assistant turn) as a full render places them after the
    generation prompt, up to and including the first stop id; None when the generation prompt is
    not a prefix of that render."""
    try:
        prompt = compiler.render(messages[:index], tools, kwargs, add_generation_prompt=True).token_ids
        rendered = compiler.render(messages[: index + 1], tools, kwargs, add_generation_prompt=False).token_ids
    except InvalidRequestError:
        return None  # the template cannot render this history (e.g. Llama 3.1 with two calls)
    if rendered[: len(prompt)] != prompt:
        return None
    rest = rendered[len(prompt) :]
    stops = set(compiler.stop_token_ids)
    for k, token in enumerate(rest):
        if token in stops:
            return rest[: k + 1]
    return rest


def model_output_ids(compiler: ChatCompiler, case: TemplateCase, message: Mapping[str, Any]) -> tuple[int, ...]:
    """What the model samples for ``message`` when the template cannot show it (text + EOS).

    Llama 3 writes calls as JSON after ``<|python_tag|>``; DeepSeek-R1's own call markup is not
    simulated (its template never renders canonical calls), so its turns are text only."""
    text = message["content"]
    calls = message.get("tool_calls") or []
    if calls and case.family == "llama3":
        json_calls = "; ".join(
            f'{{"name": "{c["function"]["name"]}", "parameters": {c["function"]["arguments"]}}}' for c in calls
        )
        text = f"{text}<|python_tag|>{json_calls}" if text else json_calls
    if case.think_format and message.get("reasoning_content"):
        text = case.think_format.format(r=message["reasoning_content"], c=text)
    ids = compiler.tokenizer.encode(text, add_special_tokens=False)
    assert compiler.turn_end_token_id is not None
    return (*ids, compiler.turn_end_token_id)


def lineage_ids(
    compiler: ChatCompiler,
    case: TemplateCase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping],
    generated: Callable[[int], tuple[int, ...]] | None = None,
) -> tuple[int, ...]:
    """What relaxtrio feeds the engine for the next turn: full render up to the first assistant
    turn, then for each assistant turn its sampled ids followed by the compiler's observation delta."""
    kwargs = case.template_kwargs
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = list(compiler.render(messages[:first], tools, kwargs).token_ids)
    i = first
    while i < len(messages):
        if generated is not None:
            turn = generated(i)
        else:
            turn = rendered_turn_ids(compiler, messages, i, tools, kwargs)
            turn = turn or model_output_ids(compiler, case, messages[i])
        ids.extend(turn)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if j > i + 1:
            ids.extend(compiler.render_delta(messages[i + 1 : j], tools, kwargs).token_ids)
        i = j
    return tuple(ids)
