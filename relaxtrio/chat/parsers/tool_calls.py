"""Tool-call parsers (``--agentic-tool-call-parser``) and deterministic call ids.

Supported names:

===============================  ==============================================================
``hermes``, ``qwen25``, ``qwen``  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
                                  blocks (``"parameters"`` accepted for ``"arguments"``; a JSON
                                  list in one block gives several calls)
``qwen3_coder``                   ``<tool_call>\\n<function=name>\\n<parameter=p>\\nvalue\\n</parameter>
                                  \\n</function>\\n</tool_call>``; values converted by the tool's
                                  JSON-schema types
``llama3``                        ``{"name": ..., "parameters": {...}}`` at the start of the text or
                                  after ``<|python_tag|>``, several separated by ``;``
``deepseekv3``, ``deepseekv31``   DeepSeek-V3/R1 and V3.1 ``<｜tool▁calls▁begin｜>`` sections (one
                                  parser reads both spellings; :mod:`._families`)
``glm45``                         GLM-4.5/4.6 ``<tool_call>NAME`` + ``<arg_key>``/``<arg_value>``
``kimi_k2``                       Kimi-K2 ``<|tool_calls_section_begin|>`` sections; the model's
                                  ``functions.NAME:IDX`` is kept as the call id
``mistral``                       ``[TOOL_CALLS]`` + JSON list, or ``NAME[CALL_ID]ID[ARGS]JSON`` per
                                  call; call ids are 9 alphanumerics as Mistral templates require
``gpt-oss``                       harmony messages addressed to ``functions.NAME`` (:mod:`._harmony`;
                                  use it with the ``gpt-oss`` reasoning parser)
``auto``                          the parser whose markers the chat template contains
                                  (:func:`~._detect.detect_tool_call_parser`)
===============================  ==============================================================

Rules, identical for every format:

* parsing happens only when the subtree has tools; otherwise the text is returned unchanged;
* a malformed block (bad JSON, missing name, stray text inside the block, an unclosed tag) stays in
  the content verbatim, while the valid blocks around it are returned as calls
  (docs/client-quirks.md#malformed-tool-call-blocks);
* **undeclared tool names**: the block is left in the content as text (it is not a call the agent
  can run), exactly like a malformed block, and is reported as rejected; every rejected block is
  logged (a warning naming the reason and the declared tools), also when it was the reply's
  only call and the agent gets plain text with ``finish_reason`` ``stop``;
* when at least one call is returned, the call blocks (and their separators) are removed from the
  content, which is then stripped of surrounding whitespace; when none is returned the content is
  the input text unchanged;
* call ids: the id the model wrote when its format carries one (Kimi-K2, Mistral ``[CALL_ID]``),
  else :func:`tool_call_id` (Mistral: its first 9 hex digits, see :func:`call_id_for`);
* arguments are returned as canonical JSON object text (compact, sorted keys, integral floats as
  ints; see :func:`~._json.canonical_arguments`).

SGLang's non-streaming parsers differ in two ways on purpose: they drop the text after the first
call marker, and they drop undeclared calls together with their text; relaxtrio loses neither.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs

from ._detect import detect_tool_call_parser
from ._families import split_deepseek, split_glm45, split_kimi_k2, split_mistral
from ._formats import Candidate, Marker, Segment, split_hermes, split_llama3, split_qwen3_coder
from ._harmony import split_harmony
from ._json import canonical_arguments

__all__ = [
    "TOOL_CALL_PARSERS",
    "ParsedToolCall",
    "RejectedToolCall",
    "ToolCallParse",
    "call_id_for",
    "check_tool_call_parser",
    "parse_tool_calls",
    "parse_tool_calls_detailed",
    "resolve_tool_call_parser",
    "tool_call_id",
]

logger = logging.getLogger(__name__)

_Splitter = Callable[[str, Mapping[str, Mapping[str, Any]]], list[Segment]]

_SPLITTERS: Final[dict[str, _Splitter]] = {
    "hermes": split_hermes,
    "qwen25": split_hermes,
    "qwen": split_hermes,
    "qwen3_coder": split_qwen3_coder,
    "llama3": split_llama3,
    "deepseekv3": split_deepseek,
    "deepseekv31": split_deepseek,
    "glm45": split_glm45,
    "kimi_k2": split_kimi_k2,
    "mistral": split_mistral,
    "gpt-oss": split_harmony,
}

AUTO: Final = "auto"
"""``--agentic-tool-call-parser auto``: resolved from the chat template before parsing."""

TOOL_CALL_PARSERS: Final[tuple[str, ...]] = (*sorted(_SPLITTERS), AUTO)
"""Names accepted by ``--agentic-tool-call-parser``."""

_SHORT_IDS: Final = frozenset({"mistral"})
"""Parsers whose templates require 9-character alphanumeric call ids."""


@attrs.frozen
class ParsedToolCall:
    """One call the model made.

    Attributes:
        name: a tool name declared in the request.
        arguments: canonical JSON object text (``{"city":"Paris"}``).
        call_id: the id the model wrote for the call, or None when its format has none.
    """

    name: str
    arguments: str
    call_id: str | None = None


@attrs.frozen
class RejectedToolCall:
    """A call-shaped piece of text left in the content, and why.

    Attributes:
        text: the verbatim text, as it appears in the content.
        reason: ``"malformed: ..."`` or ``"undeclared tool: <name>"``.
    """

    text: str
    reason: str


@attrs.frozen
class ToolCallParse:
    """Result of one parse.

    Attributes:
        content: the text left for ``message.content``.
        calls: the returned calls, in text order.
        rejected: call-shaped text kept in the content (the parse status to record on the node).
    """

    content: str
    calls: tuple[ParsedToolCall, ...]
    rejected: tuple[RejectedToolCall, ...]


def check_tool_call_parser(parser: str) -> None:
    """Raises ValueError when ``parser`` is not a name in :data:`TOOL_CALL_PARSERS` (``auto``
    included: it must be resolved against a chat template before parsing)."""
    if parser not in _SPLITTERS and parser != AUTO:
        raise ValueError(f"unknown tool-call parser {parser!r}; expected one of: {', '.join(TOOL_CALL_PARSERS)}")


def resolve_tool_call_parser(parser: str | None, chat_template: str) -> str | None:
    """``parser`` itself, or for ``auto`` the parser the chat template's markers name.

    Raises:
        ValueError: an unknown name, or ``auto`` with a template that names no format or several
            (the message lists the choices).
    """
    if parser is None:
        return None
    check_tool_call_parser(parser)
    return detect_tool_call_parser(chat_template, TOOL_CALL_PARSERS) if parser == AUTO else parser


def _declared_tools(tools: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Tool name → JSON-schema ``parameters`` of the canonical function tools."""
    declared: dict[str, Mapping[str, Any]] = {}
    for tool in tools:
        function = tool.get("function") if tool.get("type", "function") == "function" else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            declared[function["name"]] = parameters if isinstance(parameters, Mapping) else {}
    return declared


