"""Dynamic sampling filters: drop a scored train Group before it is trained on.

``--dynamic-sampling-filter-path pkg.mod.fn`` names ``fn(samples, rewards)``: the Group's
samples (Session order, then export order, reward-model rewards applied) and their primary
rewards (None for a context without reward); or Relax's ``fn(args, samples)``; sync or async
(:mod:`relaxtrio.rollout.hooks`). It returns ``True`` (keep), ``False`` (drop), or a
:class:`DynamicFilterOutput` with a reason (any object with ``keep`` and ``reason``, such as
Relax's, is read the same way). Scoring returns a drop as a :class:`FilterVerdict`
(as it does the custom advantage function's None). A dropped Group is *filtered*, not dropped:
it is logged (``Filtered 1 group``), counted as ``rollout/dynamic_filter/drop_<reason>``, and it
is new demand: the step starts another Group in its place. Filters run for train Groups only.

Built in: :func:`check_reward_nonzero_std` (DAPO's dynamic sampling, arXiv 2503.14476, section 3.2):
a Group whose rewards are all equal has zero GRPO advantage everywhere and teaches nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs

from ..forest import TrainingSample
from .hooks import HookError, call_hook

if TYPE_CHECKING:
    from ..nursery.group import Group

__all__ = [
    "DynamicFilterOutput",
    "FilterSource",
    "FilterVerdict",
    "check_reward_nonzero_std",
    "run_dynamic_filter",
]

DynamicFilter = Callable[[list[TrainingSample], list[float | None]], Any]


@attrs.frozen
class DynamicFilterOutput:
    """A filter's verdict.

    Attributes:
        keep: whether the Group is trained on.
        reason: why it was dropped; becomes ``rollout/dynamic_filter/drop_<reason>`` (characters
            outside ``[A-Za-z0-9_]`` become ``_``).
    """

    keep: bool
    reason: str | None = None


FilterSource = Literal["dynamic_filter", "custom_advantage"]


@attrs.frozen(kw_only=True)
class FilterVerdict:
    """A scored train Group that is not trained on, by the user's choice rather than a failure.

    What :func:`~relaxtrio.rollout.step.score_group` returns in place of a
    :class:`~relaxtrio.rollout.step.ScoredGroup`. The two sources are budgeted differently: a
    Group the dynamic filter dropped is new demand within ``filter_budget``; one the custom
    advantage function filtered (it returned None) is replaced within the refill budget and is
    also counted among the step's dropped Groups.

    Attributes:
        group: the filtered Group.
        source: who filtered it: ``dynamic_filter`` or ``custom_advantage``.
        reason: the dynamic filter's metric-safe reason (``[A-Za-z0-9_]+``), or None.
    """

    group: Group
    source: FilterSource
    reason: str | None = None

    @property
    def message(self) -> str:
        """The log text, e.g. ``Filtered 1 group: dynamic sampling filter: zero_std``."""
        if self.source == "custom_advantage":
            return "Filtered 1 group: the custom advantage function returned None"
        return f"Filtered 1 group: dynamic sampling filter{'' if self.reason is None else ': ' + self.reason}"

    @property
    def metric(self) -> str | None:
        """The counter this Group adds 1 to besides ``filtered_groups``:
        ``rollout/dynamic_filter/drop_<reason>``, or None (no reason, or custom advantage)."""
        if self.source != "dynamic_filter" or self.reason is None:
            return None
        return f"rollout/dynamic_filter/drop_{self.reason}"


def check_reward_nonzero_std(
    samples: Sequence[TrainingSample], rewards: Sequence[float | None]
) -> DynamicFilterOutput:
    """Keeps a Group only when its rewards are not all equal (reason ``zero_std``).

    Args:
        samples: the Group's samples (unused; the signature every filter has).
        rewards: their primary rewards; contexts without reward are ignored.

    Returns:
        ``keep=True`` when at least two rewards differ.
    """
    values = [r for r in rewards if r is not None]
    if len(values) >= 2 and min(values) != max(values):
        return DynamicFilterOutput(keep=True)
    return DynamicFilterOutput(keep=False, reason="zero_std")


async def run_dynamic_filter(
    fn: DynamicFilter, samples: Sequence[TrainingSample], rewards: Sequence[float | None],
    *, hook_args: Any = None,
) -> DynamicFilterOutput:
    """Runs a filter on a scored Group (:func:`~relaxtrio.rollout.hooks.call_hook`).

    Args:
        fn: the filter, in either shape.
        samples: the Group's samples.
        rewards: their primary rewards.
        hook_args: ``args`` of a Relax-shaped filter.

    Returns:
        The verdict, its reason made metric-safe (characters outside ``[A-Za-z0-9_]`` become
        ``_``; an empty reason becomes None, and a kept Group has none).

    Raises:
        HookError: the filter raised, or returned something other than a bool or a verdict.
    """
    verdict = await call_hook(fn, "dynamic_filter", list(samples), list(rewards), hook_args=hook_args)
    if isinstance(verdict, bool):
        verdict = DynamicFilterOutput(keep=verdict)
    keep, reason = getattr(verdict, "keep", None), getattr(verdict, "reason", None)
    if not isinstance(keep, bool) or not (reason is None or isinstance(reason, str)):
        raise HookError("dynamic_filter", "the dynamic sampling filter must return a bool or a "
                        f"DynamicFilterOutput(keep, reason), got {type(verdict).__name__}")
    if keep:
        return DynamicFilterOutput(keep=True)
    reason = None if reason is None else re.sub(r"[^A-Za-z0-9_]", "_", reason) or None
    return DynamicFilterOutput(keep=False, reason=reason)
