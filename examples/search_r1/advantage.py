"""Per-role credit for examples/search_r1's multi-agent mode (``--agentic-custom-advantage-path
examples.search_r1.advantage.per_role_credit``).

Input: one ``{context name: export metadata}`` mapping per Session of a Group, in Session order
(docs/export-and-credit.md#custom-advantage). Each context's raw credit:

- ``main``: the task outcome (1.0 for an exact-match answer, else 0.0);
- a searcher: ``(outcome + found) / 2``, where ``found`` is 1.0 when its note names a gold answer,
  so a searcher that brought the answer is credited even when the main agent then failed.

Custom advantage bypasses GRPO's normalization, so it is done here, per role: the raw credits of
every context of one role (``metadata.role``: ``main`` or ``searcher``) across the Group's Sessions
are pooled and standardized, ``(x - mean) / (std + 1e-6)`` with the population std. Roles are
normalized separately because their credits mean different things and a Session may run any
number of searchers. A role whose credits are all equal gets zeros.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

EPSILON = 1e-6


def raw_credit(meta: dict[str, Any]) -> float:
    outcome = float(meta["outcome"])
    return outcome if meta["role"] == "main" else (outcome + float(meta["found"])) / 2


def per_role_credit(metadata_by_slot: list[dict[str | None, dict[str, Any]]]) -> list[dict[str | None, float]]:
    raw = [{name: raw_credit(meta) for name, meta in slot.items()} for slot in metadata_by_slot]
    pooled: dict[str, list[float]] = defaultdict(list)
    for slot, values in zip(metadata_by_slot, raw, strict=True):
        for name, value in values.items():
            pooled[slot[name]["role"]].append(value)
    stats = {}
    for role, values in pooled.items():
        mean = sum(values) / len(values)
        stats[role] = (mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)))
    out = []
    for slot, values in zip(metadata_by_slot, raw, strict=True):
        credits = {}
        for name, value in values.items():
            mean, std = stats[slot[name]["role"]]
            credits[name] = (value - mean) / (std + EPSILON)
        out.append(credits)
    return out
