"""Per-context credit for examples/parallel_search (``--agentic-custom-advantage-path``).

Outcome x usefulness credit (the hook's contract is in docs/export-and-credit.md#custom-advantage):
``main`` is credited with the task outcome, each ``searcher_<i>`` with ``outcome * usefulness`` (a searcher
whose note the answer did not use gets nothing for a right answer). Custom advantage bypasses
GRPO's normalization, so it is done here: each context name's credits are centered over the
Group's Sessions that exported that name (a Session whose model planned three searches has a
``searcher_2`` that others may lack). A Group whose credits are all equal gets zeros.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any


def raw_credit(name: str | None, meta: dict[str, Any]) -> float:
    outcome = float(meta["outcome"])
    return outcome if name == "main" else outcome * float(meta.get("usefulness", 0.0))


def credit(metadata_by_slot: list[dict[str | None, dict[str, Any]]]) -> list[dict[str | None, float]]:
    raw = [{name: raw_credit(name, meta) for name, meta in slot.items()} for slot in metadata_by_slot]
    by_name: dict[str | None, list[float]] = defaultdict(list)
    for slot in raw:
        for name, value in slot.items():
            by_name[name].append(value)
    means = {name: sum(values) / len(values) for name, values in by_name.items()}
    return [{name: value - means[name] for name, value in slot.items()} for slot in raw]
