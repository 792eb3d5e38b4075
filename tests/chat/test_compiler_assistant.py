"""decode_assistant: decode rules (docs/canonical-contract.md#decoding-a-reply)."""

from __future__ import annotations

import pytest
from tests.chat.compiler_testkit import TOOLS

from relaxtrio import BackendError, EmptyReplyError, InternalError
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.chat.parsers import (
    decode_assistant,
    effective_finish_type,
    tool_call_id,
)

PARENT = "0" * 64
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture
def qwen(compilers: dict[str, ChatCompiler]) -> ChatCompiler:
    return compilers["qwen3_thinking"]


def ids_of(compiler: ChatCompiler, text: str, *, eos: bool = True) -> tuple[int, ...]:
    ids = tuple(compiler.tokenizer.encode(text, add_special_tokens=False))
    return (*ids, compiler.turn_end_token_id) if eos else ids


def build(compiler: ChatCompiler, ids: tuple[int, ...], finish: str = "stop", **kwargs: object) -> tuple[dict, str]:
    """``(message, finish_reason)`` of :func:`decode_assistant`, what a turn commits."""
    options = {"reasoning_parser": "qwen3", "tool_call_parser": "qwen25", "tools": TOOLS} | kwargs
    decoded = decode_assistant(
        ids, finish, compiler=compiler, parent_state_hash=PARENT, stop_token_ids=compiler.stop_token_ids, **options
    )
    return dict(decoded.message), decoded.finish_reason


def test_plain_answer_without_eos_text(qwen: ChatCompiler) -> None:
    ids = ids_of(qwen, "Paris is the capital.")
    message, reason = build(qwen, ids)
    assert message == {"role": "assistant", "content": "Paris is the capital."}
    assert reason == "stop"
    assert "<|im_end|>" not in message["content"]


def test_reasoning_and_parallel_calls(qwen: ChatCompiler) -> None:
    text = f"<think>\nNeed two cities.\n</think>\n\n{CALL}\n{CALL.replace('Paris', 'Rome')}"
    ids = ids_of(qwen, text)
    message, reason = build(qwen, ids)
    assert reason == "tool_calls"
    assert message == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Need two cities.",
        "tool_calls": [
            {"id": tool_call_id(PARENT, ids, 0), "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": tool_call_id(PARENT, ids, 1), "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
        ],
    }
    again, _ = build(qwen, ids)
    assert again == message  # call ids are deterministic
    other = decode_assistant(
        ids, "stop", compiler=qwen, parent_state_hash="1" * 64, stop_token_ids=qwen.stop_token_ids,
        tool_call_parser="qwen25", reasoning_parser="qwen3", tools=TOOLS,
    ).message
    assert other["tool_calls"][0]["id"] != message["tool_calls"][0]["id"]


def test_reasoning_only_gives_empty_content(qwen: ChatCompiler) -> None:
    message, reason = build(qwen, ids_of(qwen, "<think>\nHmm.\n</think>\n\n"))
    assert message == {"role": "assistant", "content": "", "reasoning_content": "Hmm."}
    assert reason == "stop"


def test_stop_string_is_cut_from_content_but_ids_stay(qwen: ChatCompiler) -> None:
    ids = ids_of(qwen, "Answer: 4\nObservation:", eos=False)
    decoded = decode_assistant(
        ids, "stop", compiler=qwen, parent_state_hash=PARENT, stop_token_ids=qwen.stop_token_ids,
        matched_stop="Observation:",
    )
    assert decoded.message["content"] == "Answer: 4\n"
    assert decoded.text == "Answer: 4\n"
    assert qwen.decode(ids).endswith("Observation:")  # the ids were not touched


@pytest.mark.parametrize(("text", "stop", "content"), [
    ("Paris is the capital.", " ", "Paris"),  # the stop string starts a token and ends inside it
    ("Paris is the capital.", "s th", "Paris i"),  # it starts inside one token and ends in another
])
def test_a_stop_string_inside_a_token_is_cut_at_its_first_character(
        qwen: ChatCompiler, text: str, stop: str, content: str) -> None:
    """An engine stops after the token that completes a stop string, which may go on past it: the
    content ends where the string starts, and the ids keep the whole sampled token."""
    ids = ids_of(qwen, text, eos=False)
    pieces = [qwen.decode([i]) for i in ids]
    end = next(k for k in range(len(ids)) if stop in "".join(pieces[: k + 1]))
    assert not "".join(pieces[: end + 1]).endswith(stop)  # the last token goes on past the stop
    sampled = ids[: end + 1]  # what the engine returns: through the token that completed the stop
    decoded = decode_assistant(sampled, "stop", compiler=qwen, parent_state_hash=PARENT,
                               stop_token_ids=qwen.stop_token_ids, matched_stop=stop)
    assert decoded.message["content"] == decoded.text == content
    assert qwen.decode(sampled).startswith(content + stop)


def test_matched_stop_token_id_is_left_out_of_the_text(qwen: ChatCompiler) -> None:
    stop_id = qwen.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids = (*ids_of(qwen, "Done.", eos=False), stop_id)
    message, _ = build(qwen, ids, matched_stop=stop_id)
    assert message["content"] == "Done."


