"""What the operator sees of a running pipeline (RunView): in-flight requests, live agents, the
pipeline snapshot keys through a step and a prelaunch, per-step rows, a Session's forest."""

from __future__ import annotations

import pytest

from pathlib import Path
from typing import Any

import trio
from tests.support.pipeline import open_test_pipeline, prompts
from tests.support.procs import alive
from tests.support.waits import wait_until

from relaxtrio.config import RolloutConfig
from relaxtrio.rollout.operator_view import SNAPSHOT_KEYS, RunView
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine

pytestmark = pytest.mark.slow  # starts real processes


async def _until(view: RunView, ready: Any) -> dict[str, Any]:
    """The view's state once ``ready(state)``: real agent processes move it, so a bounded wait."""
    await wait_until(lambda: ready(view.debug_state()), timeout_s=60, what="the view's state")
    return view.debug_state()


async def test_the_view_follows_a_step_and_a_prelaunch(tokenizer, tmp_path: Path) -> None:
    gate = trio.Event()
    engine = ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
                            replies=lambda ids: Reply(text="fine", gate=gate))
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=1, agentic_concurrency=2,
                           prelaunch=True, show_progress=False)
    view = RunView(kind="rollout")
    results = []
    with trio.fail_after(90):
        async with open_test_pipeline(tmp_path, tokenizer, engine, prompts([{}] * 4),
                                      config=config) as (pipeline, _):
            view.attach(pipeline)
            assert view.debug_state()["pipeline"] == dict.fromkeys(SNAPSHOT_KEYS, 0)

            async def step() -> None:
                results.append(await pipeline.run_step(0))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(step)
                # The leased Group's two requests are generating (the engine holds them at the
                # gate); the Group prelaunched beside it has its two agents running too.
                state = await _until(view, lambda s: s["totals"]["inflight_request_count"] == 2
                                     and s["totals"]["live_process_count"] == 4)
                by_state = {g["state"]: g for g in state["groups"]}
                assert set(by_state) == {"runtime", "prepare"}
                runtime = by_state["runtime"]
                assert runtime["leased"] and runtime["barrier_passed"] and runtime["inflight_request_count"] == 2
                assert {r["session_id"] for r in state["inflight_requests"]} == \
                    {s["session_id"] for s in runtime["sessions"]}
                assert len(state["live_agents"]) == 4 and all(alive(a["pgid"]) for a in state["live_agents"])
                snapshot = state["pipeline"]
                assert snapshot["runtime_reward_group_count"] == 1 and snapshot["resident_group_count"] == 2
                assert snapshot["prepare_group_count"] == 1 and snapshot["finalized_group_count"] == 0
                gate.set()
            [result] = results
            # After the step its permit went to a second prelaunched Group: two prepare Groups,
            # ready once all their agents sent a first request (held until a lease).
            await _until(view, lambda s: s["pipeline"]["ready_prepare_group_count"] == 2)
            view.note_step(result, step_s=2.0)
            state = view.debug_state()
            snapshot = state["pipeline"]
            assert snapshot["prepare_group_count"] == snapshot["resident_group_count"] == 2
            assert snapshot["warming_prepare_group_count"] == 0
            assert snapshot["runtime_reward_group_count"] == 0 and snapshot["finalized_group_count"] == 1
            by_state = {g["state"]: g for g in state["groups"]}
            assert set(by_state) == {"accepted", "prepare"}
            accepted = by_state["accepted"]
            assert all(s["status"] == "completed" and s["turn_count"] == 1 and s["num_samples"] == 1
                       for s in accepted["sessions"])
            detail = view.session_detail(accepted["sessions"][0]["session_id"])
            assert detail is not None and detail["forest"]["num_nodes"] == 2
            assert detail["exported"] == [detail["forest"]["leaves"][0]]
            assert view.session_detail("session-unknown") is None
            [row] = view.steps()
            assert row["step"] == 0 and row["reward_mean"] == 1.0 and row["step_s"] == 2.0
            assert row["response_tokens"] == sum(sum(s.loss_mask) for s in result.samples) > 0
            assert row["tokens_per_s"] == row["response_tokens"] / result.rollout_s
