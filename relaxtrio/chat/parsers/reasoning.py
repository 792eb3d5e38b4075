"""Reasoning parsers (``--agentic-reasoning-parser``): split a think block off the decoded text.

Supported names (SGLang's spellings):

========================  ====================================================================
``qwen3``                 ``<think>…</think>`` that the model opens itself; also used when the
                          prompt opened the block (pass ``prompt_opened_think=True``, or a
                          ``</think>`` with no ``<think>`` before it implies it). An unclosed
                          block is closed implicitly by ``<tool_call>`` (Qwen3.5 does this).
``qwen3-thinking``        as ``qwen3``, but the prompt always opens the block (Qwen3 *-Thinking*
                          templates end the generation prompt with ``<think>\\n``).
``deepseek-r1``           the prompt always opens the block (R1 templates end the generation
                          prompt with ``<think>\\n``); a leading ``<think>`` is tolerated.
``deepseek-v3``           DeepSeek-V3.1: the prompt ends with ``<think>`` in thinking mode and
                          with ``</think>`` otherwise, so the block counts only when the prompt
                          opened it (or a ``</think>`` implies it); ``<｜tool▁calls▁begin｜>``
                          closes an unclosed block.
``glm45``                 GLM-4.5/4.6: as ``qwen3`` (the model opens ``<think>`` itself).
``kimi_k2``               Kimi-K2-Thinking: as ``qwen3``; ``<|tool_calls_section_begin|>`` closes
                          an unclosed block.
``mistral``               Magistral ``[THINK]…[/THINK]``; ``[TOOL_CALLS]`` closes an unclosed block.
``gpt-oss``               harmony channels: analysis messages are the reasoning, final and
                          preamble messages the content (:mod:`._harmony`).
========================  ====================================================================

Only a block at the very start of the text (after whitespace) counts; a ``<think>`` in the middle
of an answer is left in the content. Reasoning and content are stripped of surrounding whitespace
(the Qwen3 template strips them the same way when it renders history).

Unclosed blocks (docs/client-quirks.md#unclosed-think-block), decided from the stop reason:

* finish ``length`` (or ``abort``): generation was cut inside the block, so all of it is reasoning;
* finish ``stop`` with no ``</think>``: the model ended its turn without closing the block. This is
  usually a model that skipped thinking after a prompt-opened block, so by default the text is the
  content (``unclosed_think="content"``); ``unclosed_think="reasoning"`` keeps the truncated-reasoning
  reading, and logs a warning because the answer then has empty content.
"""

from __future__ import annotations

import logging
from typing import Final, Literal

import attrs

from ._harmony import parse_harmony_reasoning

__all__ = ["REASONING_PARSERS", "UnclosedThinkPolicy", "parse_reasoning"]

logger = logging.getLogger(__name__)

UnclosedThinkPolicy = Literal["content", "reasoning"]


@attrs.frozen
class _ThinkFormat:
    start: str
    end: str
    prompt_always_opens: bool
    interrupt: str | None


_FORMATS: Final[dict[str, _ThinkFormat]] = {
    "qwen3": _ThinkFormat("<think>", "</think>", prompt_always_opens=False, interrupt="<tool_call>"),
    "qwen3-thinking": _ThinkFormat("<think>", "</think>", prompt_always_opens=True, interrupt="<tool_call>"),
    "deepseek-r1": _ThinkFormat("<think>", "</think>", prompt_always_opens=True, interrupt=None),
    "deepseek-v3": _ThinkFormat("<think>", "</think>", prompt_always_opens=False, interrupt="<｜tool▁calls▁begin｜>"),
    "glm45": _ThinkFormat("<think>", "</think>", prompt_always_opens=False, interrupt="<tool_call>"),
    "kimi_k2": _ThinkFormat(
        "<think>", "</think>", prompt_always_opens=False, interrupt="<|tool_calls_section_begin|>"
    ),
    "mistral": _ThinkFormat("[THINK]", "[/THINK]", prompt_always_opens=False, interrupt="[TOOL_CALLS]"),
}
_HARMONY: Final = "gpt-oss"

REASONING_PARSERS: Final[tuple[str, ...]] = tuple(sorted([*_FORMATS, _HARMONY]))
"""Names accepted by ``--agentic-reasoning-parser``."""


def reasoning_format(parser: str) -> _ThinkFormat:
    """The think markers of ``parser``.

    Raises:
        ValueError: unknown parser name.
    """
    try:
        return _FORMATS[parser]
    except KeyError:
        raise ValueError(
            f"unknown reasoning parser {parser!r}; expected one of: {', '.join(REASONING_PARSERS)}"
        ) from None


def parse_reasoning(
    text: str,
    parser: str | None,
    *,
    prompt_opened_think: bool = False,
    finish_type: str = "stop",
    unclosed_think: UnclosedThinkPolicy = "content",
) -> tuple[str | None, str]:
    """Splits reasoning from content.

    Args:
        text: decoded model output, end-of-turn token and stop string already removed.
        parser: a name from :data:`REASONING_PARSERS`, or None for no parsing.
        prompt_opened_think: the generation prompt ended inside an opened think block.
        finish_type: ``"stop"``, ``"length"`` or ``"abort"`` (after the EOS-after-abort fix).
        unclosed_think: what a stopped generation with an unclosed block is (see module doc).

    Returns:
        ``(reasoning, content)``: reasoning is None when empty; without a think block the content
        is ``text`` unchanged.

    Raises:
        ValueError: unknown parser name or policy.
    """
    if parser is None:
        return None, text
    if parser == _HARMONY:
        return parse_harmony_reasoning(text, cut=finish_type == "length")
    fmt = reasoning_format(parser)
    if unclosed_think not in ("content", "reasoning"):
        raise ValueError(f"unclosed_think must be 'content' or 'reasoning', got {unclosed_think!r}")

    body = text.lstrip()
    if body.startswith(fmt.start):
        while body.startswith(fmt.start):
            body = body[len(fmt.start) :]
    elif fmt.prompt_always_opens or prompt_opened_think:
        body = text
    elif fmt.end in text and fmt.start not in text[: text.find(fmt.end)]:
        body = text  # a close marker with no open one before it: the prompt opened the block
    else:
        return None, text

    end = body.find(fmt.end)
    if end >= 0:
        reasoning, content = body[:end], body[end + len(fmt.end) :]
    elif fmt.interrupt is not None and fmt.interrupt in body:
        cut = body.find(fmt.interrupt)
        reasoning, content = body[:cut], body[cut:]
    elif finish_type != "stop" or unclosed_think == "reasoning":
        reasoning, content = body, ""
        if finish_type == "stop":
            logger.warning("think block not closed before the model stopped; returning it as reasoning (empty content)")
    else:
        reasoning, content = "", body
    return (reasoning.strip() or None), content.strip()
