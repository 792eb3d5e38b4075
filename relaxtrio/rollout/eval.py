"""Evaluation over the rollout pipeline: eval Groups run next to the resident train Groups.

Datasets run one after another, the Groups of one dataset concurrently. Per dataset d, at most
``C_d = agentic_eval_concurrency or ceil(T / G_d)`` eval Groups run at once
(T = agentic_concurrency × n_samples_per_prompt, G_d the dataset's Sessions per prompt). Train
Groups stay as they are meanwhile: paused (partial rollout), generating (fully async) or
prelaunched. Eval Groups take no train permit and are never trained on; a failed eval Session
is counted and its siblings still count (an eval Group is not trained on as a whole).

Metrics per dataset (``eval/<name>/...``): ``reward_mean``, ``num_samples``, ``dropped_groups``,
``failed_sessions``, ``raw_reward`` and ``<field>/mean|median|max|min`` of reward objects, and
with ``--log-passrate`` ``pass@k`` (a failed Session counts as a failure).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from .._errors import ExportError
from ..config import RolloutConfig
from ..nursery.group import Group
from .advantages import primary_rewards
from .dataset import Prompt
from .dumps import step_dump, write_dump
from .pipeline import RolloutPipeline
from .rewards import passrate_metrics, reward_metrics
from .step import ScoredGroup, StepResult, score_group

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class EvalDataset:
    """One evaluation dataset.

    Attributes:
        name: metric prefix (``eval/<name>/...``).
        prompts: its rows.
        n_samples_per_prompt: Sessions per eval Group (G_d of the capacity formula).
        max_context_tokens: training-token limit of its Sessions' lineages
            (``--eval-max-context-len``); None: the pipeline's (train) limit.
    """

    name: str
    prompts: tuple[Prompt, ...]
    n_samples_per_prompt: int = 1
    max_context_tokens: int | None = None


async def run_eval(pipeline: RolloutPipeline, datasets: Sequence[EvalDataset], *,
                   dump_path: Path | None = None) -> dict[str, float]:
    """Runs each eval dataset in turn (datasets serially, Groups concurrently).

    Args:
        pipeline: the run's pipeline (its current step names the eval).
        datasets: the eval datasets.
        dump_path: where to write the eval's debug dump (docs/dumps.md; its ``rollout_id`` is
            ``eval_<step>``), or None.

    Returns:
        Per dataset the metrics of the module docstring.

    Raises:
        BackendError: the engine failed during a dataset.

    Cancellation:
        Cancelling terminates the running eval Groups' agents (shielded, bounded).
    """
    started = time.monotonic()
    metrics: dict[str, float] = {}
    scored: list[ScoredGroup] = []
    dropped: list[Group] = []
    sections: dict[str, Any] = {}
    for dataset in datasets:
        groups = await _run_dataset(pipeline, dataset)
        pipeline.raise_if_engine_failed()
        accepted = await _score_dataset(groups, pipeline.config)
        found = dataset_metrics(dataset.name, groups, accepted, pipeline.config)
        metrics.update(found)
        scored += accepted
        dropped += [g for g in groups if g.dropped]
        sections[dataset.name] = {"group_ids": [g.group_id for g in groups], "metrics": found}
    if dump_path is not None:
        result = StepResult(rollout_id=pipeline.rollout_id, groups=tuple(scored), dropped=tuple(dropped),
                            rollout_s=time.monotonic() - started)
        document = step_dump(result, rollout_id=f"eval_{pipeline.rollout_id}", eval=sections)
        await trio.to_thread.run_sync(write_dump, dump_path, document)
    return metrics


async def _run_dataset(pipeline: RolloutPipeline, dataset: EvalDataset) -> list[Group]:
    """Runs every prompt of ``dataset`` as an eval Group, ``C_d`` at a time.

    Cancellation:
        Cancelling terminates the running eval Groups' agents (shielded, bounded).
    """
    config = pipeline.config
    total_train = config.concurrency * config.n_samples_per_prompt
    g = dataset.n_samples_per_prompt
    limit = trio.Semaphore(pipeline.eval_concurrency or max(math.ceil(total_train / g), 1))
    groups: list[Group] = []
    async with trio.open_nursery() as nursery:
        for prompt in dataset.prompts:
            await limit.acquire()
            group = pipeline.make_group(prompt, "eval", g, max_context_tokens=dataset.max_context_tokens)
            groups.append(group)
            if group.dropped:
                limit.release()
                continue
            group.lease(pipeline.rollout_id)
            nursery.start_soon(_run_group, pipeline, group, limit)
    return groups


async def _run_group(pipeline: RolloutPipeline, group: Group, limit: trio.Semaphore) -> None:
    released = False

    def release() -> None:  # once: when the Sessions ended (reward work is outside C_d), or on failure
        nonlocal released
        if not released:
            released = True
            limit.release()

    try:
        await pipeline.run_group(group, sessions_ended=release)
    finally:
        release()


async def _score_dataset(groups: Sequence[Group], config: RolloutConfig) -> list[ScoredGroup]:
    """The scored eval Groups; one that cannot be scored is dropped with the reason."""
    accepted: list[ScoredGroup] = []
    for group in groups:
        if group.dropped:
            continue
        try:
            scored = await score_group(group, config)
        except ExportError as exc:
            group.dropped_reason = str(exc)
            log.warning("eval group %s not scored: %s", group.group_id, exc)
            continue
        assert isinstance(scored, ScoredGroup)  # eval Groups are never filtered
        accepted.append(scored)
    return accepted


def dataset_metrics(name: str, groups: Sequence[Group], accepted: Sequence[ScoredGroup],
                    config: RolloutConfig) -> dict[str, float]:
    """One eval dataset's metrics (``eval/<name>/...``, see the module docstring).

    Args:
        name: the dataset.
        groups: every eval Group it ran (dropped ones included).
        accepted: the scored ones among them.
        config: ``reward_key`` / ``eval_reward_key`` and ``log_passrate``.
    """
    prefix = f"eval/{name}/"
    rewards = [s.reward for g in accepted for s in g.scored if s.reward is not None]
    out = {
        f"{prefix}reward_mean": sum(rewards) / len(rewards) if rewards else float("nan"),
        f"{prefix}num_samples": float(len(rewards)),
        f"{prefix}dropped_groups": float(sum(g.dropped for g in groups)),
        f"{prefix}failed_sessions": float(sum(s.status in ("failed", "cancelled")
                                              for g in groups if not g.dropped for s in g.sessions)),
    }
    key = config.eval_reward_key if config.eval_reward_key is not None else config.reward_key
    samples = [s.sample for g in accepted for s in g.scored]
    out.update(reward_metrics(samples, key, prefix=prefix))
    if config.log_passrate:
        out.update(passrate_metrics([_session_outcomes(g.group, key) for g in accepted], prefix=prefix))
    return out


def _session_outcomes(group: Group, key: str | None) -> list[list[float | None]]:
    """Per Session, the primary reward of each exported context; a failed Session is one 0."""
    return [[0.0] if session.status in ("failed", "cancelled") else primary_rewards(session.samples, key)
            for session in group.sessions]
