"""The real gateway (PyPI ``smg``, the Shepherd Model Gateway; a test dependency) in front of the
embedded engine, across gateway restarts and under concurrent ``/generate`` load.

Here the gateway talks HTTP/2 to its worker (``--upstream-http2``; sglang-router, its predecessor,
always did). Before :mod:`relaxtrio._serving`, a gateway killed with
requests in flight made hypercorn's h2 send path raise ``trio.BusyResourceError`` out of
``hypercorn.trio.serve`` within two restarts, and the engine died. Here the engine serves in the
test's own trio loop (the ``engine_url`` fixture), so its death would fail the test directly.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio
from tests.support.waits import wait_until

# Requests cut by the gateway's SIGKILL leave httpx's request-body generator unfinished.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings(r"ignore:Async generator 'httpx\.:ResourceWarning")]

GATEWAY_READY_S = 30.0
NUM_CONCURRENT = 12


def _generate_body(max_new_tokens: int) -> str:
    return json.dumps({"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": max_new_tokens,
                                                                      "temperature": 1.0}})


GENERATE = _generate_body(4)
JSON = {"content-type": "application/json"}  # the gateway refuses a body without it (4xx)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@asynccontextmanager
async def open_gateway(worker_url: str, log_path: Path) -> AsyncIterator[tuple[str, trio.Process]]:
    """Starts ``python -m smg launch`` for one worker over HTTP/2 and yields its URL and
    process once a ``/generate`` succeeds through it; SIGKILLs its whole process group on exit
    (no leftovers, also when the body already killed it)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "smg", "launch", "--worker-urls", worker_url, "--upstream-http2",
           "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
           "--prometheus-port", str(_free_port()), "--log-level", "warn"]
    with log_path.open("ab") as log:
        process = await trio.lowlevel.open_process(cmd, stdout=log, stderr=log, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(timeout=5.0) as http:
            async def serving() -> bool:
                assert process.poll() is None, log_path.read_text()[-2000:]
                try:
                    reply = await http.post(url + "/generate", content=GENERATE, headers=JSON)
                except httpx.TransportError:
                    return False
                return reply.status_code == 200

            await wait_until(serving, timeout_s=GATEWAY_READY_S, what="the gateway to serve", interval_s=0.2)
        yield url, process
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        with trio.CancelScope(shield=True):
            await process.wait()


async def _generate(http: httpx.AsyncClient, url: str, statuses: list[int | str], body: str = GENERATE,
                    answered: trio.Event | None = None) -> None:
    try:
        statuses.append((await http.post(url + "/generate", content=body, headers=JSON)).status_code)
    except httpx.TransportError as exc:
        statuses.append(repr(exc))  # the gateway was killed under this request
    if answered is not None:
        answered.set()


async def test_engine_survives_gateway_restarts_under_load(engine_url: str, tmp_path: Path) -> None:
    log_path = tmp_path / "gateway.log"
    with trio.fail_after(120):  # about 10 s on an idle 2-core machine; the bound is for hangs
        async with httpx.AsyncClient(timeout=30.0) as http:
            for lifetime in range(3):  # two restarts
                async with open_gateway(engine_url, log_path) as (gateway_url, gateway):
                    served: list[int | str] = []
                    async with trio.open_nursery() as nursery:
                        for _ in range(NUM_CONCURRENT):
                            nursery.start_soon(_generate, http, gateway_url, served)
                    assert served == [200] * NUM_CONCURRENT, (lifetime, served)
                    # a second wave of staggered lengths, and the gateway SIGKILLed as soon as the
                    # first answer is back: the engine is then sending on that HTTP/2 connection
                    cut: list[int | str] = []
                    answered = trio.Event()
                    async with trio.open_nursery() as nursery:
                        for i in range(NUM_CONCURRENT):
                            nursery.start_soon(_generate, http, gateway_url, cut, _generate_body(1 + 4 * i), answered)
                        await answered.wait()
                        os.killpg(gateway.pid, signal.SIGKILL)
                    assert len(cut) == NUM_CONCURRENT
                assert (await http.get(engine_url + "/health")).status_code == 200
            reply = await http.post(engine_url + "/generate", content=GENERATE, headers=JSON)
            assert reply.status_code == 200
            assert len(reply.json()["output_ids"]) >= 1
