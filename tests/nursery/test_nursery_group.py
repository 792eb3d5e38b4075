"""Groups: the first-request barrier, drops on any Session failure, and no surviving agents."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing
from tests.support.agents import write_httpx_agent
from tests.support.apps import serve_agent_api
from tests.support.clock import RealTimeLimit
from tests.support.procs import PidPipe, alive

from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.config import AgentConfig, GenerationConfig
from relaxtrio.nursery.group import Group, run_group
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.nursery.turns import TurnContext, TurnHandler, TurnRequest, TurnResult
from relaxtrio.rollout.turns import EngineTurnHandler
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine

pytestmark = pytest.mark.slow  # starts real processes


def _group(n: int, timeout_s: float = 60.0) -> Group:
    return Group.create("train:group_t", num_sessions=n, timeout_s=timeout_s,
                        input_payload={"messages": [{"role": "user", "content": "task"}]})


def _fine_engine(tokenizer) -> ScriptedEngine:
    """An engine that answers every turn with ``fine``."""
    return ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
                          replies=lambda ids: Reply(text="fine"))


@attrs.define
class _EnteringHandler:
    """Delegates to ``inner`` after setting ``entered`` (a turn reached the handler)."""

    inner: TurnHandler
    entered: trio.Event = attrs.field(factory=trio.Event)

    async def complete(self, turn: TurnContext, request: TurnRequest) -> TurnResult:
        self.entered.set()
        return await self.inner.complete(turn, request)


async def _run(group: Group, commands: list[str], engine: ScriptedEngine, tokenizer, tmp_path: Path,
               env: dict[str, str] | None = None, timeout_s: float = 60.0,
               wrap: Callable[[TurnHandler], TurnHandler] = lambda handler: handler,
               first_request_timeout_s: float | None = None) -> SessionRegistry:
    """Runs ``group`` with per-session commands (a wrapper script dispatches on RELAX_SESSION_ID)."""
    registry = SessionRegistry()
    dispatch = {s.session_id: cmd for s, cmd in zip(group.sessions, commands, strict=True)}
    script = "case \"$RELAX_SESSION_ID\" in\n" + "".join(
        f"  {sid}) exec {cmd} ;;\n" for sid, cmd in dispatch.items()) + "esac\n"
    (tmp_path / "run.sh").write_text(script)
    handler = wrap(EngineTurnHandler(client=engine, compiler=ChatCompiler(tokenizer),
                                     config=GenerationConfig(max_response_tokens=16)))
    async with serve_agent_api(registry, handler) as base_url:
        await run_group(group, agent=AgentConfig(command="bash run.sh", cwd=tmp_path, env=env or {},
                                                 timeout_s=timeout_s, term_grace_s=0.5,
                                                 first_request_timeout_s=first_request_timeout_s),
                        base_url=base_url, registry=registry)
    return registry


async def test_group_completes_and_exports_in_session_order(tokenizer, tmp_path: Path) -> None:
    cmd = write_httpx_agent(tmp_path)
    engine = _fine_engine(tokenizer)
    group = _group(3)
    with trio.fail_after(60):
        registry = await _run(group, [f"{cmd} ok"] * 3, engine, tokenizer, tmp_path,
                              env={"AGENT_TURNS": "2", "AGENT_REWARD": "0.25"})
    assert not group.dropped, group.dropped_reason
    assert len(registry) == 0
    assert [len(s.samples) for s in group.sessions] == [1, 1, 1]
    assert all(s.samples[0].reward == 0.25 for s in group.sessions)
    assert all(s.samples[0].metadata["rollout_turns"] == 2 for s in group.sessions)
    assert len(engine.calls) == 6


async def test_first_request_barrier_holds_generation(tokenizer, tmp_path: Path) -> None:
    cmd = write_httpx_agent(tmp_path)
    group = _group(2)
    barrier_at_call: list[bool] = []

    def replies(ids) -> Reply:
        barrier_at_call.append(group.barrier_passed)
        return Reply(text="fine")

    engine = ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id, replies=replies)
    flag = tmp_path / "go"
    seen_before_release = []
    handler: list[_EnteringHandler] = []

    def wrap(inner: TurnHandler) -> TurnHandler:
        handler.append(_EnteringHandler(inner=inner))
        return handler[0]

    async def release() -> None:
        await handler[0].entered.wait()  # session 0's first turn reached the handler...
        await trio.testing.wait_all_tasks_blocked()  # ...and parked at the closed gate
        seen_before_release.append(len(engine.calls))
        flag.write_text("go")

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(release)
            await _run(group, [f"{cmd} ok", f"{cmd} wait_file"], engine, tokenizer, tmp_path,
                       env={"AGENT_WAIT_FILE": str(flag)}, wrap=wrap)
    assert seen_before_release == [0], "no generation before every Session sent its first request"
    assert barrier_at_call == [True, True], "every generation started after the barrier passed"
    assert not group.dropped and len(engine.calls) == 2



async def test_waiting_for_lease_only_when_unleased_and_every_agent_is_held_or_ended() -> None:
    group = _group(3)
    first, second, third = group.sessions
    assert not group.waiting_for_lease, "no agent has sent its first request: they may be starting"
    group.note_request(first)
    group.note_request(second)
    assert not group.waiting_for_lease, "one agent is still before its first request"
    third.mark_ended()  # an agent that exited before asking anything computes nothing either
    assert group.waiting_for_lease
    group.leased = True
    assert not group.waiting_for_lease, "a leased Group generates and its agents run"

async def test_an_agent_silent_before_its_first_request_is_stopped_and_drops_its_group(
    tokenizer, tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """--agent-timeout only runs in Runtime; the first-request timeout bounds the time before.

    The window runs on the trio clock, which only this test moves (as in the budget test
    below): however slowly session 0's agent starts on a loaded machine, it has sent its first
    request before any time passes, and only session 1 is stopped, exactly at 1.5 s."""
    cmd = write_httpx_agent(tmp_path)
    pipe = PidPipe(tmp_path / "pids")
    engine = _fine_engine(tokenizer)
    group = _group(2)
    asking, silent = group.sessions
    async with RealTimeLimit(120):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(
                _run, group, [f"{cmd} ok", "bash -c 'echo $$ >> \"$AGENT_PID_FILE\"; exec sleep 1000'"],
                engine, tokenizer, tmp_path, env={"AGENT_PID_FILE": str(pipe.path)},
                first_request_timeout_s=1.5))
            [pid] = await pipe.read_pids(1)
            await asking.wait_first_request()  # held at the first-request barrier
            mock_clock.jump(1.4)
            await trio.testing.wait_all_tasks_blocked()
            assert silent.status == "running" and not group.dropped and alive(pid), "stopped early"
            mock_clock.jump(0.1)
        await pipe.aclose()
    assert trio.current_time() == 1.5
    assert group.dropped
    assert "Agent sent no model request within 1.5 s of starting" in group.dropped_reason
    assert f"session 1 ({silent.session_id})" in group.dropped_reason and silent.status == "failed"
    assert group.samples() == [] and engine.calls == []  # session 0 was held at the barrier
    assert not alive(pid)


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("crash_before", "exited with code 1"),
        ("crash_after", "boom after the request"),
        ("silent", "implicit export requires one committed leaf, found 0"),
        ("array_output", "JSONL"),
        ("garbage_output", "invalid output"),
    ],
)
async def test_failed_session_drops_group_and_kills_siblings(
    mode: str, reason: str, tokenizer, tmp_path: Path
) -> None:
    cmd = write_httpx_agent(tmp_path)
    pid_file = tmp_path / "pids"
    engine = _fine_engine(tokenizer)
    group = _group(3)
    with trio.fail_after(60):
        await _run(group, [f"{cmd} hang", f"{cmd} {mode}", f"{cmd} hang"], engine, tokenizer, tmp_path,
                   env={"AGENT_PID_FILE": str(pid_file)})
    assert group.dropped and reason in group.dropped_reason
    assert group.samples() == []
    if pid_file.exists():
        for pid in map(int, pid_file.read_text().split()):
            assert not alive(pid)
    assert {s.status for s in group.sessions} <= {"failed", "cancelled", "completed"}
    assert group.sessions[1].status == "failed"


async def test_timeout_drops_group_and_leaves_no_process(tokenizer, tmp_path: Path,
                                                         mock_clock: trio.testing.MockClock) -> None:
    """The budget runs on the trio clock, which only this test moves (real agents and sockets
    rule out autojump): however slowly the agents start on a loaded machine, session 1 times out
    exactly when 3 s of trio time have passed in Runtime, and its processes are gone."""
    cmd = write_httpx_agent(tmp_path)
    pipe = PidPipe(tmp_path / "pids")
    engine = _fine_engine(tokenizer)
    group = _group(2, timeout_s=3.0)
    ok, hanging = group.sessions
    async with RealTimeLimit(120):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(_run, group, [f"{cmd} ok", f"{cmd} hang"], engine, tokenizer,
                                                 tmp_path, env={"AGENT_PID_FILE": str(pipe.path)}, timeout_s=3.0))
            [pid] = await pipe.read_pids(1)  # session 1 got its answer and hangs
            await ok.wait_ended()
            # No trio time has passed: the budget has spent nothing, whatever the wall time was.
            assert trio.current_time() == 0.0 and ok.status == "completed"
            assert hanging.status == "running" and not group.dropped and alive(pid)
            mock_clock.jump(3.0)
        await pipe.aclose()
    assert trio.current_time() == 3.0
    assert group.dropped and "timed out after 3 s" in group.dropped_reason
    assert f"session 1 ({hanging.session_id})" in group.dropped_reason and hanging.status == "failed"
    assert not alive(pid)


async def test_cancelling_the_run_leaves_no_agent(tokenizer, tmp_path: Path) -> None:
    cmd = write_httpx_agent(tmp_path)
    pid_file = tmp_path / "pids"
    gate, generating = trio.Event(), trio.Event()

    def replies(ids) -> Reply:
        if len(engine.calls) >= 2:
            generating.set()
        return Reply(text="fine", gate=gate)

    engine = ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id, replies=replies)
    group = _group(2)
    with trio.fail_after(60):
        async with trio.open_nursery() as outer:
            async def cancel_when_generating() -> None:
                await generating.wait()
                outer.cancel_scope.cancel()
            outer.start_soon(cancel_when_generating)
            await _run(group, [f"{cmd} hang", f"{cmd} hang"], engine, tokenizer, tmp_path,
                       env={"AGENT_PID_FILE": str(pid_file)})
    assert sorted(engine.aborted) == sorted(rid for _, _, rid in engine.calls), "engine requests aborted"
    for session in group.sessions:
        assert session.status == "cancelled"
    # No process of any Session survives (the agents never wrote pids: they were waiting on HTTP).
    # Only this test's agents count: other test runs on the machine may run the same agent.
    own = os.getpid()
    tags = {f"RELAX_SESSION_ID={s.session_id}".encode() for s in group.sessions}
    leftovers = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                environ = set((entry / "environ").read_bytes().split(b"\0"))
            except OSError:
                continue
            if (b"httpx_agent.py" in cmdline and tags & environ and int(entry.name) != own
                    and alive(int(entry.name))):
                leftovers.append(int(entry.name))
    assert leftovers == []


async def test_agents_are_told_the_context_window_and_the_turn_limit(tokenizer, tmp_path: Path) -> None:
    """docs/agent-contract.md#environment-variables: a harness sizes its context from them."""
    group = Group.create("train:group_t", num_sessions=1, timeout_s=60.0, input_payload={}, max_context_tokens=4096)
    registry = SessionRegistry()
    handler = EngineTurnHandler(client=_fine_engine(tokenizer), compiler=ChatCompiler(tokenizer),
                                config=GenerationConfig(max_response_tokens=512))
    command = "env | grep '^RELAX_MAX_' | sort > limits.txt"
    with trio.fail_after(60):
        async with serve_agent_api(registry, handler) as base_url:
            await run_group(group, agent=AgentConfig(command=command, cwd=tmp_path, timeout_s=60.0,
                                                     env={"OTHER": "x"}, term_grace_s=0.5),
                            base_url=base_url, registry=registry, max_response_tokens=512)
    assert (tmp_path / "limits.txt").read_text().splitlines() == [
        "RELAX_MAX_CONTEXT_TOKENS=4096", "RELAX_MAX_RESPONSE_TOKENS=512"]