def parse_tool_calls_detailed(text: str, parser: str | None, tools: Sequence[Mapping[str, Any]]) -> ToolCallParse:
    """Extracts tool calls and reports the call-shaped text it had to leave alone.

    Args:
        text: the content left by the reasoning parser.
        parser: a name from :data:`TOOL_CALL_PARSERS`, or None for no parsing.
        tools: the subtree's canonical function tools; empty means no parsing.

    Returns:
        The content, the calls and the rejected blocks.

    Raises:
        ValueError: unknown parser name.
    """
    if parser is None or not tools:
        return ToolCallParse(text, (), ())
    check_tool_call_parser(parser)
    if parser == AUTO:
        raise ValueError("tool-call parser 'auto' must be resolved against the chat template first")
    declared = _declared_tools(tools)
    segments = _SPLITTERS[parser](text, declared)

    accepted: list[ParsedToolCall] = []
    rejected: list[RejectedToolCall] = []
    kept: list[bool] = []
    for segment in segments:
        if not isinstance(segment, Candidate):
            kept.append(True)
            continue
        calls, reason = _accept(segment, declared)
        if reason is None:
            accepted.extend(calls)
            kept.append(False)
        else:
            rejected.append(RejectedToolCall(segment.raw, reason))
            kept.append(True)
    for item in rejected:
        # Logged whether or not another call was accepted: a reply whose only call names an
        # undeclared tool reaches the agent as plain text, and this line is the only trace of why.
        logger.warning("tool call left in content as text (%s; declared tools: %s)",
                       item.reason, ", ".join(sorted(declared)) or "none")
    if not accepted:
        return ToolCallParse(text, (), tuple(rejected))
    pieces = [s.raw for s, keep in zip(segments, kept, strict=True) if keep and not isinstance(s, Marker)]
    content = "".join(pieces).strip()
    return ToolCallParse(content, tuple(accepted), tuple(rejected))


