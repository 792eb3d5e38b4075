"""The external-capacity formula (docs/scheduling.md#external-agent-capacity) and the startup refusal."""

from __future__ import annotations

import pytest

from relaxtrio import ConfigError
from relaxtrio.rollout.capacity import check_external_slots, plan_capacity


def test_no_eval_needs_t() -> None:
    plan = plan_capacity(agentic_concurrency=4, n_samples_per_prompt=8)
    assert (plan.train_slots, plan.eval_peak, plan.required) == (32, 0, 32)
    assert plan.row.startswith("eval disabled")


def test_eval_not_resident_needs_max() -> None:
    plan = plan_capacity(agentic_concurrency=4, n_samples_per_prompt=8,
                         eval_group_sizes=[("math", 3), ("code", 1)])
    # C_d = ceil(32 / G_d): math ceil(32/3)=11 → E=33; code 32 → E=32.
    assert plan.eval_slots == {"math": 33, "code": 32}
    assert plan.eval_peak == 33 and plan.required == 33


@pytest.mark.parametrize("flag", ["prelaunch", "partial_rollout", "fully_async"])
def test_eval_with_resident_train_needs_sum(flag: str) -> None:
    plan = plan_capacity(agentic_concurrency=2, n_samples_per_prompt=4,
                         eval_group_sizes=[("math", 2)], agentic_eval_concurrency=3, **{flag: True})
    assert plan.eval_slots == {"math": 6}
    assert plan.required == 8 + 6
    assert "T + E_peak" in plan.row


def test_check_refuses_too_few_slots_naming_row_and_numbers() -> None:
    plan = plan_capacity(agentic_concurrency=2, n_samples_per_prompt=4,
                         eval_group_sizes=[("math", 2)], prelaunch=True)
    check_external_slots(plan, plan.required)
    check_external_slots(plan, None)
    with pytest.raises(ConfigError) as info:
        check_external_slots(plan, plan.required - 1)
    message = str(info.value)
    assert "--agent-external-slots 15 is too small" in message
    assert "T=8 agent slots for training" in message and "E_math=8, E_peak=8" in message
    assert "needs 16 slots" in message
    assert "T + E_peak" in message
    assert info.value.param == "agent_external_slots"
