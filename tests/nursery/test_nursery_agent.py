"""The agent process contract: env, IO files, exit rules, and no process outliving its Session."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio
import trio.testing
from tests.support.procs import PidPipe, alive, group_alive

from relaxtrio import AgentExecutionError, ConfigError
from relaxtrio.config import AgentConfig
from relaxtrio.nursery.agent import ActiveBudget, SessionEnv, parse_agent_env, run_agent

pytestmark = pytest.mark.slow  # starts real processes

PY = sys.executable




def _env(**kw) -> SessionEnv:
    return SessionEnv(session_id="session-test", group_id="train:group_1",
                      base_url="http://127.0.0.1:9/agentic_api/", **kw)


def _budget(timeout_s: float) -> ActiveBudget:
    budget = ActiveBudget(total_s=timeout_s)
    budget.resume()
    return budget


async def test_agent_sees_contract_and_output_is_read(tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(
        "import json, os, sys\n"
        "keys = sorted(k for k in os.environ if k.startswith('RELAX_'))\n"
        "inp = json.load(open(os.environ['RELAX_INPUT_JSON']))\n"
        "print('hello from agent'); print('to stderr', file=sys.stderr)\n"
        "json.dump({'keys': keys, 'input': inp, 'cwd': os.getcwd(), 'foo': os.environ['FOO'],\n"
        "           'stdin': sys.stdin.read(), 'io': os.environ['RELAX_SESSION_IO_DIR']},\n"
        "          open(os.environ['RELAX_OUTPUT_JSON'], 'w'))\n"
    )
    config = AgentConfig(command=f"{PY} agent.py", cwd=tmp_path, env={"FOO": "bar"}, timeout_s=60)
    with trio.fail_after(30):
        run = await run_agent(config, _env(mode="eval"), {"messages": [{"role": "user", "content": "hi"}]},
                              _budget(60))
    out = json.loads(run.output_text)
    assert out["keys"] == sorted(["RELAX_INPUT_JSON", "RELAX_OUTPUT_JSON", "RELAX_SESSION_IO_DIR",
                                  "RELAX_BASE_URL", "RELAX_SESSION_ID", "RELAX_ROLLOUT_MODE",
                                  "RELAX_GROUP_ID"])
    assert out["input"] == {"messages": [{"role": "user", "content": "hi"}]}
    assert out["cwd"] == str(tmp_path)
    assert out["foo"] == "bar"
    assert out["stdin"] == ""
    assert "hello from agent" in run.log_tail and "to stderr" in run.log_tail
    assert not Path(out["io"]).exists(), "the per-session IO dir is removed afterwards"
    assert run.return_code == 0


async def test_missing_output_is_none(tmp_path: Path) -> None:
    config = AgentConfig(command="true", cwd=tmp_path, timeout_s=60)
    with trio.fail_after(30):
        run = await run_agent(config, _env(), {}, _budget(60))
    assert run.output_text is None


async def test_nonzero_exit_raises_with_log_tail(tmp_path: Path) -> None:
    config = AgentConfig(command="echo boom-marker; echo " + "x" * 100 + "; exit 3",
                         cwd=tmp_path, timeout_s=60)
    with trio.fail_after(30), pytest.raises(AgentExecutionError) as info:
        await run_agent(config, _env(), {}, _budget(60))
    assert str(info.value).startswith("Agent exited with code 3.")
    assert "boom-marker" in str(info.value)


async def test_log_tail_is_bounded_to_8_kib(tmp_path: Path) -> None:
    config = AgentConfig(command=f"{PY} -c \"print('A'*20000); print('END'); raise SystemExit(1)\"",
                         cwd=tmp_path, timeout_s=60)
    with trio.fail_after(30), pytest.raises(AgentExecutionError) as info:
        await run_agent(config, _env(), {}, _budget(60))
    tail = str(info.value).split("\n", 1)[1]
    assert tail.endswith("END") and len(tail.encode()) <= 8192


async def test_grandchild_of_normal_exit_is_terminated(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    # The leader exits 0 at once; the grandchild (same process group) would sleep for an hour.
    config = AgentConfig(command=f"(sleep 3600 & echo $! > {pidfile}); exit 0", cwd=tmp_path,
                         timeout_s=60)
    with trio.fail_after(30):
        await run_agent(config, _env(), {}, _budget(60))
    pid = int(pidfile.read_text())
    assert not alive(pid)


async def test_timeout_terminates_agent_that_ignores_sigterm_and_its_grandchild(
    tmp_path: Path,
) -> None:
    # Real clock on purpose: the agent is a real process (autojump would expire the bounded
    # waits before the kernel delivers signals). The budget arithmetic itself is tested with
    # MockClock in test_active_budget_pauses_and_resumes.
    pipe = PidPipe(tmp_path / "pids")
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import os, signal, subprocess, time, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen(['sleep', '3600'])\n"
        f"open({str(pipe.path)!r}, 'w').write(f'{{os.getpid()}}\\n{{child.pid}}\\n')\n"
        "time.sleep(3600)\n"
    )
    config = AgentConfig(command=f"{PY} stubborn.py", cwd=tmp_path, timeout_s=0.5, term_grace_s=0.5)
    budget = ActiveBudget(total_s=0.5)  # paused until the agent is up: waiting costs no budget

    with trio.fail_after(30), pytest.RaisesGroup(pytest.RaisesExc(AgentExecutionError,
                                             match=r"^Agent timed out after 0.5 s of active time\.")):
        async with trio.open_nursery() as nursery:
            pgid = await nursery.start(run_agent, config, _env(), {}, budget)
            pids = await pipe.read_pids(2)  # the agent and its child are up
            start = trio.current_time()
            budget.resume()
    await pipe.aclose()
    assert trio.current_time() - start >= 0.5
    for pid in pids:
        assert not alive(pid)
    assert not group_alive(pgid)


async def test_cancellation_terminates_the_whole_group(tmp_path: Path) -> None:
    pipe = PidPipe(tmp_path / "pids")
    config = AgentConfig(
        command=f"sleep 3600 & echo $! > {pipe.path}; wait", cwd=tmp_path, timeout_s=3600
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            pgid = await nursery.start(run_agent, config, _env(), {}, _budget(3600))
            [grandchild] = await pipe.read_pids(1)
            nursery.cancel_scope.cancel()
    await pipe.aclose()
    assert not group_alive(pgid)
    assert not alive(grandchild)


async def test_agent_killed_by_signal_is_an_error(tmp_path: Path) -> None:
    config = AgentConfig(command="kill -9 $$", cwd=tmp_path, timeout_s=60)
    with trio.fail_after(30), pytest.raises(AgentExecutionError, match="exited with code"):
        await run_agent(config, _env(), {}, _budget(60))


async def test_active_budget_pauses_and_resumes(autojump_clock: trio.testing.MockClock) -> None:
    budget = ActiveBudget(total_s=10.0)
    assert budget.scope.deadline == float("inf") and not budget.running
    await trio.sleep(100)  # prelaunched: waiting costs nothing
    budget.resume()
    t0 = trio.current_time()
    assert budget.scope.deadline == t0 + 10.0
    await trio.sleep(3)
    budget.pause()
    assert budget.remaining_s() == 7.0 and budget.scope.deadline == float("inf")
    await trio.sleep(50)
    budget.resume()
    assert budget.scope.deadline == trio.current_time() + 7.0
    with budget.scope:
        await trio.sleep(1000)
    assert budget.expired
    assert trio.current_time() == t0 + 3 + 50 + 7


def test_agent_env_validation(tmp_path: Path) -> None:
    assert parse_agent_env(["A=1", "B=x=y", "A=2"]) == {"A": "2", "B": "x=y"}
    with pytest.raises(ConfigError, match="reserved key 'RELAX_SESSION_ID'"):
        parse_agent_env(["RELAX_SESSION_ID=x"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_agent_env(["novalue"])
    with pytest.raises(ConfigError, match="reserved key"):
        AgentConfig(command="true", cwd=tmp_path, env={"RELAX_X": "1"})
    with pytest.raises(ConfigError, match="not an existing directory"):
        AgentConfig(command="true", cwd=tmp_path / "missing")
    with pytest.raises(ConfigError, match="blank"):
        AgentConfig(command="  ", cwd=tmp_path)
    with pytest.raises(ConfigError, match="positive"):
        AgentConfig(command="true", cwd=tmp_path, timeout_s=0)


async def test_setsid_and_nohup_descendants_are_terminated(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # Three ways to escape a process group's signals; all keep RELAX_SESSION_ID in their env.
    command = (f"(sleep 3601 & echo $! >> {pids}); nohup sleep 3602 >/dev/null 2>&1 & echo $! >> {pids}; "
               f"setsid sleep 3603 & echo $! >> {pids}; sleep 0.2; exit 0")
    config = AgentConfig(command=command, cwd=tmp_path, timeout_s=60, term_grace_s=0.5)
    with trio.fail_after(30):
        await run_agent(config, _env(), {}, _budget(60))
    found = [int(p) for p in pids.read_text().split()]
    assert len(found) == 3 and not any(alive(pid) for pid in found)


async def test_activated_virtualenv_survives_the_login_shell(tmp_path: Path) -> None:
    venv = Path(sys.prefix)
    config = AgentConfig(command="command -v python > where.txt", cwd=tmp_path,
                         env={"VIRTUAL_ENV": str(venv)}, timeout_s=60)
    with trio.fail_after(30):
        await run_agent(config, _env(), {}, _budget(60))
    assert (tmp_path / "where.txt").read_text().strip() == str(venv / "bin" / "python")
