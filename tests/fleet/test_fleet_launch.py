"""Launched engines: readiness, restarts within their budget, and no process left behind in any
way out."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing
from tests.support.procs import alive
from tests.support.waits import wait_until

from relaxtrio import EngineUnavailableError
from relaxtrio.config import FleetConfig
from relaxtrio.rollout.turns import MAX_EMPTY_ABORTS
from relaxtrio.fleet.fleet import EngineFleet, open_engine_fleet
from relaxtrio.fleet.launch_fleet import LaunchedFleet, open_launched_fleet
from relaxtrio.fleet.processes import LaunchedProcess
from relaxtrio.fleet.starter import LocalStarter, ProcessSpec
from relaxtrio.sglang.wire import SamplingParams

pytestmark = pytest.mark.slow  # starts real processes

SHORT = SamplingParams(max_new_tokens=3, temperature=0.0)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def engine_pid(shim_pid: int) -> int:
    """The engine process under a reaper shim."""
    children = Path(f"/proc/{shim_pid}/task/{shim_pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


@contextlib.asynccontextmanager
async def _one_supervised_engine(config: FleetConfig, model_dir: Path, log_dir: Path,
                                 pgids: list[int]) -> AsyncIterator[tuple[LaunchedFleet, EngineFleet, str]]:
    """One launched embedded engine in a fleet that its supervisor reports to; its first
    process group is appended to ``pgids``."""
    async with open_launched_fleet(config, model_dir=model_dir, log_dir=log_dir,
                                   kind="embedded") as launched:
        pgids.extend(launched.pids())
        [url] = launched.worker_urls
        async with open_engine_fleet(config, worker_urls=[url]) as fleet:
            launched.attach(fleet)
            yield launched, fleet, url


def test_restarts_are_counted_within_a_sliding_window() -> None:
    """``engine_restarts`` per window: a crash loop is refused, a death an hour later is not."""
    proc = LaunchedProcess(spec=ProcessSpec(name="engine 0", cmd=["x"], log_path=Path("x.log")),
                 starter=LocalStarter(), max_restarts=2, restart_window_s=3600.0)
    taken: list[tuple[float, bool]] = []

    async def deaths() -> None:
        for at in (0.0, 10.0, 20.0, 3599.0, 3601.0, 3611.0, 3612.0):
            await trio.sleep_until(at)
            taken.append((at, proc.take_restart()))

    trio.run(deaths, clock=trio.testing.MockClock(autojump_threshold=0))
    # 0 and 10 fit; 20 and 3599 are the 3rd in an hour; 3601 (0 has left the window) and 3611
    # (10 has left) fit; 3612 is the 3rd within [12, 3612].
    assert taken == [(0.0, True), (10.0, True), (20.0, False), (3599.0, False), (3601.0, True),
                     (3611.0, True), (3612.0, False)]
    assert proc.supervised
    assert not attrs.evolve(proc, max_restarts=0).supervised


async def test_a_dead_embedded_engine_is_restarted_once(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    config = FleetConfig(num_engines=1, health_interval_s=0.2, engine_restarts=1)
    pgids: list[int] = []
    with trio.fail_after(240), pytest.RaisesGroup(
        pytest.RaisesExc(EngineUnavailableError, match="fewer than --min-healthy-engines 1"),
        flatten_subgroups=True,
    ):
        async with _one_supervised_engine(config, tiny_model_dir, tmp_path, pgids) as (
                launched, fleet, url):
            os.kill(engine_pid(pgids[0]), signal.SIGKILL)
            await wait_until(lambda: url in fleet.statistics().removed, timeout_s=120,
                             what="the fleet to remove the killed engine")
            # The only worker is being restarted: a generation waits for it.
            result = await fleet.generate([1, 2, 3], SHORT, rid="a:t0#", routing_key="a")
            assert fleet.urls == (url,)
            os.kill(engine_pid(launched.pids()[0]), signal.SIGKILL)
            await trio.sleep(60)  # the monitor stops the fleet: no restart left
    assert result.finish_type == "length"
    messages = [r.getMessage() for r in caplog.records]
    assert any("engine 0 exited with code 137 (killed by SIGKILL); restarting" in m for m in messages)
    assert sum("restarting it on port" in m for m in messages) == 1  # once, not twice
    assert any("(restart 1 of 1 within 60 min;" in m for m in messages)
    assert any("not restarting it: its restart budget is spent (1 restart(s) within the last "
               "60 min, --engine-restarts 1): it keeps dying" in m for m in messages)
    assert (tmp_path / "engine-0.log").read_text().count("RELAXTRIO_ENGINE_URL=") == 2  # restarted once
    assert not any(group_alive(p) for p in pgids)


async def _restarted_engine(url: str, old_pid: int) -> int:
    """The process of the engine that replaces ``old_pid`` on ``url``'s port, as soon as it
    exists (while it loads the model: the supervisor learns its URL only once it serves)."""
    port = url.rsplit(":", 1)[1].encode()
    while True:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == old_pid:
                continue
            with contextlib.suppress(OSError):
                args = (entry / "cmdline").read_bytes().split(b"\0")
                shim = b"--parent" in args  # the reaper shim's argv holds the engine's
                if b"relaxtrio.engine" in args and port in args and not shim:
                    return int(entry.name)
        await trio.sleep(0.005)


async def test_an_engine_that_dies_while_restarting_is_restarted_again(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A failed restart is one more death within the budget, not the end of the run."""
    caplog.set_level(logging.INFO)
    config = FleetConfig(num_engines=1, health_interval_s=0.2, engine_restarts=3)
    pgids: list[int] = []
    with trio.fail_after(240):
        async with _one_supervised_engine(config, tiny_model_dir, tmp_path, pgids) as (
                _launched, fleet, url):
            first = engine_pid(pgids[0])
            os.kill(first, signal.SIGKILL)
            # Killed while it loads the model, before it announces its URL.
            second = await _restarted_engine(url, first)
            pgids.append(os.getpgid(second))
            os.kill(second, signal.SIGKILL)
            result = await fleet.generate([1, 2, 3], SHORT, rid="a:t0#", routing_key="a")
            assert fleet.urls == (url,)
    assert result.finish_type == "length"
    messages = [r.getMessage() for r in caplog.records]
    assert any("engine 0 could not be restarted (" in m and "(restart 2 of 3 within 60 min;" in m
               for m in messages), messages
    assert not any(group_alive(p) for p in pgids)


