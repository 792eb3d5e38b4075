"""Prompt datasets: JSONL rows → Session inputs (messages and metadata).

``--input-key`` maps a row field to messages (a string becomes one user message, a message list
keeps its OpenAI shape, a dict becomes one message); ``--metadata-key`` maps a row field to
metadata. A row may have both. Reference D-7.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from .._errors import InvalidRequestError
from ..forest import Conversation


@attrs.frozen(kw_only=True)
class Prompt:
    """One dataset row, ready to become a Group.

    Attributes:
        index: the row's position in the file (0-based).
        messages: canonical messages for the Session input (may be empty for metadata-only rows).
        metadata: the row's metadata object (copied into every exported sample).
    """

    index: int
    messages: tuple[dict, ...]
    metadata: dict[str, Any]

    def session_input(self) -> dict[str, Any]:
        """The JSON object written to RELAX_INPUT_JSON."""
        payload: dict[str, Any] = {"messages": [dict(m) for m in self.messages]}
        if self.metadata:
            payload["metadata"] = self.metadata
        return payload


def _messages_of(value: Any, where: str) -> tuple[dict, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [{"role": "user", "content": value}] if value.strip() else []
    elif isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise InvalidRequestError(f"{where} must be a string, a message or a list of messages")
    if not value:
        return ()
    return Conversation.from_wire(value).messages


def load_prompts(path: Path, *, input_key: str = "input", metadata_key: str = "metadata") -> list[Prompt]:
    """Reads a JSONL prompt file.

    Raises:
        InvalidRequestError: unreadable JSON, a non-object row, or a row with neither field.
        FileNotFoundError: no such file.
    """
    prompts = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidRequestError(f"{where}: invalid JSON ({exc})") from exc
            if not isinstance(row, dict):
                raise InvalidRequestError(f"{where}: each line must be a JSON object")
            if input_key not in row and metadata_key not in row:
                raise InvalidRequestError(f"{where}: row has neither {input_key!r} nor {metadata_key!r}")
            metadata = row.get(metadata_key) or {}
            if not isinstance(metadata, dict):
                raise InvalidRequestError(f"{where}: {metadata_key!r} must be a JSON object")
            prompts.append(
                Prompt(index=len(prompts), messages=_messages_of(row.get(input_key), where),
                       metadata=metadata)
            )
    if not prompts:
        raise InvalidRequestError(f"{path}: no prompts")
    return prompts


@attrs.define(kw_only=True)
class PromptStream:
    """An endless, epoch-shuffled stream of prompts (deterministic for a seed)."""

    prompts: list[Prompt]
    shuffle: bool = True
    seed: int = 0
    epoch: int = 0
    _order: list[int] = attrs.field(factory=list)

    def __iter__(self) -> Iterator[Prompt]:
        return self

    def __next__(self) -> Prompt:
        if not self._order:
            self._order = list(range(len(self.prompts)))
            if self.shuffle:
                random.Random(self.seed + self.epoch).shuffle(self._order)
            self._order.reverse()
            self.epoch += 1
        return self.prompts[self._order.pop()]
