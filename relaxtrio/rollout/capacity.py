"""External-agent capacity: how many executor slots a run needs so Group startup cannot deadlock.

When agents run on a platform with a hard concurrency limit, every Session of a Group must get a
slot before the Group passes its first-request barrier. The rule
(docs/scheduling.md#external-agent-capacity):

    T      = agentic_concurrency × n_samples_per_prompt
    G_d    = n_samples_per_eval_prompt of eval dataset d
    C_d    = agentic_eval_concurrency, or ceil(T / G_d)
    E_d    = C_d × G_d
    E_peak = max_d E_d            (eval datasets run serially)

    no eval                                   → slots ≥ T
    eval, train Sessions not resident         → slots ≥ max(T, E_peak)
    eval, train Sessions resident during eval → slots ≥ T + E_peak
      (resident = prelaunch, partial rollout or fully async)

relaxtrio computes this at startup and, given ``--agent-external-slots N``, refuses to start when
N is too small, naming the row and the numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from .._errors import ConfigError


@attrs.frozen(kw_only=True)
class CapacityPlan:
    """The formula's values for one configuration.

    Attributes:
        train_slots: T.
        eval_slots: E_d per eval dataset name.
        eval_peak: E_peak (0 without eval).
        eval_enabled: whether any eval dataset is configured.
        resident_during_eval: prelaunch, partial rollout or fully async is on.
        required: slots needed.
        row: the table row that applies, in words.
    """

    train_slots: int
    eval_slots: dict[str, int]
    eval_peak: int
    eval_enabled: bool
    resident_during_eval: bool
    required: int
    row: str

    def describe(self) -> str:
        """One line with every number of the formula, in words."""
        evals = ", ".join(f"E_{name}={e}" for name, e in self.eval_slots.items())
        evals = f"eval slots {evals}, E_peak={self.eval_peak}" if evals else "no eval"
        return (f"T={self.train_slots} agent slots for training (resident Groups × Sessions per "
                f"Group), {evals}; rule '{self.row}' needs {self.required} slots")


def plan_capacity(
    *,
    agentic_concurrency: int,
    n_samples_per_prompt: int,
    eval_group_sizes: Sequence[tuple[str, int]] = (),
    agentic_eval_concurrency: int | None = None,
    prelaunch: bool = False,
    partial_rollout: bool = False,
    fully_async: bool = False,
) -> CapacityPlan:
    """Evaluates the capacity formula (docs/scheduling.md#external-agent-capacity).

    Args:
        agentic_concurrency: resident train Groups.
        n_samples_per_prompt: Sessions per train Group.
        eval_group_sizes: ``(name, G_d)`` per eval dataset.
        agentic_eval_concurrency: explicit C_d for every dataset, or None for ceil(T / G_d).
        prelaunch: ``--agentic-prelaunch``.
        partial_rollout: ``--partial-rollout``.
        fully_async: ``--fully-async``.
    """
    t = agentic_concurrency * n_samples_per_prompt
    eval_slots = {
        name: (agentic_eval_concurrency or math.ceil(t / g)) * g for name, g in eval_group_sizes
    }
    peak = max(eval_slots.values(), default=0)
    resident = prelaunch or partial_rollout or fully_async
    if not eval_slots:
        required, row = t, "eval disabled: external_slots >= T"
    elif resident:
        required, row = t + peak, "eval enabled, train Sessions resident during eval: external_slots >= T + E_peak"
    else:
        required, row = max(t, peak), "eval enabled, train Sessions not resident: external_slots >= max(T, E_peak)"
    return CapacityPlan(train_slots=t, eval_slots=eval_slots, eval_peak=peak,
                        eval_enabled=bool(eval_slots), resident_during_eval=resident,
                        required=required, row=row)


def check_external_slots(plan: CapacityPlan, external_slots: int | None) -> None:
    """Refuses a run whose external executor has too few slots.

    Raises:
        ConfigError: ``external_slots < plan.required`` (the message names the row and
            every number; fewer slots can deadlock Group startup at the first-request barrier).
    """
    if external_slots is None or external_slots >= plan.required:
        return
    raise ConfigError(
        f"--agent-external-slots {external_slots} is too small: {plan.describe()}. With fewer "
        "slots, Groups can deadlock at the first-request barrier. Raise the executor's limit or "
        "lower --agentic-concurrency / --agentic-eval-concurrency / --n-samples-per-prompt.",
        param="agent_external_slots",
    )