async def test_generations_wait_while_every_engine_behind_the_gateway_restarts(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Both engines killed at once: the gateway answers 503 (no worker) until they are back.
    A generation then waits for the restarts instead of failing fast, once per try, until the
    turn gives up (MAX_EMPTY_ABORTS tries without progress: an HTTP 500 for the agent)."""
    pytest.importorskip("smg")
    config = FleetConfig(num_engines=2, health_interval_s=1.0, engine_restarts=3)
    pgids: list[int] = []
    results = []
    with trio.fail_after(240):
        async with open_launched_fleet(config, model_dir=tiny_model_dir, log_dir=tmp_path,
                                       kind="embedded") as launched:
            assert launched.gateway_url is not None
            async with open_engine_fleet(config, gateway_url=launched.gateway_url,
                                         expect_urls=launched.worker_urls) as fleet:
                launched.attach(fleet)
                first = await fleet.generate([1, 2, 3], SHORT, rid="k:t0#", routing_key="k")
                pgids.extend(launched.pids())
                for pgid in pgids:
                    child = engine_pid(pgid)
                    if b"relaxtrio.engine" in Path(f"/proc/{child}/cmdline").read_bytes():
                        os.kill(child, signal.SIGKILL)
                for attempt in range(MAX_EMPTY_ABORTS):  # what the turn's resume loop does
                    results.append(await fleet.generate([1, 2, 3], SHORT, rid=f"k:t1:a{attempt}#",
                                                        routing_key="k"))
                    if results[-1].finish_type != "abort":
                        break
                await wait_until(lambda: sorted(fleet.urls) == sorted(launched.worker_urls),
                                 timeout_s=300, what="both restarted engines back in the fleet")
    assert first.finish_type == "length"
    # Only tries that raced the kills are lost (sent before the fleet saw both deaths); then
    # one waits for the restarts. Without that wait every try is lost within about 3 s.
    assert [r.finish_type for r in results][-1] == "length" and len(results) <= 3, results
    assert not any(group_alive(p) for p in pgids)


_ORPHAN_SCRIPT = textwrap.dedent("""
    import json, sys, trio
    from pathlib import Path
    from relaxtrio.config import FleetConfig
    from relaxtrio.fleet.launch_fleet import open_launched_fleet

    async def main():
        config = FleetConfig(num_engines=1)
        async with open_launched_fleet(config, model_dir=Path(sys.argv[1]),
                                       log_dir=Path(sys.argv[2]), kind="embedded") as launched:
            print(json.dumps(launched.pids()), flush=True)
            await trio.sleep_forever()

    trio.run(main)
""")


async def test_engines_die_with_a_driver_that_was_sigkilled(tiny_model_dir: Path,
                                                            tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(_ORPHAN_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    driver = await trio.lowlevel.open_process(
        [sys.executable, str(script), str(tiny_model_dir), str(tmp_path / "logs")],
        stdout=subprocess.PIPE, env=env)
    assert driver.stdout is not None
    with trio.fail_after(180):
        line = b""
        while not line.endswith(b"\n"):
            chunk = await driver.stdout.receive_some(4096)
            assert chunk, "the driver exited before launching"
            line += chunk
        pgids = json.loads(line)
        engine = engine_pid(pgids[0])
        driver.kill()
        await driver.wait()
        await wait_until(lambda: not (group_alive(pgids[0]) or alive(engine)), timeout_s=120,
                         what="the orphaned engine's process group to exit")
