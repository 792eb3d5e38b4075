"""One step of the training job: a rollout step, the policy update, the weight push, the step's
sample and dump files and the optional eval, reported as one metrics row.

:mod:`relaxtrio.run.driver` runs the steps in order; this module owns what happens inside one.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from pathlib import Path
from typing import Any

import attrs
import trio

from ..config import TrainRunConfig
from ..cpu_threads import ThreadSplit
from ..rollout.dumps import append_samples, dump_path, step_dump, step_samples, write_dump
from ..rollout.eval import EvalDataset, run_eval
from ..rollout.fully_async import backfill_ahead
from ..rollout.operator_view import RunView
from ..rollout.pipeline import RolloutPipeline
from ..rollout.step import StepResult, group_metrics
from ..train import Trainer, TrainStats
from ..train.ranks import RankGroup
from .checkpoint import weight_version_name
from .inference import Inference
from .learning_signal import check_learning_signal

log = logging.getLogger(__name__)

__all__ = ["StepOutputs", "optional_train_metrics", "push_trainer_weights", "train_step"]


_OPTIONAL_TRAIN_METRICS = (
    "kl_loss", "reward_shaping_kl", "dual_clip_fraction", "tis_weight_mean", "tis_clip_fraction",
    "icepop_masked_fraction", "opsm_masked_fraction", "advantage_mean", "advantage_std",
)


def optional_train_metrics(stats: TrainStats) -> dict[str, float]:
    """The step's metrics that only some configurations produce (finite values only).

    The three meanings of KL stay apart: ``ppo_kl`` (old/current ratio, always logged),
    ``kl_loss`` (``--use-kl-loss``) and ``reward_shaping_kl`` (``--kl-coef``).
    """
    out = {name: getattr(stats, name) for name in _OPTIONAL_TRAIN_METRICS
           if math.isfinite(getattr(stats, name))}
    if stats.offpolicy_masked_tokens:
        out["offpolicy_masked_tokens"] = float(stats.offpolicy_masked_tokens)
    return out


@attrs.frozen(kw_only=True)
class StepOutputs:
    """Where a step's samples and dumps go (see :class:`TrainRunConfig`)."""

    model_dir: Path
    samples_path: Path | None
    dump_template: str | None

    @classmethod
    def fresh(cls, cfg: TrainRunConfig, model_dir: Path) -> StepOutputs:
        """The run's outputs; a rollout-only samples file starts empty."""
        samples_path = cfg.rollout_samples_path if cfg.rollout_only else None
        if samples_path is not None:
            samples_path.parent.mkdir(parents=True, exist_ok=True)
            samples_path.write_text("", encoding="utf-8")
        return cls(model_dir=model_dir, samples_path=samples_path, dump_template=cfg.debug_rollout_data)

    def eval_dump_path(self, rollout_id: int) -> Path | None:
        """Where the eval after step ``rollout_id`` writes its dump (``eval_<id>``), or None."""
        return None if self.dump_template is None else dump_path(self.dump_template, f"eval_{rollout_id}")

    def write(self, cfg: TrainRunConfig, result: StepResult, trainer: Trainer | RankGroup | None,
              stats: Any) -> None:
        """Appends the rollout-only samples and writes the step's debug dump (blocking I/O)."""
        if self.samples_path is not None:
            append_samples(self.samples_path, result.rollout_id, step_samples(result))
        if self.dump_template is None:
            return
        path = write_dump(dump_path(self.dump_template, result.rollout_id), step_dump(
            result,
            model_dir=str(self.model_dir),
            generation=attrs.asdict(cfg.generation),
            rollout_config={"n_samples_per_prompt": cfg.rollout.n_samples_per_prompt,
                            "reward_key": cfg.rollout.reward_key,
                            "custom_advantage": cfg.rollout.custom_advantage is not None,
                            "advantage_estimator": cfg.rollout.advantage_estimator,
                            "grpo_std_normalization": cfg.rollout.grpo_std_normalization},
            trainer_config=None if trainer is None else attrs.asdict(trainer.config),
            train=None if stats is None else attrs.asdict(stats),
        ))
        log.info("rollout %d debug dump: %s", result.rollout_id, path)


