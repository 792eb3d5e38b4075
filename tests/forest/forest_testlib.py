"""Shared helpers for the forest tests: the naive hash and matcher (the oracles), and a tiny turn driver."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from typing import Any

from hypothesis import settings

from relaxtrio.forest import Conversation, ObservationNode, ResponseNode, SessionForest


def forest_settings() -> settings:
    """The Hypothesis profile selected by ``FOREST_HYPOTHESIS_PROFILE`` or ``FAST=1``."""
    name = os.environ.get("FOREST_HYPOTHESIS_PROFILE") or (
        "forest-fast" if os.environ.get("FAST") == "1" else "forest-default"
    )
    return settings.get_profile(name)


def reference_hash(messages: Any, tools: Any, template_kwargs: Any) -> str:
    """The state hash by its definition, re-serializing everything.

    See docs/canonical-contract.md#the-state-hash.
    """
    payload = json.dumps(
        {"messages": list(messages), "tools": list(tools), "template_kwargs": template_kwargs},
        ensure_ascii=False,
        separators=(",", ":"),
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def reference_match(forest: SessionForest, conv: Conversation) -> tuple[Any, tuple[dict[str, Any], ...]]:
    """The naive matching loop: the longest k whose prefix hash is committed.

    See docs/canonical-contract.md#prefix-matching.
    """
    messages = list(conv.messages)
    for k in range(len(messages), 0, -1):
        node = forest.get(reference_hash(messages[:k], conv.tools, conv.template_kwargs))
        if node is not None:
            return node, tuple(messages[k:])
    return forest.root, tuple(messages)


class Driver:
    """Commits turns the way the rollout layer does, with globally unique token ids."""

    def __init__(self, forest: SessionForest) -> None:
        self.forest = forest
        self._ids = itertools.count(1000)

    def ids(self, n: int) -> list[int]:
        return [next(self._ids) for _ in range(n)]

    def observe(
        self,
        messages: list[dict[str, Any]],
        tools: Any = None,
        template_kwargs: Any = None,
        *,
        n_ids: int = 3,
    ) -> ObservationNode | ResponseNode:
        """Matches a request and commits its observation delta; returns the generation parent."""
        match = self.forest.match(Conversation.from_wire(messages, tools, template_kwargs))
        if not match.delta:
            return match.parent
        return self.forest.add_observation(match, token_ids=self.ids(n_ids * len(match.delta)))

    def respond(
        self,
        parent: ObservationNode | ResponseNode,
        message: dict[str, Any],
        *,
        n_ids: int = 2,
        **kwargs: Any,
    ) -> ResponseNode:
        ids = self.ids(n_ids)
        kwargs.setdefault("finish_reason", "tool_calls" if message.get("tool_calls") else "stop")
        return self.forest.add_response(
            parent, message, token_ids=ids, rollout_logprobs=[-(i % 7) / 10 - 0.05 for i in ids], **kwargs
        )

    def turn(
        self,
        messages: list[dict[str, Any]],
        reply: dict[str, Any],
        tools: Any = None,
        template_kwargs: Any = None,
    ) -> ResponseNode:
        return self.respond(self.observe(messages, tools, template_kwargs), reply)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


def tool_result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
