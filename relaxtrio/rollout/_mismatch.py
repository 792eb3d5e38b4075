"""Why a request's replayed assistant message matched no committed response: the log line.

A request whose history holds an assistant message that matches nothing committed starts a new
branch (the message becomes observation text with loss mask 0). Two different causes look the
same from the forest: the agent changed the history (edited text, dropped ``reasoning_content``
or tool calls, compaction), or it kept the history and changed the **tool list** or the
chat-template kwargs, which start a subtree of their own (Codex's compaction request sends no
tools). The warning names the cause, so nobody chases an assistant-replay bug that is not there
(docs/client-quirks.md#dropped-reasoning-on-replay).
"""

from __future__ import annotations

from typing import Any

from ..forest import Conversation, Match, SessionForest


def _names(tools: Any) -> set[str]:
    return {t["function"].get("name") or "?" for t in tools or ()}


def mismatch_warning(session_id: str, forest: SessionForest, conv: Conversation, match: Match) -> str:
    """The warning for a request whose replayed assistant message matches no committed response.

    Args:
        session_id: the Session (named in the line).
        forest: its forest.
        conv: the request's canonical conversation.
        match: ``forest.match(conv)``; its delta holds an assistant message.

    Returns:
        One log line: the tool-list / template-kwargs change when the same history matches
        further under another subtree's tools and kwargs, else the assistant-replay advice.
    """
    matched = len(conv.messages) - len(match.delta)
    best = None
    for root in forest.subtree_roots():
        tools, kwargs = tuple(root.tools or ()), dict(root.template_kwargs or {})
        if list(tools) == list(conv.tools) and kwargs == conv.template_kwargs:
            continue
        other = forest.match(Conversation(messages=conv.messages, tools=tools, template_kwargs=kwargs))
        there = len(conv.messages) - len(other.delta)
        if there > matched and (best is None or there > best[0]):
            best = (there, tools, kwargs)
    if best is None:
        return (
            f"session {session_id}: the request's history has an assistant message that matches no "
            f"committed response (matched {matched} of {len(conv.messages)} messages); it becomes an "
            "observation on a new branch. Replay assistant messages exactly as returned (with "
            "reasoning_content and tool_calls), or export the contexts explicitly."
        )
    there, tools, kwargs = best
    changes = []
    if list(tools) != list(conv.tools):
        now, before = _names(conv.tools), _names(tools)
        detail = [f"{len(conv.tools)} tools now, {len(tools)} before"]
        if before - now:
            detail.append("removed " + ", ".join(sorted(before - now)))
        if now - before:
            detail.append("added " + ", ".join(sorted(now - before)))
        if before == now:
            detail.append("same names, other definitions")
        changes.append("the tool list changed (" + "; ".join(detail) + ")")
    if kwargs != conv.template_kwargs:
        changes.append(f"chat_template_kwargs changed ({kwargs} before, {conv.template_kwargs} now)")
    return (
        f"session {session_id}: {' and '.join(changes)}; under the earlier ones its history matches {there} of "
        f"its {len(conv.messages)} messages, but other tools or template kwargs start a new "
        "subtree, so its assistant messages become observations there (not a replay problem)."
    )
