"""``--agentic-tool-call-parser auto``: pick the parser from the markers in the chat template.

Each family's published template writes its own call syntax into history (and usually into the
tool instructions), so the template text names the format the model was trained on. A parser is
picked only when exactly one family's markers are present, after the generic ``<tool_call>``
(hermes) gives way to the families that reuse that tag (Qwen3-Coder, GLM-4.5) and DeepSeek-V3.1
gives way to V3 (whose template also writes the fenced JSON form).
"""

from __future__ import annotations

from typing import Final

_MARKERS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    # (parser, markers that must all appear in the template)
    ("gpt-oss", ("<|channel|>", "<|call|>")),
    ("kimi_k2", ("<|tool_calls_section_begin|>",)),
    ("deepseekv3", ("<｜tool▁sep｜>", "```json")),
    ("deepseekv31", ("<｜tool▁sep｜>",)),
    ("glm45", ("<arg_key>",)),
    ("mistral", ("[TOOL_CALLS]",)),
    ("qwen3_coder", ("<function=",)),
    ("llama3", ("<|python_tag|>",)),
    ("llama3", ('"parameters": dictionary of argument name',)),
    ("hermes", ("<tool_call>",)),
)
_GIVES_WAY: Final[dict[str, frozenset[str]]] = {
    "hermes": frozenset({"qwen3_coder", "glm45"}),
    "deepseekv31": frozenset({"deepseekv3"}),
}


def template_tool_call_parsers(chat_template: str) -> tuple[str, ...]:
    """Every parser whose markers ``chat_template`` contains, after the precedence rules (sorted)."""
    found = {parser for parser, markers in _MARKERS if all(marker in chat_template for marker in markers)}
    return tuple(sorted(p for p in found if not (_GIVES_WAY.get(p, frozenset()) & found)))


def detect_tool_call_parser(chat_template: str, choices: tuple[str, ...]) -> str:
    """The tool-call parser for ``chat_template`` (``--agentic-tool-call-parser auto``).

    Args:
        chat_template: the template's Jinja source.
        choices: the parser names to list in the error.

    Raises:
        ValueError: no family's markers, or several, are in the template; the message names what
            was found and the choices.
    """
    found = template_tool_call_parsers(chat_template)
    if len(found) == 1:
        return found[0]
    listed = ", ".join(name for name in choices if name != "auto")
    if not found:
        raise ValueError(
            "--agentic-tool-call-parser auto: the chat template has no known tool-call markers; "
            f"name the parser with --agentic-tool-call-parser, one of: {listed}"
        )
    raise ValueError(
        f"--agentic-tool-call-parser auto: the chat template matches several tool-call formats "
        f"({', '.join(found)}); name one with --agentic-tool-call-parser, one of: {listed}"
    )
