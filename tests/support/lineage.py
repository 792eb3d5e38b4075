"""Lineage token ids for tests that check what export or a turn produced against the forest."""

from __future__ import annotations

from itertools import chain

from relaxtrio.forest import SessionForest


def train_token_ids(forest: SessionForest, node) -> tuple[int, ...]:
    """``[T]`` training ids of ``node``'s lineage: its nodes' training deltas, root first."""
    return tuple(chain.from_iterable(n.token_ids for n in forest.lineage(node)))
