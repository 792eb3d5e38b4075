"""Whether a trained step could teach the policy anything, and if not, why and what to change.

A step "cannot teach" when its update carries no reward signal. The causes, checked in this
order (the first that holds is reported):

- ``no_response_tokens``: no accepted sample has a sampled token (``loss_mask`` is 0
  everywhere), so there is nothing to put credit on;
- ``zero_advantage``: every context's base credit is exactly 0.0; with an estimator this means
  every Group's rewards were identical (GRPO, Dr. GRPO, RLOO and REINFORCE++-baseline all give
  exactly 0.0 then), with custom advantage the function returned 0 everywhere;
- ``all_masked``: the trainer masked every sampled token (``--mask-offpolicy-in-partial-rollout``,
  ``--use-icepop`` or ``--use-opsm``);
- ``all_clipped``: every trained token's clipped PPO term was active, so no token's ratio
  gradient passed;
- ``zero_gradient``: the gradient norm was exactly 0 for another reason.

The driver logs one WARNING per such step naming the cause and the remedy, and the metrics row
gets ``step_cannot_teach`` (1.0, else 0.0 on every trained step) and, when 1.0,
``step_cannot_teach_cause`` (the cause's name above), which the dashboard marks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Final, Literal

import attrs

from ..rollout.step import ScoredGroup, StepResult
from ..train import TrainStats

__all__ = ["CannotTeach", "TeachCause", "cannot_teach", "check_learning_signal", "teach_metrics"]

log = logging.getLogger(__name__)

TeachCause = Literal["no_response_tokens", "zero_advantage", "all_masked", "all_clipped", "zero_gradient"]

_REMEDY: Final[dict[TeachCause, str]] = {
    "no_response_tokens": "check that the agent's exported contexts end with a model reply "
                          "(an export that stops at an observation trains nothing)",
    "zero_advantage": "drop such Groups and draw new ones with --dynamic-sampling-filter-path "
                      "relaxtrio.rollout.filters.check_reward_nonzero_std, or use prompts whose "
                      "difficulty varies within a Group (more --n-samples-per-prompt helps too)",
    "all_clipped": "lower --lr, widen --eps-clip / --eps-clip-high, or take fewer "
                   "--num-steps-per-rollout per rollout",
    "zero_gradient": "check the loss coefficients and the custom advantage function",
}


@attrs.frozen(kw_only=True)
class CannotTeach:
    """Why one step's update had no learning signal.

    Attributes:
        cause: the first cause that holds (module docstring).
        detail: what was seen, e.g. ``"all 4 Groups had identical rewards"``.
        remedy: what to change.
    """

    cause: TeachCause
    detail: str
    remedy: str

    def message(self, rollout_id: int) -> str:
        """The WARNING line for step ``rollout_id``."""
        return (f"rollout {rollout_id} cannot teach ({self.cause}): {self.detail}; "
                f"remedy: {self.remedy}")


def _masked(stats: TrainStats) -> CannotTeach | None:
    """``all_masked`` with the masking option that did it, or None."""
    if stats.num_tokens == 0 and stats.offpolicy_masked_tokens > 0:
        return CannotTeach(
            cause="all_masked",
            detail=f"--mask-offpolicy-in-partial-rollout removed all {stats.offpolicy_masked_tokens} "
                   "sampled tokens (every one was sampled by an older weight version)",
            remedy="drop --mask-offpolicy-in-partial-rollout or resume fewer parked Groups per step "
                   "(--partial-rollout with fewer steps in flight)")
    for name, flag, bounds in (("icepop_masked_fraction", "--use-icepop", "--icepop-low / --icepop-high"),
                               ("opsm_masked_fraction", "--use-opsm", "--opsm-delta")):
        value = getattr(stats, name)
        if math.isfinite(value) and value >= 1.0:
            return CannotTeach(cause="all_masked", detail=f"{flag} masked every trained token",
                               remedy=f"widen {bounds}, or check the engine/trainer logprob "
                                      "mismatch (rollout_logprob_abs_diff)")
    return None


def _identical_rewards(groups: Sequence[ScoredGroup]) -> bool:
    """Whether every Group's rewards are all equal (and every context has one)."""
    for group in groups:
        rewards = [s.reward for s in group.scored]
        if None in rewards or len(set(rewards)) > 1:
            return False
    return True


def cannot_teach(groups: Sequence[ScoredGroup], stats: TrainStats | None) -> CannotTeach | None:
    """Why a step's update cannot teach, or None when it can.

    Args:
        groups: the step's accepted Groups with their contexts' credit (``StepResult.groups``).
        stats: the trainer's statistics for the step; None when no update ran (rollout only):
            only the sample-side causes are checked then.

    Returns:
        The first cause that holds (module docstring), or None.
    """
    scored = [s for g in groups for s in g.scored]
    if not scored:
        return None
    if all(sum(s.sample.loss_mask) == 0 for s in scored):
        return CannotTeach(cause="no_response_tokens", remedy=_REMEDY["no_response_tokens"],
                           detail=f"none of the {len(scored)} samples has a sampled (loss_mask 1) token")
    if all(s.advantage == 0.0 for s in scored):
        what = (f"each of the {len(groups)} Groups had identical rewards" if _identical_rewards(groups)
                else f"the custom advantage was 0 for all {len(scored)} samples")
        return CannotTeach(cause="zero_advantage", remedy=_REMEDY["zero_advantage"],
                           detail=f"{what}, so the advantage is 0 everywhere")
    if stats is None:
        return None
    masked = _masked(stats)
    if masked is not None:
        return masked
    if math.isfinite(stats.clip_fraction) and stats.clip_fraction >= 1.0:
        return CannotTeach(cause="all_clipped", remedy=_REMEDY["all_clipped"],
                           detail="the PPO clip was active on every trained token")
    if stats.grad_norm == 0.0:
        return CannotTeach(cause="zero_gradient", remedy=_REMEDY["zero_gradient"],
                           detail="the gradient norm was 0")
    return None


def teach_metrics(verdict: CannotTeach | None) -> dict[str, float | str]:
    """The step row's ``step_cannot_teach`` (1.0 or 0.0) and, when 1.0, ``step_cannot_teach_cause``."""
    if verdict is None:
        return {"step_cannot_teach": 0.0}
    return {"step_cannot_teach": 1.0, "step_cannot_teach_cause": verdict.cause}


def check_learning_signal(result: StepResult, stats: TrainStats | None) -> dict[str, float | str]:
    """The step row's :func:`teach_metrics` for a trained step; logs one WARNING (cause and
    remedy) when the step cannot teach."""
    verdict = cannot_teach(result.groups, stats)
    if verdict is not None:
        log.warning("%s", verdict.message(result.rollout_id))
    return teach_metrics(verdict)
