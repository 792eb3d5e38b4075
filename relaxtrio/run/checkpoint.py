"""Checkpoint and resume of a training run: ``--save DIR``, ``--save-interval N``, ``--load DIR``.

The files and how they are written (atomically: temp dir, fsync, rename, then the ``latest``
pointer) are described in :mod:`relaxtrio.train.checkpoint`. This module decides what a
checkpoint holds and puts it back. A checkpoint is taken between steps, after step ``k - 1``'s
update, weight push, eval and metrics row (``iter_<k>``), and holds:

- the policy weights, the AdamW state and the trainer's own state (step count, minibatch
  shuffling RNG; the LR is constant, so there is no scheduler state) and the process's global
  RNG states (Python, torch, NumPy when loaded);
- ``rollout``: the next rollout id ``k``, the prompt stream's cursor (epoch, the rest of the
  epoch's order, requeued prompts) and the Groups that were resident (see
  :mod:`relaxtrio.rollout.resume`: dropped on resume with a logged count and the
  ``resume_dropped_groups`` / ``resume_dropped_sessions`` metrics, prompts rerun); after the
  last step also the run-end Groups (dropped by the last step, prompts requeued so that a run
  extended with a larger ``--num-rollout`` trains them, ``resume_requeued_groups``);
- ``weight_version``: the version last pushed to the engines (None: the initial weights);
- ``metrics``: every metrics row written so far;
- ``run``: the output directory, the prompt file's path and SHA-256, ``num_rollout``, the
  step shape (``shape``: ``--rollout-batch-size``, ``--n-samples-per-prompt``,
  ``--over-sampling-batch-size``; a resume with other values logs a warning for each) and the
  base model (``model``: the ``--hf-checkpoint`` directory and the SHA-256 of its
  ``config.json``; a resume from another architecture is refused, from another directory of the
  same architecture warned about: the engines start from it and the KL reference is it).

A checkpoint that cannot be written (a full disk) stops the run with
:class:`~relaxtrio.CheckpointError`, saying how much space is left and which earlier checkpoint
is intact; one that cannot be read on resume (a missing or truncated file) is refused with a
:class:`~relaxtrio.ConfigError` naming it and any earlier complete checkpoint beside it.

Resuming (``--load DIR``):

1. the checkpoint is :func:`~relaxtrio.train.checkpoint.find_run_checkpoint` of ``DIR``; when
   there is none, the run starts from the beginning (a warning), so ``--save D --load D`` can
   be passed from the very first run;
2. without ``--output-dir`` the run continues in the checkpointed run's output directory;
3. the trainer loads the checkpoint's weights, optimizer and RNG states;
4. ``metrics.jsonl`` is rewritten to exactly the saved rows (rows the interrupted run wrote
   after the checkpoint are removed, and the steps run again), then appended to;
5. the prompt stream continues at the saved cursor, with the held Groups' prompts first;
6. before step ``k`` the engines load the checkpoint's weights under the saved weight version;
7. the loop runs steps ``k .. num_rollout - 1``.

Rollouts repeat exactly only when sampling is seeded per Session
(``--sglang-enable-deterministic-inference``: ``sampling_seed = rollout_seed + sample index``;
external SGLang servers must also run with ``--enable-deterministic-inference``) and the agent
and reward are deterministic; unseeded requests draw their seeds from the OS, which no checkpoint
can replay.

The directories around it (finding the ``--load`` checkpoint, refusing ``--load`` / ``--save``
pairs that mix runs, one run per directory) are :mod:`relaxtrio.run.run_dirs`.

May import: config, rollout, train (torch), trio. Used by :mod:`relaxtrio.run.driver`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from .._errors import CheckpointError, ConfigError, RelaxError
from ..config import TrainRunConfig
from ..rollout.dataset import PromptStream
from ..rollout.metrics import MetricsLog
from ..rollout.resume import RolloutCheckpoint, capture_pipeline, restore_rollout
from ..train import Trainer
from ..train.checkpoint import find_run_checkpoint, restore_rng_state
from ..train.ranks import LocalRankGroup, RankGroup, RankStart
from .run_dirs import ResumePoint as ResumePoint
from .run_dirs import find_resume_point as find_resume_point
from .run_dirs import unreadable

if TYPE_CHECKING:
    from ..rollout.pipeline import RolloutPipeline

log = logging.getLogger(__name__)

__all__ = ["ResumePoint", "RunCheckpointer", "find_resume_point", "weight_version_name"]


def weight_version_name(rollout_id: int) -> str:
    """The weight version pushed to the engines after step ``rollout_id``'s update."""
    return f"step-{rollout_id + 1}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@attrs.define(eq=False, kw_only=True)
