"""Custom advantage functions used by tests (loaded by dotted path)."""

from __future__ import annotations


def outcome_times_usefulness(metadata_by_slot):
    """main gets the outcome; each searcher gets outcome × usefulness.

    The example of docs/export-and-credit.md#custom-advantage.
    """
    out = []
    for slot in metadata_by_slot:
        outcome = slot["main"]["outcome"]
        out.append({name: outcome if name == "main" else outcome * meta["usefulness"]
                    for name, meta in slot.items()})
    return out


def filter_all(metadata_by_slot):
    return None


def missing_name(metadata_by_slot):
    return [{"main": 1.0} for _ in metadata_by_slot]


def not_finite(metadata_by_slot):
    return [{name: float("nan") for name in slot} for slot in metadata_by_slot]


def per_leaf(metadata_by_slot):
    """Credit for ``all-leaves`` export: only the third leaf (the last retry's answer) counts."""
    return [{name: 1.0 if name == "leaf-2" else 0.0 for name in slot} for slot in metadata_by_slot]
