"""The fleet behind the real gateway (PyPI ``smg``, the Shepherd Model Gateway) on embedded engines."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import attrs
import httpx
import pytest
import torch
import trio
from tests.fleet.fleet_helpers import IGNORE_DROPPED_BODY, long_sampling, wait_running
from tests.support.waits import wait_until

from relaxtrio._errors import BackendError
from relaxtrio.config import FleetConfig
from relaxtrio.models import load_model
from relaxtrio.fleet.fleet import EngineFleet, open_engine_fleet
from relaxtrio.fleet.gateway import GATEWAY_POLL_S, SMG_DRAIN_S
from relaxtrio.fleet.gateway_metrics import parse_prometheus_text, worker_counters
from relaxtrio.fleet.launch_fleet import open_gateway
from relaxtrio.sglang.wire import SamplingParams
from relaxtrio.train.checkpoint import save_weights_dir
from relaxtrio.train.ranks import free_port

pytest.importorskip("smg")

pytestmark = [pytest.mark.slow, *IGNORE_DROPPED_BODY]

PROMPT = [1, 87, 555, 201, 57, 74, 271, 321]
SHORT = SamplingParams(max_new_tokens=3, temperature=0.0)
CONFIG = FleetConfig(health_interval_s=0.5)


async def keys_per_worker(fleet: EngineFleet, labels: list[str], prefix: str = "k") -> dict[str, str]:
    """Route fresh keys until every label was seen; returns label → one key pinned there."""
    found: dict[str, str] = {}
    for i in range(40):
        key = f"{prefix}{i}"
        result = await fleet.generate(PROMPT, SHORT, rid=f"{key}:probe#", routing_key=key)
        found.setdefault(result.weight_version, key)
        if len(found) == len(labels):
            return found
    raise AssertionError(f"40 keys all went to {sorted(found)}")


async def test_every_turn_of_a_session_goes_to_one_worker(start_engines, tmp_path: Path) -> None:
    engines = await start_engines(2)
    served: dict[str, set[str]] = {}
    with trio.fail_after(120):
        async with (
            open_gateway(CONFIG, engines.urls, log_dir=tmp_path) as launched,
            open_engine_fleet(CONFIG, gateway_url=launched.gateway_url,
                              expect_urls=engines.urls) as fleet,
        ):
            # The gateway registers its workers a moment after its /health answers; with
            # expect_urls the fleet opens only once it lists them all.
            assert sorted(fleet.urls) == sorted(engines.urls)

            async def session(key: str) -> None:
                for turn in range(3):
                    result = await fleet.generate(PROMPT, SHORT, rid=f"{key}:t{turn}#",
                                                  routing_key=key)
                    served.setdefault(key, set()).add(result.weight_version)

            async with trio.open_nursery() as nursery:
                for s in range(8):
                    nursery.start_soon(session, f"s{s}")
            await keys_per_worker(fleet, engines.labels)
    assert all(len(labels) == 1 for labels in served.values()), served


async def test_the_gateway_only_routes_and_counts_per_worker(start_engines, tmp_path: Path) -> None:
    """The launched gateway pins keys (manual policy) with its own retries, circuit breaker and
    rerouting off, and the fleet reads its per-worker counters as each step's change."""
    engines = await start_engines(2)
    with trio.fail_after(120):
        async with (
            open_gateway(CONFIG, engines.urls, log_dir=tmp_path) as launched,
            open_engine_fleet(CONFIG, gateway_url=launched.gateway_url,
                              expect_urls=engines.urls) as fleet,
            httpx.AsyncClient() as http,
        ):
            cmd = launched.handles()["gateway"].cmd
            launched.attach(fleet)
            keys = await keys_per_worker(fleet, engines.labels)
            await fleet.gateway_metrics()  # what routing the probes cost
            for label, count in (("w0", 3), ("w1", 2)):
                for turn in range(count):
                    await fleet.generate(PROMPT, SHORT, rid=f"{keys[label]}:m{turn}#",
                                         routing_key=keys[label])
            step = await fleet.gateway_metrics()
            assert launched.gateway_metrics_url is not None
            text = (await http.get(launched.gateway_metrics_url + "/metrics")).text
    assert cmd[cmd.index("--policy") + 1] == "manual"
    assert cmd[cmd.index("--routing-key-headers") + 1] == "x-smg-routing-key"
    assert {"--disable-retries", "--disable-circuit-breaker", "--no-remove-unhealthy-workers",
            "--disable-worker-overload-protection"} <= set(cmd)
    w0, w1 = (u.removeprefix("http://") for u in engines.urls)
    assert step == {"gateway/requests": 5.0, "gateway/failures": 0.0, "gateway/errors": 0.0,
                    f"gateway/requests/{w0}": 3.0, f"gateway/failures/{w0}": 0.0,
                    f"gateway/requests/{w1}": 2.0, f"gateway/failures/{w1}": 0.0}
    # The real exposition: one requests series per worker, labelled with its base URL.
    samples = parse_prometheus_text(text)
    requests = {s.labels["worker"]: s.value for s in samples
                if s.name == "smg_worker_requests_total"}
    assert sorted(requests) == sorted(engines.urls)
    counters = worker_counters(samples)
    assert {u: c["requests"] for u, c in counters.items() if u} == requests
    assert sum(requests.values()) >= 5 + len(engines.urls)


