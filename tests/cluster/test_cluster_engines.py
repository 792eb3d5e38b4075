"""Launched engines as Ray actors behind the real gateway: generation, restarts, nothing left.

One Ray start serves the module (``conftest.py``'s ``ray_cluster``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
from pathlib import Path

import httpx
import pytest
import trio
from tests.support.procs import alive, descendants
from tests.support.ray_state import live_actors
from tests.support.waits import WaitTimeout, wait_until

from relaxtrio.config import FleetConfig
from relaxtrio.fleet.fleet import EngineFleet, open_engine_fleet
from relaxtrio.fleet.launch_fleet import open_launched_fleet
from relaxtrio.sglang.wire import SamplingParams

pytest.importorskip("ray")
pytest.importorskip("smg")
pytestmark = [
    pytest.mark.slow,
    # A worker killed under a request leaves httpx's request body generator unfinished.
    pytest.mark.filterwarnings(
        "ignore:Async generator 'httpx._content.ByteStream.__aiter__':ResourceWarning"),
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object ByteStream.__aiter__"
        ":pytest.PytestUnraisableExceptionWarning"),
]

PROMPT = [1, 87, 555, 201, 57, 74, 271, 321]
SHORT = SamplingParams(max_new_tokens=3, temperature=0.0)


def _is_gateway(cmdline: bytes) -> bool:
    """The gateway (it renames itself ``smg::router``) or its reaper shim (``-m smg launch``)."""
    return b"smg::router" in cmdline or b"\0smg\0launch\0" in cmdline


def _engine_pids(root: int) -> list[int]:
    """Embedded engine processes (not their reaper shims) under ``root``."""
    out = []
    for pid in descendants(root):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"relaxtrio.engine" in argv and not any(a.endswith(b"_reaper.py") for a in argv):
            out.append(pid)
    return out


async def _label_and_generate(fleet: EngineFleet, urls: tuple[str, ...], tag: str) -> set[str]:
    """Labels each worker with its own weight version, then routes fresh Session keys through
    the gateway until both labels answered; returns the labels seen."""
    async with httpx.AsyncClient() as client:
        for i, url in enumerate(urls):
            response = await client.post(url + "/update_weight_version",
                                         json={"new_version": f"{tag}{i}"})
            assert response.status_code == 200, response.text
    seen: set[str] = set()
    for i in range(40):
        key = f"{tag}-k{i}"
        result = await fleet.generate(PROMPT, SHORT, rid=f"{key}:t0#", routing_key=key)
        assert result.finish_type == "length"
        seen.add(result.weight_version)
        if len(seen) == len(urls):
            break
    return seen


async def _wait_back(fleet: EngineFleet, old_url: str, count: int) -> None:
    """Waits until ``old_url`` was removed and ``count`` workers are live again, each listed
    healthy by the gateway (a readmitted one takes keys only then)."""
    await wait_until(lambda: old_url not in fleet.urls, timeout_s=120, what=f"{old_url} to leave")
    await wait_until(lambda: len(fleet.urls) >= count and not fleet.members.joining, timeout_s=300,
                     what=f"{count} live workers", interval_s=0.2)


async def test_ray_engines_serve_restart_and_leave_nothing(
    ray_cluster, tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from relaxtrio.cluster.engines import RayEngineStarter

    caplog.set_level(logging.INFO)
    ray = ray_cluster
    starter = await trio.to_thread.run_sync(
        functools.partial(RayEngineStarter.connect, "auto", num_cpus=0.5))
    config = FleetConfig(num_engines=2, health_interval_s=0.5, engine_restarts=1)
    root = os.getpid()
    others = set(_engine_pids(root))  # e.g. a session-scoped engine of other tests
    with trio.fail_after(600):  # two tiny-model engines, twice, on 2 loaded cores
        async with open_launched_fleet(config, model_dir=tiny_model_dir, log_dir=tmp_path,
                                       kind="embedded", starter=starter) as launched:
            assert launched.gateway_url is not None
            assert [h.pid for n, h in launched.handles().items() if n != "gateway"] == [None, None]
            assert len(live_actors("_EngineActor")) == 2
            async with open_engine_fleet(config, gateway_url=launched.gateway_url) as fleet:
                launched.attach(fleet)
                urls = launched.worker_urls
                assert sorted(fleet.urls) == sorted(urls)
                assert await _label_and_generate(fleet, urls, "a") == {"a0", "a1"}

                # The engine process dies: its supervisor restarts it in the same actor.
                first = launched.handles()["engine 0"]
                shim = first.remote_pgid  # this node: the reaper shim leads the group
                [pid] = Path(f"/proc/{shim}/task/{shim}/children").read_text().split()
                os.kill(int(pid), signal.SIGKILL)
                await _wait_back(fleet, first.url, 2)
                assert launched.handles()["engine 0"].actor is first.actor

                # The actor dies: the engine's group goes with it, a new actor takes over.
                second = launched.handles()["engine 1"]
                await trio.to_thread.run_sync(ray.kill, second.actor)
                await _wait_back(fleet, second.url, 2)
                assert launched.handles()["engine 1"].actor is not second.actor
                urls = launched.worker_urls
                assert sorted(fleet.urls) == sorted(urls)
                assert await _label_and_generate(fleet, urls, "b") == {"b0", "b1"}
    messages = [r.getMessage() for r in caplog.records]
    assert any("engine 0 exited with code 137 (killed by SIGKILL) on node" in m
               and "restarting it" in m for m in messages)
    assert any("engine 1 exited with the loss of its Ray actor" in m and "restarting it" in m
               for m in messages)
    assert sum("joined" in m for m in messages) >= 2  # both readmitted
    with contextlib.suppress(WaitTimeout):  # an actor's reaper shim may still be taking its group down
        await wait_until(lambda: not (set(_engine_pids(root)) - others or live_actors("_EngineActor")),
                         timeout_s=30, what="the engines to exit", interval_s=0.2)
    assert not set(_engine_pids(root)) - others
    assert not live_actors("_EngineActor")
    gateways = [p for p in descendants(root) if alive(p)
                and _is_gateway(Path(f"/proc/{p}/cmdline").read_bytes())]
    assert not gateways