class RunCheckpointer:
    """The driver's checkpoint/resume steps, in the order the driver calls them.

    Attributes:
        config: the run configuration (``save_dir``, ``save_interval``, ``load_dir``).
        resume: the checkpoint this run resumes from, or None for a fresh start.
        weight_version: the version the engines hold (the last pushed, or the resumed one).
        saved_groups: the run-end Groups whose prompts the last checkpoint written saved for an
            extension of the run (non-zero only after the last step's checkpoint).
    """

    config: TrainRunConfig
    resume: ResumePoint | None = None
    weight_version: str | None = None
    saved_groups: int = 0
    _first_row_extra: dict[str, float] = attrs.field(factory=dict)
    _prompt_data_sha256: str | None = None
    _model: dict[str, str | None] | None = None

    @classmethod
    def open(cls, config: TrainRunConfig) -> RunCheckpointer:
        """Finds the resume point of ``config.load_dir`` (if any).

        Raises:
            ConfigError: as :func:`find_resume_point`.
        """
        resume = find_resume_point(config.load_dir)
        if resume is not None:
            log.info("resuming from %s at rollout %d", resume.checkpoint_dir, resume.steps_done)
            if config.generation.seed is None or not config.generation.seed_per_sample:
                log.warning("resume: sampling is not seeded per Session (pass "
                            "--sglang-enable-deterministic-inference), so rollouts after the "
                            "resume differ from those of an uninterrupted run")
        return cls(config=config, resume=resume,
                   weight_version=resume.state.get("weight_version") if resume else None)

    @property
    def first_rollout_id(self) -> int:
        """The rollout id the loop starts with."""
        return self.resume.steps_done if self.resume is not None else 0

    def open_metrics(self, path: Path) -> MetricsLog:
        """A fresh metrics log, or the resumed run's rows rewritten to ``path`` and continued."""
        if self.resume is None:
            return MetricsLog.fresh(path)
        rows = list(self.resume.state.get("metrics", ()))
        if path.is_file():
            extra = sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
            if extra > len(rows):
                log.info("resume: %s: removing %d rows written after the checkpoint (those steps "
                         "run again)", path, extra - len(rows))
        return MetricsLog.resumed(path, rows)

    def restore_prompts(self, prompts: PromptStream) -> None:
        """Moves the prompt stream to the checkpoint's cursor (no-op on a fresh start).

        Raises:
            ConfigError: the prompt file has a different number of prompts.
        """
        if self.resume is None:
            return
        run = self.resume.state.get("run", {})
        saved = run.get("prompt_data_sha256")
        self._prompt_data_sha256 = _sha256(self.config.prompt_data)
        if saved is not None and saved != self._prompt_data_sha256:
            path, was = self.config.prompt_data.resolve(), run.get("prompt_data")
            what = ("changed since the checkpoint was written" if was in (None, str(path))
                    else f"is not the file the checkpoint's run read ({was}) and its rows differ")
            log.warning("resume: --prompt-data %s %s: the saved cursor indexes this file's rows "
                        "(same count), so the prompts after the resume are not the ones the "
                        "interrupted run would have trained", path, what)
        for flag, (was, now) in _shape_changes(self.resume.state.get("run", {}).get("shape"),
                                               _run_shape(self.config)).items():
            log.warning("resume: %s is %s, the checkpoint's run used %s: the run continues in "
                        "this run's shape, so its steps after the resume are not the ones the "
                        "interrupted run would have run (the prompt order is kept)", flag, now, was)
        checkpoint = RolloutCheckpoint.from_json(self.resume.state["rollout"])
        self._first_row_extra = restore_rollout(prompts, checkpoint)

    def load_trainer(self, model_dir: Path) -> Trainer | RankGroup:
        """The trainer: from ``model_dir``, or the checkpoint's weights, optimizer and RNG states.

        One process (the default) trains in the driver; with ``world_size > 1`` the trainer is a
        :class:`~relaxtrio.train.ranks.RankGroup` of FSDP2 ranks (local processes, or Ray
        actors with ``ray_address``), which the caller must close. Either resumes a checkpoint
        written by either (``optimizer.pt`` of one process, ``optimizer.dcp/`` of any W: see
        :mod:`relaxtrio.train.optim_state`).

        Blocking (torch); call it through ``trio.to_thread.run_sync``.

        Raises:
            TrainerRankError: a rank failed to start (also when its checkpoint did not load).
            ConfigError: the checkpoint's optimizer state belongs to another model.
        """
        dist = self.config.distributed
        train_cfg = self.config.trainer_config
        self._model = _model_identity(model_dir)
        if self.resume is not None:
            _check_model(self.resume, self._model)
        source = model_dir if self.resume is None else self.resume.checkpoint_dir
        trainer_state = None if self.resume is None else self.resume.state["trainer"]
        trainer: Trainer | RankGroup
        if dist.ray_address is not None or dist.world_size > 1:
            # The KL reference stays the initial policy (model_dir), as in one process.
            start = RankStart(model_dir=source, config=train_cfg, resume_state=trainer_state,
                              reference_dir=model_dir)
            if dist.ray_address is not None:
                from ..cluster.trainer import RayRankGroup

                trainer = RayRankGroup.start(start, dist)
            else:
                trainer = LocalRankGroup.start(start, dist)
        elif self.resume is None:
            trainer = Trainer.from_pretrained(model_dir, train_cfg)
        else:
            try:
                # The KL reference stays the initial policy (model_dir), not the resumed weights.
                trainer = Trainer.from_pretrained(source, train_cfg, reference_dir=model_dir)
                trainer.load_resume_state(source, trainer_state)
            except RelaxError:
                raise
            except Exception as exc:  # a missing or truncated file: OSError, torch's, safetensors'
                log.debug("loading checkpoint %s failed", source, exc_info=True)
                raise ConfigError(unreadable(self.resume.checkpoint_dir, exc), param="load") from exc
        if self.resume is not None:
            restore_rng_state(self.resume.state["rng"])
        return trainer

    def note_step(self, rollout_id: int, row: dict[str, Any]) -> None:
        """Records the step's weight push and adds the resume metrics to the first resumed row."""
        if "loss" in row:
            self.weight_version = weight_version_name(rollout_id)
        row.update(self._first_row_extra)
        self._first_row_extra = {}

    def save_due(self, rollout_id: int) -> bool:
        """Whether a checkpoint is written after step ``rollout_id``: every ``save_interval``
        steps, and after the last step, when ``--save`` is set."""
        cfg = self.config
        if cfg.save_dir is None:
            return False
        interval = cfg.save_interval
        return rollout_id == cfg.num_rollout - 1 or bool(interval and (rollout_id + 1) % interval == 0)

    async def save(
        self,
        rollout_id: int,
        *,
        trainer: Trainer | RankGroup,
        pipeline: RolloutPipeline,
        metrics: MetricsLog,
        tokenizer_dir: Path | None,
    ) -> Path:
        """Writes the checkpoint taken after step ``rollout_id`` to ``save_dir/iter_<id + 1>``.

        Args:
            rollout_id: the step just finished (its metrics row already appended).
            trainer: the trainer (not used by anything else meanwhile).
            pipeline: the rollout pipeline, for its prompt stream and held Groups.
            metrics: the metrics log so far.
            tokenizer_dir: copied into the checkpoint so it is a complete model directory.

        Returns:
            The checkpoint directory.

        Cancellation:
            The rollout state is captured on the trio thread first; the files are written in
            a worker thread, which a cancel waits for. An interrupted write leaves only a
            temporary directory; the previous checkpoint stays the ``latest``.
        """
        cfg = self.config
        assert cfg.save_dir is not None
        steps_done = rollout_id + 1
        rollout = capture_pipeline(pipeline, next_rollout_id=steps_done)
        if self._prompt_data_sha256 is None:
            self._prompt_data_sha256 = await trio.to_thread.run_sync(_sha256, cfg.prompt_data)
        state = {
            "rollout": rollout.to_json(),
            "weight_version": self.weight_version,
            "metrics": [dict(row) for row in metrics.rows],
            "run": {"output_dir": str(cfg.output_dir.resolve()),
                    "prompt_data": str(cfg.prompt_data.resolve()),
                    "prompt_data_sha256": self._prompt_data_sha256,
                    "num_rollout": cfg.num_rollout,
                    "shape": _run_shape(cfg),
                    **({"model": self._model} if self._model is not None else {})},
        }

        def write() -> Path:
            return trainer.save_run_checkpoint(
                cfg.save_dir, steps_done, state=state, tokenizer_dir=tokenizer_dir,
                keep=cfg.keep_checkpoints,
            )

        start = time.monotonic()
        try:
            path = await trio.to_thread.run_sync(write)
        except RelaxError:
            raise
        except Exception as exc:  # ENOSPC, EACCES, torch's and safetensors' own write errors
            log.debug("writing the checkpoint after step %d failed", rollout_id, exc_info=True)
            raise CheckpointError(_write_failure(cfg.save_dir, rollout_id, exc)) from exc
        self.saved_groups = rollout.run_end_groups
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        notes = []
        if rollout.held_groups:
            notes.append(f"{rollout.held_groups} resident Groups cannot be saved and are rerun on "
                         "resume")
        if rollout.run_end_groups:
            notes.append(f"the prompts {list(rollout.run_end_prompts)} of {rollout.run_end_groups} "
                         "Groups the last step dropped are requeued for an extended run")
        log.info("checkpoint %s written in %.2f s (%.1f MB)%s", path, time.monotonic() - start,
                 size / 1e6, "".join(f"; {note}" for note in notes))
        return path