async def test_a_launched_worker_the_gateway_never_lists_is_waited_for_then_warned(
    start_engines, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engines = await start_engines(1)
    config = FleetConfig(health_interval_s=0.5, gateway_wait_s=3.0)
    missing = "http://127.0.0.1:9"  # expected, but not one of the gateway's workers
    with trio.fail_after(120):
        async with open_gateway(config, engines.urls, log_dir=tmp_path) as launched:
            start = trio.current_time()
            async with open_engine_fleet(config, gateway_url=launched.gateway_url,
                                         expect_urls=[*engines.urls, missing]) as fleet:
                waited_s = trio.current_time() - start
                assert fleet.urls == tuple(engines.urls)
    assert waited_s >= 3.0
    assert any("lists 1 of the 2 launched workers (missing: http://127.0.0.1:9)" in r.getMessage()
               for r in caplog.records)


async def test_control_calls_reach_every_worker_the_gateway_lists(
    start_engines, tiny_model_dir: Path, tmp_path: Path
) -> None:
    engines = await start_engines(2)
    model = load_model(tiny_model_dir)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05)
    weights = str(save_weights_dir(model, tmp_path / "step-1"))
    results = {}
    with trio.fail_after(180):
        async with (
            open_gateway(CONFIG, engines.urls, log_dir=tmp_path) as launched,
            open_engine_fleet(CONFIG, gateway_url=launched.gateway_url) as fleet,
        ):
            keys = await keys_per_worker(fleet, engines.labels)

            async def run(label: str, key: str) -> None:
                results[label] = await fleet.generate(PROMPT, long_sampling(), rid=f"{key}:long#",
                                                      routing_key=key)

            async with trio.open_nursery() as nursery:
                for label, key in keys.items():
                    nursery.start_soon(run, label, key)
                for url in engines.urls:
                    await wait_running(url, 1)
                for key in keys.values():
                    await fleet.abort(f"{key}:long#")  # the step-close abort
            await fleet.update_weights(weights, "step-1")
            versions = [(await fleet.model_info(url))["weight_version"] for url in engines.urls]
            after = await fleet.generate(PROMPT, SHORT, rid="k0:after#", routing_key="k0")
            await fleet.flush_cache()
    assert sorted(results) == ["w0", "w1"]
    assert all(r.finish_type == "abort" and r.output_ids for r in results.values())
    assert versions == ["step-1", "step-1"]
    assert after.weight_version == "step-1"


