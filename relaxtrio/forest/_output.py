"""The agent's output file (``RELAX_OUTPUT_JSON``): implicit export, or explicit JSONL records.

Rules (docs/export-and-credit.md#the-output-file):

* missing or blank output: implicit export, no reward;
* one JSON object with ``messages``: one explicit record;
* any other JSON object: only ``metadata`` (object) and ``reward`` (null, number or object) are
  read, other keys are logged and ignored;
* a JSON array: rejected (explicit records must be JSONL);
* anything else: JSONL, one record object per non-blank line.

A record needs a non-empty, unique ``name`` and ``messages``; ``tools``, ``chat_template_kwargs``,
``metadata`` (object) and ``reward`` (null, finite number or object; booleans are not numbers) are
optional; other keys are logged and ignored. Messages, tools and kwargs are canonicalized with
the same rules as requests, so records must be Chat-shaped even when the agent spoke Responses or
Anthropic Messages.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections.abc import Iterable
from typing import Any

import attrs

from .._errors import ExportError, InvalidRequestError
from .._validate import is_number, type_name
from ._canonical import canonical_messages, canonical_template_kwargs, canonical_tools
from ._json import copy_json

log = logging.getLogger(__name__)

Reward = float | dict[str, Any] | None

_RECORD_KEYS = frozenset({"name", "messages", "tools", "chat_template_kwargs", "metadata", "reward"})


@attrs.frozen
class ExportRecord:
    """One explicit export record: a named context to train on.

    Attributes:
        name: non-empty name, unique within the Session (also the custom-advantage key).
        messages: canonical messages of the exported state.
        tools: canonical tools of the state.
        template_kwargs: the record's own template kwargs (merged over the server's at export).
        metadata: per-context metadata.
        reward: the context's reward, or None.
    """

    name: str
    messages: tuple[dict[str, Any], ...] = attrs.field(hash=False)
    tools: tuple[dict[str, Any], ...] = attrs.field(hash=False)
    template_kwargs: dict[str, Any] = attrs.field(hash=False)
    metadata: dict[str, Any] = attrs.field(hash=False, factory=dict)
    reward: Reward = attrs.field(hash=False, default=None)


def _record_tuple(records: Iterable[ExportRecord]) -> tuple[ExportRecord, ...]:
    return tuple(records)


@attrs.frozen
class SessionOutput:
    """The parsed agent output.

    Attributes:
        records: explicit records; empty means implicit export.
        metadata: Session-level export metadata (records merge theirs over it).
        reward: Session-level reward for implicit export, or None.
    """

    records: tuple[ExportRecord, ...] = attrs.field(default=(), converter=_record_tuple)
    metadata: dict[str, Any] = attrs.field(factory=dict, hash=False)
    reward: Reward = attrs.field(default=None, hash=False)

    @property
    def is_implicit(self) -> bool:
        """True when no explicit record was written."""
        return not self.records


def parse_session_output(text: str | None) -> SessionOutput:
    """Parses the agent's output file text.

    Args:
        text: the file's text, or None when the file does not exist.

    Returns:
        The parsed output.

    Raises:
        ExportError: a JSON array, invalid JSON lines, a non-object record, a record without
            ``messages`` or a non-empty ``name``, duplicate names, bad ``metadata`` or
            ``reward``, or a record whose messages/tools/kwargs are invalid (``param`` then names
            the field, e.g. ``messages[1].content``).
    """
    if text is None or not text.strip():
        return SessionOutput()
    stripped = text.strip()
    try:
        payload = json.loads(stripped)
    except json.JSONDecodeError:
        return _from_jsonl(stripped)
    if isinstance(payload, dict):
        if "messages" in payload:
            return _from_records([payload], [None])
        return _from_object(payload)
    if isinstance(payload, list):
        raise ExportError("Session output explicit records must be written as JSONL, not a JSON array")
    raise ExportError(f"Session output must be a JSON object or JSONL records, got {type_name(payload)}")


def _from_jsonl(stripped: str) -> SessionOutput:
    records: list[Any] = []
    line_numbers: list[int | None] = []
    for number, line in enumerate(stripped.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ExportError(f"Session output line {number} is not valid JSON: {exc.msg}") from None
        line_numbers.append(number)
    return _from_records(records, line_numbers)


def _from_object(payload: dict[str, Any]) -> SessionOutput:
    unknown = sorted(set(payload) - {"metadata", "reward"})
    if unknown:
        log.warning(
            "Session output ignores unknown top-level keys %s; only metadata and reward are read", unknown
        )
    metadata = payload.get("metadata", {})
    if not isinstance(metadata, dict):
        raise ExportError("Session output 'metadata' must be a JSON object")
    reward = _reward(payload.get("reward"), "Session output 'reward'")
    return SessionOutput(metadata=copy.deepcopy(metadata), reward=reward)


def _from_records(records: list[Any], line_numbers: list[int | None]) -> SessionOutput:
    parsed: list[ExportRecord] = []
    names: set[str] = set()
    for record, line in zip(records, line_numbers, strict=True):
        where = "Session output record" if line is None else f"Session output record (line {line})"
        item = _record(record, where)
        if item.name in names:
            raise ExportError(
                f"Session output record name must be unique within one explicit export: {item.name!r}"
            )
        names.add(item.name)
        parsed.append(item)
    return SessionOutput(records=tuple(parsed))


def _record(record: Any, where: str) -> ExportRecord:
    if not isinstance(record, dict):
        raise ExportError(f"{where} must be a JSON object, got {type_name(record)}")
    unknown = sorted(set(record) - _RECORD_KEYS)
    if unknown:
        log.warning("%s ignores unknown keys %s", where, unknown)
    if "messages" not in record:
        raise ExportError(f"{where} must include 'messages'")
    name = record.get("name")
    if not isinstance(name, str) or not name:
        raise ExportError(f"{where} must include non-empty string 'name'")
    where = f"{where} {name!r}"
    metadata = record.get("metadata", {})
    if not isinstance(metadata, dict):
        raise ExportError(f"{where}: 'metadata' must be a JSON object")
    reward = _reward(record.get("reward"), f"{where}: 'reward'")
    try:
        messages = canonical_messages(record["messages"])
        tools = canonical_tools(record.get("tools"))
        template_kwargs = canonical_template_kwargs(record.get("chat_template_kwargs"))
    except InvalidRequestError as exc:
        raise ExportError(f"{where}: {exc.message}", param=exc.param) from exc
    return ExportRecord(
        name=name,
        messages=messages,
        tools=tools,
        template_kwargs=template_kwargs,
        metadata=copy.deepcopy(metadata),
        reward=reward,
    )


def _reward(value: Any, what: str) -> Reward:
    """Validates a reward: None, a finite number (not a bool) or an object of finite numbers."""
    if value is None:
        return None
    if not (is_number(value) or isinstance(value, dict)):
        raise ExportError(f"{what} must be null, number, or JSON object, got {type_name(value)}")
    if isinstance(value, dict):
        try:
            copied: dict[str, Any] = copy_json(value, "reward")
            return copied
        except InvalidRequestError as exc:
            raise ExportError(f"{what}: {exc.message}", param=exc.param) from exc
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ExportError(f"{what} must be a finite number, got {value!r}")
    return number
