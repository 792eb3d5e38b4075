"""Tool-call text formats: split decoded text into plain text, markers and call candidates.

Each splitter returns a list of segments in text order; joining every segment's ``raw`` text gives
the input back exactly. :mod:`.tool_calls` decides which candidates become calls and rebuilds the
content from the rest, so nothing the model wrote is lost
(docs/client-quirks.md#malformed-tool-call-blocks).
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from ._json import loads_strict, raw_decode_strict


@attrs.frozen
class Text:
    """Plain text, always kept in the content."""

    raw: str


@attrs.frozen
class Marker:
    """Call syntax outside a candidate (a ``<|python_tag|>``, a ``;``): dropped when a call is taken."""

    raw: str


@attrs.frozen
class Candidate:
    """One would-be call; ``error`` is set when the text is malformed.

    Attributes:
        raw: the exact text of the call (for tagged formats, the whole block including tags).
        calls: ``(name, arguments)`` pairs; a block may hold several (a JSON list).
        error: why the block is malformed, or None.
        ids: the call ids the model wrote, one per call (Kimi-K2, Mistral), or empty when the
            format carries none.
    """

    raw: str
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    error: str | None = None
    ids: tuple[str | None, ...] = ()


Segment = Text | Marker | Candidate

_TOOL_CALL_BLOCK: Final = re.compile(r"<tool_call>((?:(?!<tool_call>).)*?)</tool_call>", re.DOTALL)
_FUNCTION: Final = re.compile(r"<function=([^>\n]*)>(.*?)</function>", re.DOTALL)
_PARAMETER_OPEN: Final = re.compile(r"<parameter=([^>\n]*)>")
_WHITESPACE: Final = re.compile(r"\s+")
_PYTHON_TAG: Final = "<|python_tag|>"


def _call_from_object(obj: Any) -> tuple[str, dict[str, Any]]:
    """``{"name": ..., "arguments"|"parameters": {...}}`` → (name, arguments)."""
    if not isinstance(obj, dict):
        raise ValueError("a call must be a JSON object")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError("a call needs a non-empty string 'name'")
    if "arguments" in obj and "parameters" in obj and obj["arguments"] != obj["parameters"]:
        raise ValueError("a call has both 'arguments' and 'parameters'")
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = loads_strict(arguments)
    if not isinstance(arguments, dict):
        raise ValueError("call arguments must be a JSON object")
    return name.strip(), arguments


def _calls_from_json(value: Any) -> tuple[tuple[str, dict[str, Any]], ...]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise ValueError("an empty list of calls")
    return tuple(_call_from_object(item) for item in items)


def _split_tagged(text: str, parse_body: Callable[[str], tuple[tuple[str, dict[str, Any]], ...]]) -> list[Segment]:
    segments: list[Segment] = []
    position = 0
    for match in _TOOL_CALL_BLOCK.finditer(text):
        if match.start() > position:
            segments.append(Text(text[position : match.start()]))
        try:
            segments.append(Candidate(match.group(0), calls=parse_body(match.group(1))))
        except ValueError as exc:
            segments.append(Candidate(match.group(0), error=str(exc)))
        position = match.end()
    if position < len(text):
        segments.append(Text(text[position:]))
    return segments


def split_hermes(text: str, tools: Mapping[str, Mapping[str, Any]]) -> list[Segment]:
    """Hermes / Qwen2.5: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks."""
    del tools  # JSON arguments need no schema
    return _split_tagged(text, lambda body: _calls_from_json(loads_strict(body)))


def split_qwen3_coder(text: str, tools: Mapping[str, Mapping[str, Any]]) -> list[Segment]:
    """Qwen3-Coder XML-ish blocks; parameter values are converted by the tool's JSON-schema types."""

    def parse_body(body: str) -> tuple[tuple[str, dict[str, Any]], ...]:
        calls = []
        position = 0
        for match in _FUNCTION.finditer(body):
            if body[position : match.start()].strip():
                raise ValueError("text outside <function=...> in a tool call block")
            name = match.group(1).strip()
            if not name:
                raise ValueError("empty function name")
            calls.append((name, _coder_parameters(match.group(2), tools.get(name, {}))))
            position = match.end()
        if not calls or body[position:].strip():
            raise ValueError("a tool call block needs <function=name>...</function>")
        return tuple(calls)

    return _split_tagged(text, parse_body)


