"""What a finished run reports: its totals over the whole run and over this process's steps.

A run resumed with ``--load`` continues a ``metrics.jsonl`` whose first rows were written by the
process it resumes (restored from the checkpoint). The whole run's figures are the sums over
every row (what the file says); this process's are the sums over the steps it ran. Both are
logged at the end (``finished: ...``) and returned in :class:`TrainSummary`
(docs/observability.md#a-resumed-runs-figures).

May import: attrs, stdlib, :mod:`relaxtrio._validate`. Used by :mod:`relaxtrio.run.driver` and :mod:`relaxtrio.cli.main`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from .._validate import count

log = logging.getLogger(__name__)

__all__ = ["StepTotals", "TrainSummary", "summarize_run"]


@attrs.frozen(kw_only=True)
class StepTotals:
    """Totals over metrics rows (the sums of their ``num_samples``, ``dropped_groups`` and resume
    counts).

    Attributes:
        steps: rows (steps run).
        trained_steps: steps whose update ran (0 for rollout only).
        num_samples: samples produced.
        dropped_groups: Groups dropped, those dropped at step close included.
        resume_dropped_groups: Groups in flight at a checkpoint that a resume dropped and whose
            prompts ran again (the first resumed row's ``resume_dropped_groups``; not in
            ``dropped_groups``).
        resume_requeued_groups: run-end Groups of a finished run whose prompts its extension
            requeued (``resume_requeued_groups``; already in that run's ``dropped_groups``).
        saved_groups: of ``dropped_groups``, the run-end Groups whose prompts the checkpoint
            written after the last step saved for an extension of the run (not in the rows:
            :func:`summarize_run` sets it).
    """

    steps: int = 0
    trained_steps: int = 0
    num_samples: int = 0
    dropped_groups: int = 0
    resume_dropped_groups: int = 0
    resume_requeued_groups: int = 0
    saved_groups: int = 0

    @classmethod
    def of(cls, rows: Sequence[Mapping[str, Any]]) -> StepTotals:
        """The totals of ``rows`` (``metrics.jsonl`` rows)."""
        def total(key: str) -> int:
            return sum(int(r.get(key) or 0) for r in rows)

        return cls(steps=len(rows), trained_steps=sum(1 for r in rows if r.get("loss") is not None),
                   num_samples=total("num_samples"), dropped_groups=total("dropped_groups"),
                   resume_dropped_groups=total("resume_dropped_groups"),
                   resume_requeued_groups=total("resume_requeued_groups"))

    def describe(self) -> str:
        """``"<trained> of <steps> steps trained, <n> samples, <d> Groups dropped"``, then, each
        only when non-zero, ``" (<s> of them saved for an extension of this run)"``, ``", <r>
        Groups in flight at a checkpoint rerun on resume"`` and ``", <q> Groups from a finished
        run's end requeued on resume"``; each noun singular for a count of 1 (``"1 of 1 step
        trained, 1 sample, 1 Group dropped"``)."""
        text = (f"{self.trained_steps} of {count(self.steps, 'step')} trained, "
                f"{count(self.num_samples, 'sample')}, {_groups(self.dropped_groups)} dropped")
        if self.saved_groups:
            text += f" ({self.saved_groups} of them saved for an extension of this run)"
        if self.resume_dropped_groups:
            text += f", {_groups(self.resume_dropped_groups)} in flight at a checkpoint rerun on resume"
        if self.resume_requeued_groups:
            text += (f", {_groups(self.resume_requeued_groups)} from a finished run's end requeued "
                     "on resume")
        return text


def _groups(n: int) -> str:
    """``"1 Group"``, ``"<n> Groups"``."""
    return count(n, "Group")


def _steps_range(first: int, num_steps: int) -> str:
    """``"step 2"``, ``"steps 2..3"``: the rollout ids ``first .. first + num_steps - 1``."""
    return f"step {first}" if num_steps == 1 else f"steps {first}..{first + num_steps - 1}"


@attrs.frozen(kw_only=True)
class TrainSummary:
    """Where a finished run left its artifacts, and what the run and this process produced.

    A resumed run (``--load``) has two sets of figures: ``run``, the whole run, is the sum of
    every row of ``metrics.jsonl`` (the checkpointed steps of the interrupted or extended run
    included, exactly what the file says); ``this_process`` counts only the steps this process
    ran (rollout ids from ``first_rollout_id`` on). Without ``--load`` both are the same.

    Attributes:
        metrics_path: the per-step metrics JSONL.
        plot_path: the reward plot.
        checkpoint_dir: the final checkpoint; None for a rollout-only run.
        rows: the metric rows (the whole run's).
        run: totals of the whole run (every row of ``metrics.jsonl``).
        this_process: totals of the steps this process ran.
        first_rollout_id: the first step this process ran (0 unless resumed).
        samples_path: the samples JSONL of a rollout-only run, else None.
    """

    metrics_path: Path
    plot_path: Path
    checkpoint_dir: Path | None
    rows: tuple[dict[str, Any], ...]
    run: StepTotals
    this_process: StepTotals
    first_rollout_id: int = 0
    samples_path: Path | None = None

    @property
    def judged(self) -> StepTotals:
        """The figures the command's exit status is decided by (1 when nothing trained): this
        process's steps, or the whole run's when this process had no step left to run."""
        return self.this_process if self.this_process.steps else self.run

    @property
    def trained_steps(self) -> int:
        """Steps of the whole run whose update ran (``run.trained_steps``)."""
        return self.run.trained_steps

    @property
    def num_samples(self) -> int:
        """Samples of the whole run (``run.num_samples``)."""
        return self.run.num_samples


def summarize_run(
    metrics_path: Path,
    rows: Sequence[Mapping[str, Any]],
    *,
    plot_path: Path,
    checkpoint_dir: Path | None,
    first_rollout_id: int = 0,
    samples_path: Path | None = None,
    saved_groups: int = 0,
) -> TrainSummary:
    """The run's summary from its metrics rows, logged as one ``finished: ...`` line.

    Args:
        metrics_path: the run's ``metrics.jsonl``.
        rows: its rows, each with ``step`` (the whole run's, checkpointed steps included).
        plot_path: the reward plot.
        checkpoint_dir: the final checkpoint, or None (rollout only).
        first_rollout_id: the first step this process ran (0 unless resumed).
        samples_path: the samples JSONL of a rollout-only run, else None.
        saved_groups: run-end Groups (counted in the last row's ``dropped_groups``) whose
            prompts this process's checkpoint after the last step saved for an extension of the
            run (``RolloutCheckpoint.run_end_groups``); 0 without one.
    """
    run = StepTotals.of(rows)
    this_process = StepTotals.of([r for r in rows if int(r["step"]) >= first_rollout_id])
    if saved_groups:  # the last row is this process's: it wrote the end-of-run checkpoint
        run = attrs.evolve(run, saved_groups=saved_groups)
        this_process = attrs.evolve(this_process, saved_groups=saved_groups)
    if first_rollout_id and not this_process.steps:
        log.info("finished: no step left to run after step %d; the whole run (metrics.jsonl): %s",
                 first_rollout_id - 1, run.describe())
    elif first_rollout_id:
        log.info("finished: this process (%s): %s; the whole run (metrics.jsonl): %s",
                 _steps_range(first_rollout_id, this_process.steps), this_process.describe(),
                 run.describe())
    else:
        log.info("finished: %s", run.describe())
    return TrainSummary(metrics_path=metrics_path, plot_path=plot_path, checkpoint_dir=checkpoint_dir,
                        rows=tuple(dict(r) for r in rows), run=run, this_process=this_process,
                        first_rollout_id=first_rollout_id, samples_path=samples_path)
