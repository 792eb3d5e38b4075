"""Per-context credit for the multi-agent example (``--agentic-custom-advantage-path``).

Input: one ``{context name: export metadata}`` mapping per Session of a Group, in Session order
(see docs/export-and-credit.md#custom-advantage). Output: the same order and names, one number
each. Normalization happens here, because custom advantage bypasses the estimator:

- the Group's outcomes are centered: ``c = outcome - mean(outcome over the Group's Sessions)``;
- ``main`` gets ``c``;
- each searcher gets ``c * usefulness``: a searcher whose notes the main answer did not use
  shares neither the praise nor the blame.

A Group whose outcomes are all equal gets zero credit everywhere (nothing to learn from).
"""

from __future__ import annotations

from typing import Any


def credit(metadata_by_slot: list[dict[str | None, dict[str, Any]]]) -> list[dict[str | None, float]]:
    outcomes = [float(slot["main"]["outcome"]) for slot in metadata_by_slot]
    mean = sum(outcomes) / len(outcomes)
    out = []
    for slot, outcome in zip(metadata_by_slot, outcomes, strict=True):
        centered = outcome - mean
        out.append({name: centered if name == "main" else centered * float(meta.get("usefulness", 0.0))
                    for name, meta in slot.items()})
    return out
