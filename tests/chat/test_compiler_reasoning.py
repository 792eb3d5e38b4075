"""Reasoning parsers: qwen3, qwen3-thinking, deepseek-r1 (docs/client-quirks.md#unclosed-think-block)."""

from __future__ import annotations

import logging

import pytest

from relaxtrio.chat.parsers import REASONING_PARSERS, parse_reasoning


def test_registered_names() -> None:
    assert REASONING_PARSERS == (
        "deepseek-r1", "deepseek-v3", "glm45", "gpt-oss", "kimi_k2", "mistral", "qwen3", "qwen3-thinking"
    )


@pytest.mark.parametrize(
    ("parser", "text", "kwargs", "expected"),
    [
        # the model opens and closes the block itself
        ("qwen3", "<think>\nR1 step.\n</think>\n\nThe answer.", {}, ("R1 step.", "The answer.")),
        ("qwen3", "  <think>R</think>A", {}, ("R", "A")),
        ("deepseek-r1", "<think>\nR\n</think>\n\nA", {}, ("R", "A")),
        # the prompt opened it: only the close marker is generated
        ("qwen3", "R\n</think>\n\nA", {"prompt_opened_think": True}, ("R", "A")),
        ("qwen3", "R\n</think>\n\nA", {}, ("R", "A")),  # a lone close marker implies it
        ("qwen3-thinking", "R\n</think>\n\nA", {}, ("R", "A")),
        ("deepseek-r1", "Let me think.\n</think>\n\n42", {}, ("Let me think.", "42")),
        # an empty block is no reasoning
        ("qwen3", "<think>\n\n</think>\n\nHello", {}, (None, "Hello")),
        # no block: the text is returned unchanged, whitespace included
        ("qwen3", "  plain answer\n", {}, (None, "  plain answer\n")),
        # a think tag inside an answer is content
        ("qwen3", "Use <think>tags</think> like this.", {}, (None, "Use <think>tags</think> like this.")),
        # only the first close marker ends the block
        ("qwen3", "<think>a</think>b</think>c", {}, ("a", "b</think>c")),
        # Qwen3.5-style: a tool call closes an unclosed block
        ("qwen3", "<think>\nneed data\n<tool_call>{}</tool_call>", {}, ("need data", "<tool_call>{}</tool_call>")),
    ],
)
def test_split(parser: str, text: str, kwargs: dict, expected: tuple) -> None:
    assert parse_reasoning(text, parser, **kwargs) == expected


def test_no_parser_returns_the_text() -> None:
    assert parse_reasoning("<think>x</think>y", None) == (None, "<think>x</think>y")


@pytest.mark.parametrize("finish_type", ["length", "abort"])
@pytest.mark.parametrize(
    ("parser", "text", "prompt_opened"),
    [("deepseek-r1", "Still thinking about", False), ("qwen3", "<think>\nStill thinking about", False),
     ("qwen3", "Still thinking about", True)],
)
def test_truncated_inside_think_is_all_reasoning(parser: str, text: str, prompt_opened: bool, finish_type: str) -> None:
    assert parse_reasoning(text, parser, prompt_opened_think=prompt_opened, finish_type=finish_type) == (
        "Still thinking about",
        "",
    )


def test_stopped_without_close_after_prompt_opened_think_is_content(caplog: pytest.LogCaptureFixture) -> None:
    """The model skipped thinking and ended its turn; the answer is not reasoning."""
    assert parse_reasoning("The capital is Paris.", "deepseek-r1") == (None, "The capital is Paris.")
    assert parse_reasoning("The capital is Paris.", "qwen3", prompt_opened_think=True) == (
        None,
        "The capital is Paris.",
    )
    with caplog.at_level(logging.WARNING, logger="relaxtrio.chat.parsers.reasoning"):
        got = parse_reasoning("The capital is Paris.", "deepseek-r1", unclosed_think="reasoning")
    assert got == ("The capital is Paris.", "")
    assert "not closed" in caplog.text


def test_unknown_names_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        parse_reasoning("x", "qwen4")
    with pytest.raises(ValueError, match="unclosed_think"):
        parse_reasoning("x", "qwen3", unclosed_think="drop")  # type: ignore[arg-type]
