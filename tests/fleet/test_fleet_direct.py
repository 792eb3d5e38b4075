"""The fleet without a gateway, on real embedded engines: routing, fan-out, weights, faults."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
import torch
import trio
from tests.fleet.fleet_helpers import IGNORE_DROPPED_BODY, long_sampling, wait_running
from tests.support.waits import wait_until

from relaxtrio import EngineUnavailableError
from relaxtrio.config import FleetConfig
from relaxtrio.models import load_model
from relaxtrio.sglang.client import open_engine_client
from relaxtrio.fleet.fleet import open_engine_fleet
from relaxtrio.sglang.wire import SamplingParams
from relaxtrio.shm_weights import ShmWeightWriter
from relaxtrio.train.checkpoint import save_weights_dir

pytestmark = IGNORE_DROPPED_BODY

PROMPT = [1, 87, 555, 201, 57, 74, 271, 321]
SHORT = SamplingParams(max_new_tokens=3, temperature=0.0)


def _config(urls: list[str], **kwargs) -> FleetConfig:
    return FleetConfig(engine_urls=urls, **{"health_interval_s": 0.2, **kwargs})


async def test_sessions_spread_over_workers_and_stick(start_engines) -> None:
    engines = await start_engines(2)
    with trio.fail_after(60):
        async with open_engine_fleet(_config(engines.urls), worker_urls=engines.urls) as fleet:
            served: dict[str, set[str]] = {}
            for turn in range(3):
                for s in range(4):
                    result = await fleet.generate(PROMPT, SHORT, rid=f"s{s}:t{turn}#",
                                                  routing_key=f"s{s}")
                    served.setdefault(f"s{s}", set()).add(result.weight_version)
            stats = fleet.statistics()
    assert all(len(labels) == 1 for labels in served.values()), served
    assert set().union(*served.values()) == {"w0", "w1"}
    assert sorted(stats.sessions.values()) == [2, 2]


async def test_request_ids_must_not_be_prefixes(start_engines) -> None:
    engines = await start_engines(1)
    async with open_engine_fleet(_config(engines.urls), worker_urls=engines.urls) as fleet:
        with pytest.raises(ValueError, match="must end in '#'"):
            await fleet.generate(PROMPT, SHORT, rid="s1:t1")
        with pytest.raises(ValueError, match="no other '#'"):
            await fleet.generate(PROMPT, SHORT, rid="s#1:t1#")


async def test_abort_reaches_every_worker(start_engines) -> None:
    engines = await start_engines(2)
    results = {}
    with trio.fail_after(120):
        async with open_engine_fleet(_config(engines.urls), worker_urls=engines.urls) as fleet:

            async def run(key: str) -> None:
                results[key] = await fleet.generate(PROMPT, long_sampling(), rid=f"{key}:t0#",
                                                    routing_key=key)

            async with trio.open_nursery() as nursery:
                for key in ("a", "b"):
                    nursery.start_soon(run, key)
                for url in engines.urls:
                    await wait_running(url, 1)
                for key in ("a", "b"):
                    await fleet.abort(f"{key}:t0#")
    assert {r.weight_version for r in results.values()} == {"w0", "w1"}
    for result in results.values():
        assert result.finish_type == "abort"
        assert 0 < len(result.output_ids) < long_sampling().max_new_tokens


async def test_weights_reach_every_worker_from_disk_and_shared_memory(
    start_engines, tiny_model_dir: Path, tmp_path: Path
) -> None:
    engines = await start_engines(2)
    model = load_model(tiny_model_dir)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05)
    writer = ShmWeightWriter(tmp_path)
    try:
        with trio.fail_after(120):
            async with open_engine_fleet(_config(engines.urls), worker_urls=engines.urls) as fleet:
                before = await fleet.generate(PROMPT, SHORT, rid="a:t0#", routing_key="a")
                path = str(save_weights_dir(model, tmp_path / "step-1"))
                await fleet.update_weights(path, "step-1")
                disk = [await fleet.model_info(url) for url in engines.urls]
                after_disk = await fleet.generate(PROMPT, SHORT, rid="a:t1#", routing_key="a")
                with torch.no_grad():
                    for param in model.parameters():
                        param.add_(-0.05)  # back to the original weights
                manifest = await trio.to_thread.run_sync(writer.write, model, "step-2")
                await fleet.update_weights(str(manifest), "step-2")
                shm = [await fleet.model_info(url) for url in engines.urls]
                after_shm = await fleet.generate(PROMPT, SHORT, rid="a:t2#", routing_key="a")
                assert fleet.statistics().weight_version == "step-2"
    finally:
        writer.close()
    assert [info["weight_version"] for info in disk] == ["step-1", "step-1"]
    assert [info["weight_version"] for info in shm] == ["step-2", "step-2"]
    assert after_disk.weight_version == "step-1" and after_shm.weight_version == "step-2"
    assert after_disk.output_logprobs != before.output_logprobs
    # The shared-memory version is the original model again: the same greedy logprobs.
    assert max(abs(a - b) for a, b in zip(after_shm.output_logprobs, before.output_logprobs,
                                          strict=True)) < 1e-5
    assert not writer.directory.exists()


async def test_a_stopped_worker_is_removed_and_its_turn_resumes_elsewhere(
    start_engines, caplog: pytest.LogCaptureFixture
) -> None:
    engines = await start_engines(2)
    caplog.set_level(logging.WARNING, logger="relaxtrio.fleet.fleet")
    with trio.fail_after(120):
        async with open_engine_fleet(_config(engines.urls), worker_urls=engines.urls) as fleet:
            first = await fleet.generate(PROMPT, SHORT, rid="a:t0#", routing_key="a")
            victim = engines.urls[engines.labels.index(first.weight_version)]
            lost = {}

            async def run() -> None:
                lost["result"] = await fleet.generate(PROMPT, long_sampling(), rid="a:t1#",
                                                      routing_key="a")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                await wait_running(victim, 1)
                engines.stop(engines.urls.index(victim))
            resumed = await fleet.generate(PROMPT, SHORT, rid="a:t1:a1#", routing_key="a")
            stats = fleet.statistics()
    assert lost["result"].finish_type == "abort" and lost["result"].output_ids == ()
    assert resumed.weight_version != first.weight_version
    assert stats.workers == tuple(u for u in engines.urls if u != victim)
    assert victim in stats.removed
    assert any(f"worker {victim} removed" in r.getMessage() for r in caplog.records)


async def test_a_worker_that_stops_answering_is_removed(start_engines) -> None:
    """A listener that accepts connections and never answers: probes time out."""
    engines = await start_engines(1)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    silent_url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"

    async def swallow(stream: trio.SocketStream) -> None:
        async with stream:
            await trio.sleep_forever()

    urls = [silent_url, *engines.urls]
    config = _config(urls, health_timeout_s=0.3, health_failures=2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, swallow, listeners)
        with trio.fail_after(60):
            async with open_engine_fleet(config, worker_urls=urls) as fleet:
                await wait_until(lambda: silent_url not in fleet.urls, timeout_s=30,
                                 what="the health loop to drop the silent worker")
                stats = fleet.statistics()
                result = await fleet.generate(PROMPT, SHORT, rid="x:t0#", routing_key="x")
        nursery.cancel_scope.cancel()
    assert "probes in a row" in stats.removed[silent_url]
    assert result.weight_version == "w0"


async def test_the_run_stops_when_too_few_workers_remain(start_engines) -> None:
    engines = await start_engines(2)
    config = _config(engines.urls, min_healthy_engines=2)
    with trio.fail_after(60), pytest.RaisesGroup(
        pytest.RaisesExc(EngineUnavailableError, match="fewer than --min-healthy-engines 2"),
        flatten_subgroups=True,
    ):
        async with open_engine_fleet(config, worker_urls=engines.urls):
            engines.stop(1)
            await trio.sleep(30)


async def test_session_lifecycle_closes_on_the_serving_worker(start_engines) -> None:
    engines = await start_engines(2)
    config = _config(engines.urls, session_lifecycle=True)
    with trio.fail_after(60):
        async with (
            open_engine_fleet(config, worker_urls=engines.urls) as fleet,
            httpx.AsyncClient() as http,
        ):
            async def open_sessions() -> list[int]:
                return [(await http.get(f"{url}/server_info")).json()["num_open_sessions"]
                        for url in engines.urls]

            for key in ("a", "b"):
                await fleet.generate(PROMPT, SHORT, rid=f"{key}:t0#", routing_key=key)
            during = await open_sessions()
            fleet.session_ended("a")
            fleet.session_ended("b")
            async def closed() -> bool:
                return await open_sessions() == [0, 0]

            await wait_until(closed, timeout_s=30, what="both engines to close the ended sessions")
    assert during == [1, 1]


async def test_a_worker_that_refuses_the_weights_is_removed_but_not_left_paused(
    start_engines, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A connected engine outlives the run: after a refused update it serves again (not paused
    for its next user), while this run no longer routes to it."""
    engines = await start_engines(2)
    good, bad = engines.urls
    path = str(save_weights_dir(load_model(tiny_model_dir), tmp_path / "step-1"))
    broken = tmp_path / "not-weights"
    broken.mkdir()
    with trio.fail_after(120):
        async with open_engine_fleet(_config(engines.urls), worker_urls=engines.urls) as fleet:
            await fleet.update_weights(lambda url: path if url == good else str(broken), "step-1")
            assert fleet.urls == (good,)
    with trio.fail_after(30):  # a paused engine holds it until then
        async with open_engine_client(bad) as client:
            result = await client.generate(PROMPT, SHORT, rid="after:t0#")
    assert result.finish_type == "length" and result.weight_version == "w1"  # its old weights