async def train_step(
    cfg: TrainRunConfig,
    pipeline: RolloutPipeline,
    trainer: Trainer | RankGroup | None,
    inference: Inference,
    rollout_id: int,
    eval_sets: tuple[EvalDataset, ...],
    outputs: StepOutputs,
    view: RunView,
    split: ThreadSplit,
) -> dict[str, Any]:
    """One rollout step, one update (none when ``trainer`` is None: rollout only), the weight
    push, the step's samples/dump files and the optional eval; returns metrics (and shows the
    step on the operator dashboard).

    A fully async step that closed short is completed first (``RolloutPipeline.settle``: the
    next Groups to finish pay its carried debt, ``debt_wait_s``) while the rollout goes on.
    Timings in the row (wall seconds): ``rollout_s``; ``train_s`` from the update's start to the
    engines running the new weights, split into ``update_s`` (``Trainer.train_step``) and
    ``weight_sync_s`` (writing the weights, then pause, reload and continue on every worker; of
    it ``weight_pause_s``, from the pause to the continue); ``eval_s``; ``step_s`` for all of
    it. A trained step also gets ``step_cannot_teach`` (and one WARNING when its update had no
    learning signal: :mod:`relaxtrio.run.learning_signal`). A CPU trainer in this process trains with its share of
    the cores while train Groups use the CPU, and with ``split.trainer_solo_threads`` once none
    does (none resident, or only prelaunched ones whose agents all wait for their lease:
    ``RolloutPipeline.groups_use_cpu``; :mod:`relaxtrio.cpu_threads`)."""
    step_start = time.monotonic()
    last = rollout_id == cfg.num_rollout - 1
    result = await pipeline.run_step(rollout_id, last=last, steps_left=cfg.num_rollout - 1 - rollout_id)
    if cfg.rollout.fully_async and not last:  # the next steps generate while this one trains
        backfill_ahead(pipeline, rollout_id, steps_left=cfg.num_rollout - 1 - rollout_id)
        result = await pipeline.settle(result)  # closed short: the next Groups to finish fill it
    row: dict[str, Any] = dict(group_metrics(result, cfg.rollout))
    stats = None
    if result.samples and trainer is not None:
        cfg.train.refuse_multi_context(result.contexts_per_session, rollout_id)
        train_start = time.monotonic()
        if isinstance(trainer, Trainer):
            threads = split.update_threads(busy=lambda: pipeline.groups_use_cpu)
            update = functools.partial(trainer.train_step, threads=threads)
        else:
            update = trainer.train_step
        stats = await trio.to_thread.run_sync(update, result.scored)
        push_start = time.monotonic()
        with pipeline.weights.pushing(pipeline.resident_groups):  # requests wait for the weights
            row["weight_sync_s"] = await push_trainer_weights(
                inference, trainer, weight_version_name(rollout_id))
        pipeline.weights.loaded_version(rollout_id + 1, pipeline.resident_groups, next_step=rollout_id + 1)
        row["weight_pause_s"] = inference.pause_seconds[-1]  # pause -> resume, without the write
        push_end = time.monotonic()
        row.update(
            loss=stats.loss, clip_fraction=stats.clip_fraction, ppo_kl=stats.ppo_kl,
            grad_norm=stats.grad_norm, entropy=stats.entropy,
            rollout_logprob_abs_diff=stats.rollout_logprob_abs_diff,
            train_tokens=stats.num_tokens, train_s=push_end - train_start,
            update_s=push_start - train_start,
        )
        row.update(optional_train_metrics(stats))
        row.update(check_learning_signal(result, stats))
    elif not result.samples:
        log.warning("rollout %d produced no samples; skipping the update", rollout_id)
    await trio.to_thread.run_sync(outputs.write, cfg, result, trainer, stats)
    if eval_sets and cfg.eval.interval and (rollout_id + 1) % cfg.eval.interval == 0:
        eval_start = time.monotonic()
        row.update(await run_eval(pipeline, eval_sets, dump_path=outputs.eval_dump_path(rollout_id)))
        row["eval_s"] = time.monotonic() - eval_start
    row.update(await inference.fleet.gateway_metrics())  # the gateway's counts per worker
    row.update(await inference.fleet.engine_counters.read(inference.fleet.workers))  # each engine's own
    row["step_s"] = time.monotonic() - step_start
    view.note_step(result, step_s=row["step_s"])
    return row


async def push_trainer_weights(inference: Inference, trainer: Trainer | RankGroup, version: str) -> float:
    """Push the trainer's current weights to every worker as ``version``; returns seconds."""
    if isinstance(trainer, RankGroup):
        return await inference.push_saved(trainer.save_weights, version)
    model, state_dict = trainer.engine_weights()  # LoRA: the base model and the merged weights
    return await inference.push(model, version, state_dict=state_dict)
