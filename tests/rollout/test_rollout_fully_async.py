"""Fully async (docs/scheduling.md#fully-async): the staleness bound in weight versions, Groups
waiting for weights with their budgets paused, the rollout running ahead, the final backfill."""

from __future__ import annotations

import attrs
import pytest
from tests.support.groups import group_of

from relaxtrio import ConfigError
from relaxtrio.config import RolloutConfig
from relaxtrio.forest import WeightSpan
from relaxtrio.nursery.group import Group
from relaxtrio.rollout.accounting import group_stages
from relaxtrio.rollout.fully_async import WeightWindow, version_index
from relaxtrio.rollout.step import group_metrics
from relaxtrio.rollout.step_book import StepBook


def _versioned(group: Group, *labels_per_session: tuple[str, ...]) -> Group:
    """Gives each Session's samples spans sampled by the labelled weight versions."""
    for session, labels in zip(group.sessions, labels_per_session, strict=True):
        session.samples[:] = [attrs.evolve(s, weight_versions=tuple(
            WeightSpan(label, i, i + 1) for i, label in enumerate(labels))) for s in session.samples]
    return group


def test_version_index_reads_step_labels_and_maps_others_to_the_start() -> None:
    assert version_index("step-3") == 3
    assert version_index("default", start=5) == 5
    assert version_index("step-3x", start=1) == 1


def test_sample_older_than_the_bound_is_dropped_and_counted() -> None:
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=2, max_staleness=1,
                           show_progress=False)
    weights = WeightWindow(max_staleness=1, loaded=3)  # step 3 trains policy version 3
    fresh = _versioned(group_of([[1.0], [0.0]]), ("step-3",), ("step-2", "step-3"))
    stale = _versioned(group_of([[1.0], [0.0]]), ("step-1", "step-2"), ("step-1",))
    book = StepBook.open(3, config, group_stages([], []), warnings_before=0, backfilled=0)
    assert book.file(fresh, config, weights) is not None
    assert book.file(stale, config, weights) is None
    assert stale.dropped_reason is not None and "stale" in stale.dropped_reason
    assert "weight version 1, 2 versions behind" in stale.dropped_reason
    result = book.result(aborted=0, stages=group_stages([], []), barrier_warnings=0)
    assert result.dropped == (stale,)
    metrics = group_metrics(result, config)
    assert metrics["stale_groups"] == 1.0 and metrics["stale_samples"] == 2.0
    assert metrics["dropped_groups"] == 1.0 and metrics["num_groups"] == 1.0


def test_without_a_bound_no_sample_is_stale() -> None:
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, show_progress=False)
    old = _versioned(group_of([[1.0]]), ("step-0",))
    book = StepBook.open(9, config, group_stages([], []), warnings_before=0, backfilled=0)
    assert book.file(old, config, WeightWindow(loaded=9)) is not None
    assert book.stale_groups == 0


def test_max_staleness_must_not_be_negative() -> None:
    with pytest.raises(ConfigError, match="max_staleness"):
        RolloutConfig(max_staleness=-1)
