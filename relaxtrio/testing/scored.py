"""Scored contexts for trainer tests and benchmarks that start from samples and credits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..rollout.scored import ScoredSample

__all__ = ["scored_samples"]


def scored_samples(
    samples: Sequence[Any], advantages: Sequence[float], rewards: Sequence[float | None] | None = None
) -> list[ScoredSample]:
    """Pairs samples with their credits (and rewards, else None), position by position.

    Args:
        samples: ``TrainingSample``-like objects (a test's duck-typed fakes included).
        advantages: one base credit per sample.
        rewards: one scalar reward per sample, or None.

    Raises:
        ValueError: the sequences differ in length.
    """
    rows: Sequence[float | None] = rewards if rewards is not None else [None] * len(samples)
    return [ScoredSample(sample=s, advantage=a, reward=r)
            for s, a, r in zip(samples, advantages, rows, strict=True)]