def _accept(
    candidate: Candidate, declared: Mapping[str, Mapping[str, Any]]
) -> tuple[list[ParsedToolCall], str | None]:
    if candidate.error is not None:
        return [], f"malformed: {candidate.error}"
    calls = []
    ids = candidate.ids or (None,) * len(candidate.calls)
    for (name, arguments), call_id in zip(candidate.calls, ids, strict=True):
        if name not in declared:
            return [], f"undeclared tool: {name}"
        try:
            calls.append(ParsedToolCall(name, canonical_arguments(arguments), call_id or None))
        except ValueError as exc:
            return [], f"malformed: {exc}"
    return calls, None


def parse_tool_calls(
    text: str, parser: str | None, tools: Sequence[Mapping[str, Any]]
) -> tuple[str, list[ParsedToolCall]]:
    """Extracts tool calls: ``(content, calls)``. See :func:`parse_tool_calls_detailed`.

    Raises:
        ValueError: unknown parser name.
    """
    result = parse_tool_calls_detailed(text, parser, tools)
    return result.content, list(result.calls)


def tool_call_id(parent_state_hash: str, token_ids: Sequence[int], index: int) -> str:
    """Deterministic call id (docs/canonical-contract.md#decoding-a-reply).

    ``"call_" + sha256(json({"call_index": index, "parent_state_hash": h, "token_ids": ids}))[:24]``
    with sorted keys and compact separators, so a replayed generation gets the same ids.

    Args:
        parent_state_hash: state hash of the node the response was generated from.
        token_ids: the response's generated ids (``(T,)``).
        index: position of the call in the message's ``tool_calls``.
    """
    payload = json.dumps(
        {"call_index": int(index), "parent_state_hash": parent_state_hash, "token_ids": [int(t) for t in token_ids]},
        sort_keys=True,
        separators=(",", ":"),
    )
    return "call_" + hashlib.sha256(payload.encode("utf-8")).hexdigest()[:24]


def call_id_for(parser: str | None, call: ParsedToolCall, parent_state_hash: str,
                token_ids: Sequence[int], index: int) -> str:
    """The id of a returned call: the model's own id when it wrote one, else
    :func:`tool_call_id`; for Mistral (whose templates reject other lengths) 9 hex digits of it.

    Args:
        parser: the tool-call parser name that produced ``call``.
        call: the parsed call.
        parent_state_hash: state hash of the node the response was generated from.
        token_ids: the response's generated ids (``(T,)``).
        index: position of the call in the message's ``tool_calls``.
    """
    if call.call_id:
        return call.call_id
    generated = tool_call_id(parent_state_hash, token_ids, index)
    return generated[len("call_") :][:9] if parser in _SHORT_IDS else generated