def test_special_tokens_inside_the_output_are_kept_and_ids_untouched(qwen: ChatCompiler) -> None:
    """A stray special token mid-output appears in the text; the function never edits ids
    (docs/client-quirks.md#special-tokens-inside-the-output)."""
    ids = ids_of(qwen, "Part one<|endoftext|>part two")
    frozen = tuple(ids)
    decoded = decode_assistant(ids, "stop", compiler=qwen, parent_state_hash=PARENT, stop_token_ids=qwen.stop_token_ids)
    assert decoded.message["content"] == "Part one<|endoftext|>part two"
    assert ids == frozen


def test_length_keeps_finish_and_does_not_execute_calls(qwen: ChatCompiler) -> None:
    """A cut-off turn reports length; complete call blocks in it stay text ("tool_calls" iff calls)."""
    ids = ids_of(qwen, f"{CALL}\nand then", eos=False)
    message, reason = build(qwen, ids, "length")
    assert reason == "length"
    assert "tool_calls" not in message
    assert message["content"] == f"{CALL}\nand then"
    thinking, reason = build(qwen, ids_of(qwen, "<think>\nstill going", eos=False), "length")
    assert thinking == {"role": "assistant", "content": "", "reasoning_content": "still going"}
    assert reason == "length"


def test_malformed_call_is_content_and_finish_stop(qwen: ChatCompiler) -> None:
    """The reply is the verbatim text, finish stop, and the rejection is reported
    (docs/client-quirks.md#malformed-tool-call-blocks)."""
    bad = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}}\n</tool_call>'
    decoded = decode_assistant(
        ids_of(qwen, bad), "stop", compiler=qwen, parent_state_hash=PARENT, stop_token_ids=qwen.stop_token_ids,
        tool_call_parser="qwen25", tools=TOOLS,
    )
    assert decoded.message == {"role": "assistant", "content": bad}
    assert decoded.finish_reason == "stop"
    assert decoded.rejected_tool_calls[0].text == bad


def test_calls_are_not_parsed_without_tools(qwen: ChatCompiler) -> None:
    message, reason = build(qwen, ids_of(qwen, CALL), tools=())
    assert message == {"role": "assistant", "content": CALL}
    assert reason == "stop"


def test_prompt_opened_think_and_b15_default(compilers: dict[str, ChatCompiler]) -> None:
    r1 = compilers["deepseek_r1"]
    message, reason = build(r1, ids_of(r1, "Let me see.\n</think>\n\n42"), reasoning_parser="deepseek-r1", tools=())
    assert message == {"role": "assistant", "content": "42", "reasoning_content": "Let me see."}
    # stopped on EOS without </think>: an answer, not reasoning (docs/client-quirks.md#unclosed-think-block)
    message, reason = build(r1, ids_of(r1, "The capital is Paris."), reasoning_parser="deepseek-r1", tools=())
    assert message == {"role": "assistant", "content": "The capital is Paris."}
    assert reason == "stop"


def test_empty_outputs_are_errors_not_commits(qwen: ChatCompiler) -> None:
    with pytest.raises(BackendError, match="without output tokens") as no_ids:
        build(qwen, ())
    assert not isinstance(no_ids.value, EmptyReplyError)
    with pytest.raises(EmptyReplyError, match="empty assistant message"):
        build(qwen, (qwen.turn_end_token_id,))  # only the end-of-turn token
    with pytest.raises(EmptyReplyError, match="empty assistant message"):
        build(qwen, ids_of(qwen, "<think>\n\n</think>\n\n"))


def test_eos_in_the_abort_step_counts_as_stop(qwen: ChatCompiler) -> None:
    """An abort that arrives together with a sampled EOS is a finished turn
    (docs/client-quirks.md#a-token-after-the-abort)."""
    ids = ids_of(qwen, "Finished.")
    assert effective_finish_type(ids, "abort", qwen.stop_token_ids) == "stop"
    assert effective_finish_type(ids[:-1], "abort", qwen.stop_token_ids) == "abort"
    assert effective_finish_type(ids, "length", qwen.stop_token_ids) == "length"
    assert effective_finish_type((), "abort", qwen.stop_token_ids) == "abort"
    message, reason = build(qwen, ids, "abort")
    assert (message["content"], reason) == ("Finished.", "stop")
    with pytest.raises(InternalError, match="aborted"):
        build(qwen, ids[:-1], "abort")
    with pytest.raises(ValueError, match="finish type"):
        effective_finish_type(ids, "eos", qwen.stop_token_ids)


def test_llama3_message_from_sampled_ids(compilers: dict[str, ChatCompiler]) -> None:
    llama = compilers["llama3_1"]
    text = 'Checking.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}'
    message, reason = build(llama, ids_of(llama, text), reasoning_parser=None, tool_call_parser="llama3")
    assert reason == "tool_calls"
    assert message["content"] == "Checking."
    assert message["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city":"Oslo"}'}
