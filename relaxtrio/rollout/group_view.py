"""One Group's Sessions side by side, as the dashboard's Group comparison shows them.

:func:`group_comparison` lists each Session's reward, advantage, turns and tokens, and its first
exported context as a message list, then finds where the siblings' contexts first differ: the
first message index at which they are not all equal and the first token index at which their
training ids are not all equal (docs/dashboard.md#group-comparison). A Group its step accepted
shows the scored rewards and advantages; one still running shows what its Sessions exported so
far (rewards the agents wrote; advantages come with scoring).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from ..forest import TrainingSample, sample_leaf_hash
from ..nursery.group import Group
from ..nursery.session import Session
from .scored import ScoredSample
from .step import ScoredGroup

__all__ = ["first_divergence", "group_comparison"]


def _text(message: dict[str, Any]) -> str:
    """A message as one line of text for the page (content, then tool calls as JSON)."""
    content = message.get("content")
    text = content if isinstance(content, str) else ("" if content is None else json.dumps(content))
    calls = message.get("tool_calls")
    if calls:
        text += ("\n" if text else "") + json.dumps(calls)
    return text


def first_divergence(rows: Sequence[Sequence[Any]]) -> int | None:
    """The first index at which ``rows`` are not all equal (a shorter row ends first), or None
    when they are all equal or fewer than two rows are given."""
    if len(rows) < 2:
        return None
    longest = max(len(r) for r in rows)
    for i in range(longest):
        if any(i >= len(r) for r in rows) or any(r[i] != rows[0][i] for r in rows[1:]):
            return i
    return None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _context(session: Session, sample: TrainingSample) -> dict[str, Any]:
    leaf = sample_leaf_hash(sample)
    node = session.forest.get(leaf) if leaf is not None else None
    messages = session.forest.messages(node) if node is not None else ()
    return {"name": sample.name, "state_hash": leaf,
            "messages": [{"role": m.get("role"), "text": _text(m)} for m in messages],
            "num_tokens": len(sample.token_ids), "response_tokens": sum(sample.loss_mask)}


def _session_row(session: Session, scored: Sequence[ScoredSample]) -> dict[str, Any]:
    samples = list(session.samples)
    first = scored[0] if scored else None
    reward = first.reward if first is not None else (_number(samples[0].reward) if samples else None)
    return {
        "session_id": session.session_id,
        "index": session.index,
        "status": session.status,
        "reward": reward,
        "advantage": first.advantage if first is not None else None,
        "turns": sum(1 for n in session.forest.nodes() if n.kind == "response"),
        "tokens": sum(len(s.token_ids) for s in samples),
        "response_tokens": sum(sum(s.loss_mask) for s in samples),
        "contexts": [_context(session, s) for s in samples],
    }


def group_comparison(group: Group, scored: ScoredGroup | None = None) -> dict[str, Any]:
    """A Group's Sessions side by side (see the module docstring).

    Args:
        group: the Group.
        scored: its scored contexts when its step accepted it, else None.

    Returns:
        ``group_id``, ``rollout_id``, ``scored`` (whether rewards and advantages are the
        step's), ``sessions`` (per Session ``session_id``, ``index``, ``status``, ``reward``,
        ``advantage`` (of its first context), ``turns``, ``tokens`` and ``response_tokens``
        (summed over its contexts) and ``contexts``: ``name``, ``state_hash``, ``messages``
        (``role``, ``text``), ``num_tokens``, ``response_tokens``) and ``first_divergence``:
        ``message`` and ``token`` indices into the Sessions' first contexts (None where they
        agree, or with fewer than two exported Sessions).
    """
    by_session: dict[str, list[ScoredSample]] = {}
    for item in scored.scored if scored is not None else ():
        by_session.setdefault(item.sample.session_id, []).append(item)
    sessions = [_session_row(s, by_session.get(s.session_id, [])) for s in group.sessions]
    firsts = [s.samples[0] for s in group.sessions if s.samples]
    messages = [[(m["role"], m["text"]) for m in row["contexts"][0]["messages"]]
                for row in sessions if row["contexts"]]
    return {
        "group_id": group.group_id,
        "rollout_id": group.rollout_id,
        "scored": scored is not None,
        "sessions": sessions,
        "first_divergence": {"message": first_divergence(messages),
                             "token": first_divergence([s.token_ids for s in firsts])},
    }
