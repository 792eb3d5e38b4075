"""The agent actor's protocol (run, wait_started, expire, cancel) without Ray.

:class:`~relaxtrio.cluster._agent_actor.AgentRunner` is the body of the Ray actor; here its
methods are called from worker threads, as the actor's threads call them, and run real agent
processes. The same class inside Ray is tested in test_cluster_ray.py.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

import pytest
import trio
from tests.support.procs import alive
from tests.support.waits import wait_until

pytest.importorskip("ray")

from relaxtrio.cluster._agent_actor import AgentRunner
from relaxtrio.config import AgentConfig
from relaxtrio.nursery.agent import SessionEnv

pytestmark = pytest.mark.slow  # starts real processes

SESSION = SessionEnv(session_id="s" * 32, group_id="g", base_url="http://127.0.0.1:9/agentic_api/")


def _config(tmp_path: Path, command: str) -> AgentConfig:
    return AgentConfig(command=command, cwd=tmp_path, timeout_s=30.0, term_grace_s=0.5)


async def _run(runner: AgentRunner, run_id: int, config: AgentConfig):
    return await trio.to_thread.run_sync(runner.run, run_id, config, SESSION, {"messages": []})


async def test_runs_one_agent_after_another_and_reports_each_start(tmp_path: Path) -> None:
    runner = AgentRunner(node="10.0.0.1")
    command = 'cat "$RELAX_INPUT_JSON" > "$RELAX_OUTPUT_JSON"; echo "$RELAX_SESSION_ID"'
    for run_id in (1, 2):
        with trio.fail_after(60):
            outcome = await _run(runner, run_id, _config(tmp_path, command))
            state, pgid, node = await trio.to_thread.run_sync(runner.wait_started, run_id, 5.0)
        assert (outcome.kind, outcome.run.return_code) == ("ok", 0)
        assert outcome.run.output_text == '{"messages":[]}' and SESSION.session_id in outcome.run.log_tail
        assert state == "started" and pgid > 0 and node == "10.0.0.1"
    # A caller still waiting for an older run's start gets an answer at once.
    assert runner.wait_started(1, 5.0)[0] == "stale"


async def test_expire_ends_the_agent_as_a_timeout_with_its_output_tail(tmp_path: Path) -> None:
    runner = AgentRunner(node="n")
    ready = tmp_path / "ready"
    config = _config(tmp_path, f"echo started; touch {ready}; exec sleep 600")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            outcome = []

            async def run() -> None:
                outcome.append(await _run(runner, 1, config))

            nursery.start_soon(run)
            state, pgid, _ = await trio.to_thread.run_sync(runner.wait_started, 1, 30.0)
            assert state == "started" and alive(pgid)
            await wait_until(ready.exists, timeout_s=30, what="the agent's line")
            await trio.to_thread.run_sync(runner.expire, 1)
    [out] = outcome
    assert out.kind == "error" and out.timed_out and out.return_code is None
    assert out.message.startswith("Agent timed out after 30 s of active time.")
    assert out.message.endswith("started")
    assert not alive(pgid)


async def test_a_cancel_that_arrives_before_its_run_stops_it_before_any_process(tmp_path: Path) -> None:
    runner = AgentRunner(node="n")
    marker = tmp_path / "ran"
    runner.cancel(1)  # Ray does not order the calls of a threaded actor
    with trio.fail_after(60):
        outcome = await _run(runner, 1, _config(tmp_path, f"touch {marker}"))
    assert outcome.kind == "cancelled"
    assert runner.wait_started(1, 5.0) == ("ended", None, "n")
    assert not marker.exists()


async def test_cancel_mid_run_terminates_the_agents_process_group(tmp_path: Path) -> None:
    runner = AgentRunner(node="n")
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            outcomes = []
            nursery.start_soon(functools.partial(_collect, outcomes, runner, _config(tmp_path, "sleep 600")))
            state, pgid, _ = await trio.to_thread.run_sync(runner.wait_started, 1, 30.0)
            assert state == "started"
            await trio.to_thread.run_sync(runner.cancel, 1)
    assert [o.kind for o in outcomes] == ["cancelled"] and not alive(pgid)


async def _collect(out: list, runner: AgentRunner, config: AgentConfig) -> None:
    out.append(await _run(runner, 1, config))


async def test_an_agent_that_fails_or_cannot_start_is_reported_as_such(tmp_path: Path) -> None:
    runner = AgentRunner(node="n")
    with trio.fail_after(60):
        failed = await _run(runner, 1, _config(tmp_path, "echo bad input >&2; exit 3"))
        gone = tmp_path / "gone"
        gone.mkdir()
        config = _config(gone, "true")
        gone.rmdir()  # --agent-cwd missing on the node: the process cannot start
        unstarted = await _run(runner, 2, config)
    assert (failed.kind, failed.return_code, failed.timed_out) == ("error", 3, False)
    assert failed.message == "Agent exited with code 3.\nbad input"
    assert unstarted.kind == "oserror"
    assert runner.wait_started(2, 5.0) == ("ended", None, "n")


def test_the_actor_class_has_no_async_method() -> None:
    # One would make Ray run the actor as an asyncio actor: every plain method on one event-loop
    # thread, where a blocking wait_started and run wait for each other for ever.
    assert not inspect.getmembers(AgentRunner, inspect.iscoroutinefunction)
