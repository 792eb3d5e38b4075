"""Dynamic sampling filters: drop a scored train Group before it is trained on.

``--dynamic-sampling-filter-path pkg.mod.fn`` names ``fn(samples, rewards)``: the Group's
samples (Session order, then export order, reward-model rewards applied) and their primary
rewards (None for a context without reward). It returns ``True`` (keep), ``False`` (drop), or a
:class:`DynamicFilterOutput` with a reason. A dropped Group is *filtered*, not dropped: it is
logged (``Filtered 1 group``), counted as ``rollout/dynamic_filter/drop_<reason>``, and it is new
demand: the step starts another Group in its place. Filters run for train Groups only.

Built in: :func:`check_reward_nonzero_std` (DAPO's dynamic sampling, arXiv 2503.14476, section 3.2):
a Group whose rewards are all equal has zero GRPO advantage everywhere and teaches nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from .._errors import ExportError
from ..forest import TrainingSample

__all__ = ["DynamicFilterOutput", "GroupFiltered", "check_reward_nonzero_std", "run_dynamic_filter"]

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


class GroupFiltered(ExportError):
    """A dynamic filter dropped the Group (new demand, not a failure).

    Attributes:
        reason: the metric-safe reason, or None.
    """

    def __init__(self, message: str, *, reason: str | None = None, session_id: str | None = None):
        super().__init__(message, session_id=session_id)
        self.reason = reason


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


def run_dynamic_filter(
    fn: DynamicFilter, samples: Sequence[TrainingSample], rewards: Sequence[float | None]
) -> str | None:
    """Runs a filter on a scored Group.

    Returns:
        None when the Group is kept.

    Raises:
        GroupFiltered: the filter dropped the Group (``reason`` set when it gave one).
        ExportError: the filter raised, or returned something other than a bool or a
            :class:`DynamicFilterOutput`.
    """
    try:
        verdict = fn(list(samples), list(rewards))
    except Exception as exc:  # the user's filter: its bug drops this Group, not the run
        raise ExportError(f"dynamic sampling filter raised {type(exc).__name__}: {exc}") from exc
    if isinstance(verdict, bool):
        verdict = DynamicFilterOutput(keep=verdict)
    if not isinstance(verdict, DynamicFilterOutput):
        raise ExportError("dynamic sampling filter must return a bool or a DynamicFilterOutput, "
                          f"got {type(verdict).__name__}")
    if verdict.keep:
        return None
    reason = None if verdict.reason is None else re.sub(r"[^A-Za-z0-9_]", "_", verdict.reason) or None
    raise GroupFiltered(f"Filtered 1 group: dynamic sampling filter{'' if reason is None else ': ' + reason}",
                        reason=reason)
