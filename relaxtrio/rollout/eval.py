"""Evaluation over the rollout pipeline: eval Groups run next to the resident train Groups.

Datasets run one after another, the Groups of one dataset concurrently. Per dataset d, at most
``C_d = agentic_eval_concurrency or ceil(T / G_d)`` eval Groups run at once
(T = agentic_concurrency × n_samples_per_prompt, G_d the dataset's Sessions per prompt). Train
Groups stay as they are meanwhile: paused (partial rollout), generating (fully async) or
prelaunched. Eval Groups take no train permit and are never trained on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import attrs
import trio

from .._errors import ExportError
from ..config import RolloutConfig
from ..nursery.group import Group
from .dataset import Prompt
from .pipeline import RolloutPipeline
from .step import ScoredGroup, score_group

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class EvalDataset:
    """One evaluation dataset.

    Attributes:
        name: metric prefix (``eval/<name>/...``).
        prompts: its rows.
        n_samples_per_prompt: Sessions per eval Group (G_d of the capacity formula).
    """

    name: str
    prompts: tuple[Prompt, ...]
    n_samples_per_prompt: int = 1


async def run_eval(pipeline: RolloutPipeline, datasets: Sequence[EvalDataset]) -> dict[str, float]:
    """Runs each eval dataset in turn (datasets serially, Groups concurrently).

    Returns:
        ``eval/<name>/reward_mean``, ``.../num_samples`` and ``.../dropped_groups`` per dataset.

    Raises:
        BackendError: the engine failed during a dataset.

    Cancellation:
        Cancelling terminates the running eval Groups' agents (shielded, bounded).
    """
    metrics: dict[str, float] = {}
    for dataset in datasets:
        groups = await _run_dataset(pipeline, dataset)
        pipeline.raise_if_engine_failed()
        metrics.update(await _dataset_metrics(dataset.name, groups, pipeline.config))
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
            group = pipeline.make_group(prompt, "eval", g)
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


async def _dataset_metrics(name: str, groups: Sequence[Group], config: RolloutConfig) -> dict[str, float]:
    rewards: list[float] = []
    dropped = 0
    for group in groups:
        try:
            if not group.dropped:
                scored = await score_group(group, config)
                assert isinstance(scored, ScoredGroup)  # eval Groups are never filtered
                rewards.extend(s.reward for s in scored.scored if s.reward is not None)
            dropped += group.dropped
        except ExportError as exc:
            log.warning("eval group %s not scored: %s", group.group_id, exc)
            dropped += 1
    prefix = f"eval/{name}"
    return {
        f"{prefix}/reward_mean": sum(rewards) / len(rewards) if rewards else float("nan"),
        f"{prefix}/num_samples": float(len(rewards)),
        f"{prefix}/dropped_groups": float(dropped),
    }