async def test_open_gateway_waits_for_every_worker(start_engines, tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """open_gateway yields once every worker is listed healthy; one that never is gets named."""
    engines = await start_engines(1)
    with trio.fail_after(120):
        async with (
            open_gateway(CONFIG, engines.urls, log_dir=tmp_path) as launched,
            httpx.AsyncClient(base_url=launched.gateway_url) as gateway,
        ):
            listing = (await gateway.get("/workers")).json()["workers"]
        assert [(w["url"], w["is_healthy"]) for w in listing] == [(engines.urls[0], True)]
        nobody = f"http://127.0.0.1:{free_port()}"
        started = trio.current_time()
        async with open_gateway(attrs.evolve(CONFIG, startup_timeout_s=3.0),
                                [engines.urls[0], nobody], log_dir=tmp_path):
            waited = trio.current_time() - started
    assert waited >= 3.0
    assert f"lists 1 of its 2 workers as healthy after 3 s (missing: {nobody})" in caplog.text


async def test_open_gateway_fails_when_the_gateway_dies_during_registration(
        start_engines, tmp_path: Path) -> None:
    """A gateway killed while open_gateway waits for a worker that never comes is an error then,
    not a warning after the startup timeout and a dead URL."""
    engines = await start_engines(1)
    nobody = f"http://127.0.0.1:{free_port()}"

    async def kill_gateway() -> None:
        # The gateway launched for ``nobody``, once open_gateway reads its listing (it answered
        # /health, and now waits for ``nobody`` forever): its own metrics count that read.
        # Killed sooner, it died during startup.
        async with httpx.AsyncClient() as http:
            while True:
                # The gateway renames itself; its reaper shim keeps the command line.
                found = await trio.run_process(["pgrep", "-af", f"smg launch.*{nobody}"],
                                               capture_stdout=True, check=False)
                words = found.stdout.decode().split()
                if "--prometheus-port" in words:
                    port = words[words.index("--prometheus-port") + 1]
                    try:
                        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
                    except httpx.TransportError:
                        text = ""
                    if any(s.name == "smg_http_requests_total" and s.labels.get("path") == "/workers"
                           and s.value > 0 for s in parse_prometheus_text(text)):
                        os.killpg(os.getpgid(int(words[0])), signal.SIGKILL)
                        return
                await trio.sleep(0.1)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(kill_gateway)
            with pytest.RaisesGroup(pytest.RaisesExc(
                    BackendError, match="exited .* while registering its workers")):
                async with open_gateway(attrs.evolve(CONFIG, startup_timeout_s=120.0),
                                        [engines.urls[0], nobody], log_dir=tmp_path):
                    pass


async def test_the_listing_is_followed(start_engines, tmp_path: Path) -> None:
    """A worker added to the gateway by someone else joins; one deleted from it leaves."""
    engines = await start_engines(2)
    with trio.fail_after(120):
        async with (
            open_gateway(CONFIG, engines.urls[:1], log_dir=tmp_path) as launched,
            open_engine_fleet(CONFIG, gateway_url=launched.gateway_url) as fleet,
            httpx.AsyncClient(base_url=launched.gateway_url) as gateway,
        ):
            assert fleet.urls == (engines.urls[0],)
            (await gateway.post("/workers", json={"url": engines.urls[1]})).raise_for_status()
            await wait_until(lambda: len(fleet.urls) == 2, timeout_s=60, what="the added worker to join")
            listing = (await gateway.get("/workers")).json()["workers"]
            [first] = [w["id"] for w in listing if w["url"] == engines.urls[0]]
            (await gateway.delete(f"/workers/{first}")).raise_for_status()
            await wait_until(lambda: engines.urls[0] not in fleet.urls, timeout_s=60,
                             what="the deleted worker to leave")
            stats = fleet.statistics()
    assert stats.workers == (engines.urls[1],)
    assert stats.removed[engines.urls[0]] == "the gateway no longer lists it"


async def test_a_lost_worker_behind_the_gateway(start_engines, tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    engines = await start_engines(2)
    caplog.set_level(logging.WARNING, logger="relaxtrio.fleet.fleet")
    lost = {}
    with trio.fail_after(180):
        async with (
            open_gateway(CONFIG, engines.urls, log_dir=tmp_path) as launched,
            open_engine_fleet(CONFIG, gateway_url=launched.gateway_url) as fleet,
        ):
            launched.attach(fleet)
            keys = await keys_per_worker(fleet, engines.labels)
            key = keys["w0"]
            await fleet.gateway_metrics()

            async def run() -> None:
                lost["result"] = await fleet.generate(PROMPT, long_sampling(), rid=f"{key}:t1#",
                                                      routing_key=key)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                await wait_running(engines.urls[0], 1)
                engines.stop(0)
            resumed = await fleet.generate(PROMPT, SHORT, rid=f"{key}:t1:a1#", routing_key=key)
            async def removed() -> bool:  # the health loop removes it if no call did
                await fleet.refresh()
                return engines.urls[0] not in fleet.urls

            await wait_until(removed, timeout_s=60, what="the fleet to drop the stopped worker")
            stats = fleet.statistics()
            step = await fleet.gateway_metrics()
    # The gateway does not retry (--disable-retries): the fleet saw the loss and ended the
    # generation as lost, an abort with no output that the caller resumes on the other worker.
    result = lost["result"]
    assert result.finish_type == "abort" and not result.output_ids, result
    assert resumed.weight_version == "w1"
    # The failure is in the gateway's error count, and in w0's own failures unless its series
    # already left with it (deleted from the gateway); none on w1.
    w1 = engines.urls[1].removeprefix("http://")
    assert step["gateway/errors"] >= 1
    assert step[f"gateway/requests/{w1}"] >= 1 and step[f"gateway/failures/{w1}"] == 0
    assert stats.workers == (engines.urls[1],)
    assert any(f"worker {engines.urls[0]} removed" in r.getMessage() for r in caplog.records)


async def test_a_gateway_restart_is_survived(start_engines, tmp_path: Path) -> None:
    engines = await start_engines(2)
    with trio.fail_after(180):
        async with (
            open_gateway(CONFIG, engines.urls, log_dir=tmp_path) as launched,
            open_engine_fleet(CONFIG, gateway_url=launched.gateway_url) as fleet,
        ):
            keys = await keys_per_worker(fleet, engines.labels)
            [pgid] = launched.pids()
            os.killpg(pgid, signal.SIGKILL)
            results = []
            for turn in range(3):
                for key in keys.values():
                    results.append(await fleet.generate(PROMPT, SHORT, rid=f"{key}:r{turn}#",
                                                        routing_key=key))
            [new_pgid] = launched.pids()
            stats = fleet.statistics()
    assert new_pgid != pgid
    assert sorted(stats.workers) == sorted(engines.urls)
    assert all(r.finish_type == "length" for r in results[-2:])
    assert (tmp_path / "gateway.log").exists()


async def test_a_worker_readmitted_at_once_gets_new_keys(start_engines, tmp_path: Path) -> None:
    """A worker removed and readmitted under the same URL before the gateway finished deleting
    it (smg deletes in the background; a fast restart, e.g. under Ray) is registered after the
    deletion, so it stays listed and takes fresh keys again."""
    engines = await start_engines(2)
    with trio.fail_after(180):
        async with (
            open_gateway(CONFIG, engines.urls, log_dir=tmp_path) as launched,
            open_engine_fleet(CONFIG, gateway_url=launched.gateway_url) as fleet,
        ):
            await keys_per_worker(fleet, engines.labels, prefix="a")
            url = engines.urls[0]
            fleet.remove(url, "restarting (test)", restarting=True)
            await fleet.readmit(url)
            await wait_until(lambda: url not in fleet.members.joining, timeout_s=60,
                             what="the gateway to list the readmitted worker healthy")
            await trio.sleep(3 * GATEWAY_POLL_S)  # a deletion still queued would land by now
            seen = await keys_per_worker(fleet, engines.labels, prefix="b")
            stats = fleet.statistics()
    assert sorted(seen) == sorted(engines.labels)
    assert sorted(stats.workers) == sorted(engines.urls)


async def test_a_worker_readmitted_while_its_old_entry_drains_keeps_its_keys(
        start_engines, tmp_path: Path) -> None:
    """smg removes a deleted entry after its drain, by URL, and a repeated ``DELETE`` of the
    entry removes it at once: a worker that restarts within the drain (under Ray, 4 s) must not
    register while that first removal is still to come, or it is removed again unseen."""
    engines = await start_engines(2)
    with trio.fail_after(180):
        async with (
            open_gateway(CONFIG, engines.urls, log_dir=tmp_path) as launched,
            open_engine_fleet(CONFIG, gateway_url=launched.gateway_url) as fleet,
        ):
            await keys_per_worker(fleet, engines.labels, prefix="a")
            url = engines.urls[0]
            removed_at = time.monotonic()
            fleet.remove(url, "restarting (test)", restarting=True)
            for _ in range(4):  # the fleet reads the listing while the worker restarts
                await fleet.refresh()
                await trio.sleep(GATEWAY_POLL_S)
            await fleet.readmit(url)
            await wait_until(lambda: url not in fleet.members.joining, timeout_s=60,
                             what="the gateway to list the readmitted worker healthy")
            # Past the drain of the first DELETE: a removal still to come has landed by now.
            await trio.sleep(max(0.0, removed_at + SMG_DRAIN_S + 2.0 - time.monotonic()))
            seen = await keys_per_worker(fleet, engines.labels, prefix="b")
            async with httpx.AsyncClient() as client:
                listing = (await client.get(launched.gateway_url + "/workers")).json()["workers"]
    assert sorted(seen) == sorted(engines.labels)
    assert sorted(w["url"] for w in listing) == sorted(engines.urls)
