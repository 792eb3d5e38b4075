"""Tool-call text formats of DeepSeek-V3.x, GLM-4.5/4.6, Kimi-K2 and Mistral.

Same contract as :mod:`._formats`: each splitter returns segments whose ``raw`` texts join back
to the input, and :mod:`.tool_calls` decides which candidates become calls. The formats, as the
models write them (and as their published chat templates render history; the templates are in
``relaxtrio/chat/templates/``):

* DeepSeek-V3 / R1: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n
  ARGS\\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>``; DeepSeek-V3.1 drops the type and the fence:
  ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>``. One splitter reads both.
* GLM-4.5/4.6: ``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n…</tool_call>``;
  string values are written raw, other values as JSON, so values are converted by the tool's
  JSON-schema types (as for Qwen3-Coder).
* Kimi-K2: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
  <|tool_call_argument_begin|>ARGS<|tool_call_end|>…<|tool_calls_section_end|>``; the id
  (``functions.NAME:IDX``) is kept as the call id, because Kimi-K2-Thinking's template renders it
  back verbatim and the model reads tool results by it (``## Return of <id>``).
* Mistral: ``[TOOL_CALLS]`` followed by either a JSON list of ``{"name", "arguments", "id"?}``
  objects (tokenizer v3 to v7) or, once per call, ``NAME[CALL_ID]ID[ARGS]ARGS`` (v11) or
  ``NAME[ARGS]ARGS`` (v13 and later).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from ._formats import Candidate, Marker, Segment, Text, _calls_from_json, _split_tagged, convert_parameter
from ._json import loads_strict, raw_decode_strict

_Call = tuple[str, dict[str, Any]]

DS_CALLS_BEGIN: Final = "<｜tool▁calls▁begin｜>"
DS_CALLS_END: Final = "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN: Final = "<｜tool▁call▁begin｜>"
DS_CALL_END: Final = "<｜tool▁call▁end｜>"
DS_SEP: Final = "<｜tool▁sep｜>"
_DS_FENCED: Final = re.compile(r"([^\n]*)\n```(?:json)?\n(.*)\n```\s*", re.DOTALL)

KIMI_SECTION_BEGIN: Final = "<|tool_calls_section_begin|>"
KIMI_SECTION_END: Final = "<|tool_calls_section_end|>"
KIMI_CALL_BEGIN: Final = "<|tool_call_begin|>"
KIMI_CALL_END: Final = "<|tool_call_end|>"
KIMI_ARGS: Final = "<|tool_call_argument_begin|>"
_KIMI_ID: Final = re.compile(r"(?:functions\.)?(.+?)(?::\d+)?")

_GLM_PAIR: Final = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)

MISTRAL_CALLS: Final = "[TOOL_CALLS]"
_MISTRAL_HEAD: Final = re.compile(r"([^\[\]\s]+)(?:\[CALL_ID\]([^\[\]\s]+))?\[ARGS\]")
_SPACE: Final = re.compile(r"\s+")


def _split_sections(
    text: str, begin: str, end: str, call_begin: str, call_end: str,
    parse_call: Callable[[str], tuple[_Call, str | None]],
) -> list[Segment]:
    """Segments of a format with a call section holding delimited call blocks.

    Text outside sections is kept. Inside a section, whitespace between blocks is a marker,
    an unclosed block is a malformed candidate, and other stray text is kept as text. A section
    the model did not close runs to the end of the text.
    """
    segments: list[Segment] = []
    position = 0
    while (start := text.find(begin, position)) >= 0:
        if start > position:
            segments.append(Text(text[position:start]))
        segments.append(Marker(begin))
        stop = text.find(end, start + len(begin))
        section_end = stop if stop >= 0 else len(text)
        segments.extend(_section_blocks(text[start + len(begin) : section_end], call_begin, call_end, parse_call))
        if stop >= 0:
            segments.append(Marker(end))
            position = stop + len(end)
        else:
            position = len(text)
    if position < len(text):
        segments.append(Text(text[position:]))
    return segments


def _section_blocks(
    body: str, call_begin: str, call_end: str, parse_call: Callable[[str], tuple[_Call, str | None]]
) -> list[Segment]:
    segments: list[Segment] = []
    position = 0
    while position < len(body):
        start = body.find(call_begin, position)
        gap = body[position : start if start >= 0 else len(body)]
        if gap:
            segments.append(Marker(gap) if not gap.strip() else Text(gap))
        if start < 0:
            break
        stop = body.find(call_end, start + len(call_begin))
        nested = body.find(call_begin, start + len(call_begin))
        if stop < 0 or 0 <= nested < stop:
            cut = nested if nested >= 0 else len(body)
            segments.append(Candidate(body[start:cut], error="a call block is not closed"))
            position = cut
            continue
        raw = body[start : stop + len(call_end)]
        try:
            call, call_id = parse_call(body[start + len(call_begin) : stop])
        except ValueError as exc:
            segments.append(Candidate(raw, error=str(exc)))
        else:
            segments.append(Candidate(raw, calls=(call,), ids=(call_id,)))
        position = stop + len(call_end)
    return segments


def _arguments(text: str) -> dict[str, Any]:
    value = loads_strict(text)
    if not isinstance(value, dict):
        raise ValueError("call arguments must be a JSON object")
    return value


def _name(text: str) -> str:
    name = text.strip()
    if not name or any(c.isspace() for c in name):
        raise ValueError(f"bad function name {text!r}")
    return name


def _deepseek_call(body: str) -> tuple[_Call, str | None]:
    head, sep, rest = body.partition(DS_SEP)
    if not sep:
        raise ValueError(f"a call needs {DS_SEP}")
    fenced = _DS_FENCED.fullmatch(rest)
    if fenced is not None and head.strip() in ("function", ""):
        return (_name(fenced.group(1)), _arguments(fenced.group(2))), None
    return (_name(head), _arguments(rest)), None


def split_deepseek(text: str, tools: Mapping[str, Mapping[str, Any]]) -> list[Segment]:
    """DeepSeek-V3 / R1 (``function<｜tool▁sep｜>NAME`` + fenced JSON) and V3.1 (``NAME<｜tool▁sep｜>JSON``)."""
    del tools
    return _split_sections(text, DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END, _deepseek_call)


def _kimi_call(body: str) -> tuple[_Call, str | None]:
    head, sep, rest = body.partition(KIMI_ARGS)
    if not sep:
        raise ValueError(f"a call needs {KIMI_ARGS}")
    call_id = head.strip()
    match = _KIMI_ID.fullmatch(call_id)
    if not call_id or match is None:
        raise ValueError(f"bad call id {head!r}")
    return (_name(match.group(1)), _arguments(rest)), call_id


def split_kimi_k2(text: str, tools: Mapping[str, Mapping[str, Any]]) -> list[Segment]:
    """Kimi-K2: ``functions.NAME:IDX<|tool_call_argument_begin|>JSON`` blocks in a call section."""
    del tools
    return _split_sections(text, KIMI_SECTION_BEGIN, KIMI_SECTION_END, KIMI_CALL_BEGIN, KIMI_CALL_END, _kimi_call)


def split_glm45(text: str, tools: Mapping[str, Mapping[str, Any]]) -> list[Segment]:
    """GLM-4.5/4.6 ``<tool_call>NAME`` + ``<arg_key>``/``<arg_value>`` pairs; values by schema type."""

    def parse_body(body: str) -> tuple[_Call, ...]:
        first = body.find("<arg_key>")
        name = _name(body if first < 0 else body[:first])
        schema = tools.get(name, {})
        properties = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
        arguments: dict[str, Any] = {}
        position = len(body) if first < 0 else first
        for match in _GLM_PAIR.finditer(body, position):
            if body[position : match.start()].strip():
                raise ValueError("text between <arg_value> and <arg_key>")
            key = match.group(1).strip()
            if not key or key in arguments:
                raise ValueError(f"empty or repeated argument name {key!r}")
            arguments[key] = convert_parameter(match.group(2), properties.get(key))
            position = match.end()
        if body[position:].strip():
            raise ValueError("text outside <arg_key>/<arg_value> pairs in a tool call block")
        return ((name, arguments),)

    return _split_tagged(text, parse_body)


def split_mistral(text: str, tools: Mapping[str, Mapping[str, Any]]) -> list[Segment]:
    """Mistral ``[TOOL_CALLS]``: a JSON list of calls, or ``NAME([CALL_ID]ID)?[ARGS]JSON`` per marker."""
    del tools
    segments: list[Segment] = []
    position = 0
    while (start := text.find(MISTRAL_CALLS, position)) >= 0:
        if start > position:
            segments.append(Text(text[position:start]))
        segments.append(Marker(MISTRAL_CALLS))
        position = start + len(MISTRAL_CALLS)
        if space := _SPACE.match(text, position):
            segments.append(Marker(space.group(0)))
            position = space.end()
        position = _mistral_call(text, position, segments)
    if position < len(text):
        rest = text[position:]
        segments.append(Marker(rest) if not rest.strip() and segments else Text(rest))
    return segments


def _mistral_call(text: str, position: int, segments: list[Segment]) -> int:
    """Appends the call starting at ``position`` (after ``[TOOL_CALLS]``); returns where it ends."""
    head = _MISTRAL_HEAD.match(text, position)
    value_at = head.end() if head is not None else position
    if head is None and not text.startswith(("[", "{"), position):
        return position  # the marker alone: what follows stays text
    stop = text.find(MISTRAL_CALLS, value_at)
    try:
        value, end = raw_decode_strict(text, value_at)
    except ValueError:
        end = stop if stop >= 0 else len(text)
        segments.append(Candidate(text[position:end], error="malformed JSON after [TOOL_CALLS]"))
        return end
    raw = text[position:end]
    try:
        if head is None:
            items = value if isinstance(value, list) else [value]
            calls = _calls_from_json(value)
            ids = tuple(item.get("id") if isinstance(item.get("id"), str) else None for item in items)
        else:
            if not isinstance(value, dict):
                raise ValueError("call arguments must be a JSON object")
            calls, ids = ((head.group(1), value),), (head.group(2),)
    except ValueError as exc:
        segments.append(Candidate(raw, error=str(exc)))
    else:
        segments.append(Candidate(raw, calls=calls, ids=ids))
    return end