def _coder_parameters(body: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    properties = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
    opens = list(_PARAMETER_OPEN.finditer(body))
    if body[: opens[0].start() if opens else len(body)].strip():
        raise ValueError("text outside <parameter=...> in a function")
    arguments: dict[str, Any] = {}
    for k, match in enumerate(opens):
        stop = opens[k + 1].start() if k + 1 < len(opens) else len(body)
        value = body[match.end() : stop]
        close = value.find("</parameter>")
        if close >= 0:
            if value[close + len("</parameter>") :].strip():
                raise ValueError("text after </parameter>")
            value = value[:close]
        value = value.removeprefix("\n").removesuffix("\n")
        name = match.group(1).strip()
        if not name or name in arguments:
            raise ValueError(f"empty or repeated parameter name {name!r}")
        arguments[name] = convert_parameter(value, properties.get(name))
    return arguments


def _schema_type(schema: Any) -> str:
    if not isinstance(schema, Mapping):
        return "string"
    declared = schema.get("type", "string")
    if isinstance(declared, list):
        declared = next((t for t in declared if t != "null"), "string")
    return str(declared).strip().lower()


def convert_parameter(value: str, schema: Any) -> Any:
    """Converts one XML parameter value by its JSON-schema type (SGLang's qwen3_coder rules).

    ``null`` (any case) is None; string-like types stay strings; integer and number types become
    numbers; booleans accept ``true``/``false``; objects and arrays are parsed as JSON (or as a
    Python literal that is a dict/list). A value that does not fit its type stays the raw string,
    as does a parameter the schema does not declare.
    """
    if value.lower() == "null":
        return None
    kind = _schema_type(schema)
    if kind in ("string", "str", "text", "varchar", "char", "enum"):
        return value
    if kind.startswith(("int", "uint", "long", "short", "unsigned")):
        try:
            return int(value.strip())
        except ValueError:
            return value
    if kind.startswith(("num", "float", "double")):
        try:
            number = float(value.strip())
        except ValueError:
            return value
        if not math.isfinite(number):
            return value
        literal = value.strip().lower()
        return int(number) if number.is_integer() and "." not in literal and "e" not in literal else number
    if kind in ("boolean", "bool", "binary"):
        lowered = value.strip().lower()
        return {"true": True, "false": False}.get(lowered, value)
    try:
        return loads_strict(value)
    except ValueError:
        pass
    try:
        literal_value = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value
    try:
        json.dumps(literal_value, allow_nan=False)
    except (TypeError, ValueError):
        return value
    return literal_value if isinstance(literal_value, (dict, list)) else value


def split_llama3(text: str, tools: Mapping[str, Mapping[str, Any]]) -> list[Segment]:
    """Llama 3.x JSON calls: ``{"name": ..., "parameters": {...}}``, optionally after
    ``<|python_tag|>``, several separated by ``;``. Without the tag the text must start with the JSON."""
    del tools
    tag = text.find(_PYTHON_TAG)
    if tag >= 0:
        segments: list[Segment] = [Text(text[:tag])] if tag else []
        segments.append(Marker(_PYTHON_TAG))
        position = tag + len(_PYTHON_TAG)
    else:
        stripped = text.lstrip()
        if not stripped.startswith(("{", "[")):
            return [Text(text)]
        segments = [Marker(text[: len(text) - len(stripped)])] if stripped != text else []
        position = len(text) - len(stripped)
    expect_value = True
    while position < len(text):
        space = _WHITESPACE.match(text, position)
        if space:
            segments.append(Marker(space.group(0)))
            position = space.end()
            continue
        if not expect_value:
            separator = next((s for s in (";", _PYTHON_TAG) if text.startswith(s, position)), None)
            if separator is None:
                if text.startswith(("{", "["), position):
                    expect_value = True  # calls separated by whitespace only
                    continue
                break
            segments.append(Marker(separator))
            position += len(separator)
            expect_value = True
            continue
        try:
            value, end = raw_decode_strict(text, position)
        except ValueError:
            break
        try:
            segments.append(Candidate(text[position:end], calls=_calls_from_json(value)))
        except ValueError as exc:
            segments.append(Candidate(text[position:end], error=str(exc)))
        position = end
        expect_value = False
    if position < len(text):
        rest = text[position:]
        looks_like_json = expect_value and rest.startswith(("{", "["))
        segments.append(Candidate(rest, error="malformed JSON call") if looks_like_json else Text(rest))
    return segments