FULL_DISK_BYTES: Final = 64 * 1024 * 1024
"""Free space under which a failed checkpoint write is reported as a full disk (torch reports
a short write as ``unexpected pos``, not as ENOSPC)."""


def _write_failure(save_dir: Path, rollout_id: int, exc: BaseException) -> str:
    """The message of a checkpoint write that failed: the cause, the free space left, and the
    checkpoint a resume would use instead."""
    text = (f"the checkpoint after step {rollout_id} could not be written to {save_dir}: "
            f"{type(exc).__name__}: {exc}")
    with contextlib.suppress(OSError):
        free = shutil.disk_usage(save_dir).free
        full = getattr(exc, "errno", None) == errno.ENOSPC or free < FULL_DISK_BYTES
        text += f" ({free / 1e6:.1f} MB free there{': the disk is full' if full else ''})"
    previous = find_run_checkpoint(save_dir)
    if previous is None:
        return text + "; no earlier checkpoint is in that directory"
    return (text + f"; the previous checkpoint {previous.name} is intact: free space and resume "
            f"from it with --load {save_dir}")


def _model_identity(model_dir: Path) -> dict[str, str | None]:
    """What a checkpoint records of its run's base model: the directory and the SHA-256 of its
    ``config.json`` (None when it has none)."""
    config = Path(model_dir) / "config.json"
    return {"path": str(Path(model_dir).resolve()),
            "config_sha256": _sha256(config) if config.is_file() else None}


