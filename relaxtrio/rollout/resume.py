"""The rollout side of a run checkpoint: the dataset position, and the Groups it cannot hold.

A checkpoint is taken between steps. What the next step needs from the rollout side is where the
prompt stream stands (:meth:`~relaxtrio.rollout.dataset.PromptStream.cursor`: epoch, remaining
order, requeued prompts) and the next rollout id. Groups still resident at that moment
(prelaunched, paused by partial rollout with parked partial generations, or still generating
under fully async) hold live agent processes, open HTTP requests and engine requests, which no
file can hold. They are dropped on resume, counted and logged, and their prompts are put back at
the front of the stream, so a resumed run skips no prompt: it reruns those Groups from the start
at the step where the uninterrupted run would have finished them.

The checkpoint written after the last step is the one a run is *extended* from (the same
``--load``/``--save`` directory with a larger ``--num-rollout``). The last step drops every resident
Group (counted in that step's ``dropped_groups``); those a longer run would have carried into its
next step (:attr:`~relaxtrio.rollout.pipeline.RolloutPipeline.run_end_groups`: fully-async and
partial-rollout Groups, finished or resident, and prelaunched ones) are saved as *run-end* Groups:
their prompts are requeued too, behind the held ones, so the extension trains them first. On
resume they are logged (``event=resume_requeued``) and counted (``resume_requeued_groups``), not
counted as dropped again. A prompt drawn from the dataset is thus trained once, or counted in
``dropped_groups`` (or ``resume_dropped_groups``) each time a Group of it is dropped.

Checkpoints written before run-end Groups existed have no ``run_end_*`` keys and resume as before
(nothing requeued).

May import: rollout, nursery (for types), attrs; no torch, no trio calls.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from .dataset import PromptStream
from .step import agentic_event

if TYPE_CHECKING:
    from ..nursery.group import Group
    from .pipeline import RolloutPipeline

log = logging.getLogger(__name__)

__all__ = ["RolloutCheckpoint", "capture_pipeline", "capture_rollout", "restore_rollout"]


@attrs.frozen(kw_only=True)
class RolloutCheckpoint:
    """The rollout state saved with a run checkpoint.

    Attributes:
        next_rollout_id: the step the resumed run starts with.
        stream: the prompt stream's cursor with the held Groups' prompts first in ``pending``.
        held_groups: Groups resident (or finished but not yet accounted for) at the save;
            dropped on resume, their prompts rerun.
        held_sessions: their Sessions.
        held_prompts: their prompt indices, in the order they were put back.
        run_end_groups: Groups the last step dropped that a longer run would have continued
            (end-of-run checkpoint only; already counted in that step's ``dropped_groups``);
            their prompts are requeued after ``held_prompts``.
        run_end_sessions: their Sessions.
        run_end_prompts: their prompt indices, in the order they were put back.
    """

    next_rollout_id: int
    stream: Mapping[str, Any]
    held_groups: int = 0
    held_sessions: int = 0
    held_prompts: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    run_end_groups: int = 0
    run_end_sessions: int = 0
    run_end_prompts: tuple[int, ...] = attrs.field(default=(), converter=tuple)

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored under ``state.json["rollout"]``."""
        return {"next_rollout_id": self.next_rollout_id, "stream": dict(self.stream),
                "held_groups": self.held_groups, "held_sessions": self.held_sessions,
                "held_prompts": list(self.held_prompts), "run_end_groups": self.run_end_groups,
                "run_end_sessions": self.run_end_sessions,
                "run_end_prompts": list(self.run_end_prompts)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RolloutCheckpoint:
        """Reads :meth:`to_json` output (also of checkpoints without the ``run_end_*`` keys)."""
        return cls(next_rollout_id=int(data["next_rollout_id"]), stream=dict(data["stream"]),
                   held_groups=int(data["held_groups"]), held_sessions=int(data["held_sessions"]),
                   held_prompts=tuple(int(i) for i in data["held_prompts"]),
                   run_end_groups=int(data.get("run_end_groups", 0)),
                   run_end_sessions=int(data.get("run_end_sessions", 0)),
                   run_end_prompts=tuple(int(i) for i in data.get("run_end_prompts", ())))


def capture_rollout(
    prompts: PromptStream, held: Sequence[Group], *, next_rollout_id: int,
    run_end: Sequence[Group] = (),
) -> RolloutCheckpoint:
    """The rollout state to save between steps.

    Args:
        prompts: the pipeline's prompt stream.
        held: train Groups that hold a prompt no step has accounted for yet
            (:attr:`RolloutPipeline.held_groups`); dropped ones are skipped (an uninterrupted
            run would not train them either).
        next_rollout_id: the step the resumed run starts with.
        run_end: train Groups the last step dropped that a longer run would have continued
            (:attr:`RolloutPipeline.run_end_groups`; they are dropped, so not skipped).
    """
    kept = [g for g in held if not g.dropped and g.mode == "train"]
    ended = [g for g in run_end if g.mode == "train" and g not in kept]
    cursor = prompts.cursor()
    indices = [g.prompt_index for g in kept]
    end_indices = [g.prompt_index for g in ended]
    cursor["pending"] = [*indices, *end_indices, *cursor["pending"]]
    return RolloutCheckpoint(next_rollout_id=next_rollout_id, stream=cursor,
                             held_groups=len(kept), held_sessions=sum(len(g.sessions) for g in kept),
                             held_prompts=tuple(indices), run_end_groups=len(ended),
                             run_end_sessions=sum(len(g.sessions) for g in ended),
                             run_end_prompts=tuple(end_indices))


def capture_pipeline(pipeline: RolloutPipeline, *, next_rollout_id: int) -> RolloutCheckpoint:
    """:func:`capture_rollout` of the pipeline's prompt stream, held and run-end Groups."""
    return capture_rollout(pipeline.prompts, pipeline.held_groups, next_rollout_id=next_rollout_id,
                           run_end=pipeline.run_end_groups)


def restore_rollout(prompts: PromptStream, checkpoint: RolloutCheckpoint) -> dict[str, float]:
    """Puts the prompt stream where the checkpoint left it; logs the Groups that were dropped.

    Returns:
        Metrics for the first resumed step's row: ``resume_dropped_groups`` and
        ``resume_dropped_sessions``, and ``resume_requeued_groups`` when the checkpoint holds
        run-end Groups.

    Raises:
        ConfigError: the checkpoint is for a different dataset (prompt count).
    """
    cursor = checkpoint.stream
    if (cursor.get("seed"), cursor.get("shuffle")) != (prompts.seed, prompts.shuffle):
        log.warning("resume: the checkpoint's prompt order used seed=%s shuffle=%s, this run has "
                    "seed=%s shuffle=%s; the current epoch continues in the saved order, later "
                    "epochs use this run's settings", cursor.get("seed"), cursor.get("shuffle"),
                    prompts.seed, prompts.shuffle)
    prompts.restore(cursor)
    if checkpoint.held_groups:
        log.warning(agentic_event(
            "rollout", "resume_dropped", rollout=checkpoint.next_rollout_id,
            groups=checkpoint.held_groups, sessions=checkpoint.held_sessions)
            + " resident Groups (prelaunched, partial-rollout or fully-async state: agent "
              "processes, open requests, parked partial generations) cannot be checkpointed and "
              f"were dropped; their prompts {list(checkpoint.held_prompts)} run again from the start")
    metrics = {"resume_dropped_groups": float(checkpoint.held_groups),
               "resume_dropped_sessions": float(checkpoint.held_sessions)}
    if checkpoint.run_end_groups:
        log.info(agentic_event(
            "rollout", "resume_requeued", rollout=checkpoint.next_rollout_id,
            groups=checkpoint.run_end_groups, sessions=checkpoint.run_end_sessions)
            + " Groups the previous run's last step dropped (counted in its dropped_groups) "
              f"would have continued in a longer run; their prompts {list(checkpoint.run_end_prompts)} "
              "run first")
        metrics["resume_requeued_groups"] = float(checkpoint.run_end_groups)
    return metrics