def _check_model(resume: ResumePoint, current: dict[str, str | None]) -> None:
    """Refuses a resume whose base model has another ``config.json`` than the checkpoint's run
    (another architecture: the engines could not load the checkpoint's weights), and warns when
    only its directory differs. Checkpoints written before the model was recorded pass.

    Raises:
        ConfigError: another architecture (param ``--hf-checkpoint``).
    """
    saved = resume.state.get("run", {}).get("model")
    if not isinstance(saved, dict):
        return
    if saved.get("config_sha256") and current["config_sha256"] != saved["config_sha256"]:
        raise ConfigError(
            f"--hf-checkpoint {current['path']} is not the model the checkpoint "
            f"{resume.checkpoint_dir} was trained from ({saved.get('path')}): its config.json "
            "differs; resume with that --hf-checkpoint", param="--hf-checkpoint")
    if saved.get("path") != current["path"]:
        log.warning("resume: --hf-checkpoint %s is not the directory the checkpoint's run used "
                    "(%s; same config.json): the engines start from it and the KL reference is "
                    "it", current["path"], saved.get("path"))


def _run_shape(config: TrainRunConfig) -> dict[str, Any]:
    """The settings that shape each step (Groups, Sessions per Group), by command-line flag;
    the prompt order's own settings are compared by :func:`~relaxtrio.rollout.resume.restore_rollout`."""
    rollout = config.rollout
    return {"--rollout-batch-size": rollout.rollout_batch_size,
            "--n-samples-per-prompt": rollout.n_samples_per_prompt,
            "--over-sampling-batch-size": rollout.over_sampling_batch_size}


def _shape_changes(saved: Any, current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{flag: (checkpoint's value, this run's)}`` for each setting of :func:`_run_shape` that
    differs; nothing for a checkpoint that did not record them (written before they were)."""
    if not isinstance(saved, dict):
        return {}
    return {flag: (saved[flag], value) for flag, value in current.items()
            if flag in saved and saved[flag] != value}
