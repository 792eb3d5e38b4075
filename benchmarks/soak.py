"""Soak: many concurrent Sessions for minutes, with injected faults; nothing may go unaccounted.

The real pipeline runs step after step (real API server, real agent processes, the embedded
engine on a tiny random model in this process) until ``--minutes`` have passed. Each agent picks
its behaviour from its Session id (so a rerun repeats the mix):

* ``ok``: one plain request;
* ``retry``: the openai SDK with a short ``timeout`` and ``max_retries`` (retries attach to the
  first generation, docs/agent-contract.md#retries);
* ``malformed``: a body that is not JSON first (expects 400), then a plain request;
* ``disconnect``: a request that announces 50 body bytes, sends 1 and closes (an agent killed
  mid-upload), then a plain request;
* ``h2``: the request over HTTP/2 (prior knowledge, httpx with ``http2=True``);
* ``h2abort``: an HTTP/2 connection that opens a request stream, sends part of its body and
  drops the connection, then a plain request;
* ``sigkill``: starts a request and SIGKILLs itself while it is in flight (its Group is dropped).

Meanwhile the engine's requests are aborted every ``--abort-every-s`` seconds (the turns resume).

The API server runs under a supervisor that restarts it on the same port if it dies, and counts
that. Prints one JSON line: Sessions started (agent processes that ran: each appends its pid,
mode and Session id to a file), trained and dropped (each dropped Session with its Group's
reason); ``unaccounted``: started Sessions neither trained nor dropped; ``duplicated``: Sessions
counted more than once; ``dropped_before_agent_ran``: Sessions of dropped Groups whose agent was
stopped before its Python wrote its line (a sibling's SIGKILL drops the Group while the others
still start); then orphan processes, server restarts,
retries answered from an earlier generation, and RSS (this process: server, pipeline and engine)
at start (before the model loads), after the first step and at the end. Usage: ``python benchmarks/soak.py [--groups 4] [--minutes 3]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import trio

from relaxtrio.api.app import create_app, serve_api
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.config import AgentConfig, FleetConfig, GenerationConfig, RolloutConfig
from relaxtrio.engine.server import EngineConfig, serve_engine
from relaxtrio.models import load_tokenizer
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.rollout.dataset import Prompt, PromptStream
from relaxtrio.rollout.pipeline import open_rollout_pipeline
from relaxtrio.rollout.turns import EngineTurnHandler
from relaxtrio.fleet.fleet import open_engine_fleet
from relaxtrio.sglang.client import open_engine_client
from relaxtrio.testing.tiny_models import build_tiny_model

log = logging.getLogger("soak")

AGENT = r'''
import hashlib, json, os, signal, socket, sys, threading, time
import httpx

sid = os.environ["RELAX_SESSION_ID"]
roll = int(hashlib.sha256(sid.encode()).hexdigest(), 16) % 100
mode = ("ok" if roll < 35 else "retry" if roll < 55 else "malformed" if roll < 65
        else "disconnect" if roll < 75 else "h2" if roll < 84 else "h2abort" if roll < 93
        else "sigkill")
open(os.environ["SOAK_PID_FILE"], "a").write(f"{os.getpid()} {mode} {sid}\n")
task = json.load(open(os.environ["RELAX_INPUT_JSON"]))
base = os.environ["RELAX_BASE_URL"].rstrip("/")
url = base + "/v1/chat/completions"
headers = {"Authorization": "Bearer " + sid, "content-type": "application/json"}
body = {"model": "m", "messages": task["messages"], "max_tokens": 8}

def plain():
    r = httpx.post(url, json=body, headers=headers, timeout=600)
    if r.status_code != 200:
        sys.exit(f"HTTP {r.status_code} {r.text}")

if mode == "retry":
    import openai
    client = openai.OpenAI(base_url=base, api_key=sid, timeout=0.2, max_retries=8)
    client.chat.completions.create(model="m", messages=task["messages"], max_tokens=8)
elif mode == "malformed":
    r = httpx.post(url, content=b'{"messages": [', headers=headers, timeout=600)
    assert r.status_code == 400, r.status_code
    plain()
elif mode == "disconnect":
    host, port = base.split("//")[1].split("/")[0].split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(f"POST /agentic_api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {sid}"
              "\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n{".encode())
    s.shutdown(socket.SHUT_WR)
    time.sleep(0.05)
    s.close()
    plain()
elif mode == "h2":
    with httpx.Client(http1=False, http2=True, timeout=600) as h2client:
        r = h2client.post(url, json=body, headers=headers)
    assert r.http_version == "HTTP/2", r.http_version
    if r.status_code != 200:
        sys.exit(f"HTTP {r.status_code} {r.text}")
elif mode == "h2abort":
    import h2.config, h2.connection
    host, port = base.split("//")[1].split("/")[0].split(":")
    path = "/" + url.split("//")[1].split("/", 1)[1]
    s = socket.create_connection((host, int(port)))
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    stream = conn.get_next_available_stream_id()
    conn.send_headers(stream, [(":method", "POST"), (":path", path), (":scheme", "http"),
                               (":authority", host), ("authorization", "Bearer " + sid),
                               ("content-type", "application/json")])
    conn.send_data(stream, b'{"messages": [')
    s.sendall(conn.data_to_send())
    time.sleep(0.05)
    s.close()
    plain()
elif mode == "sigkill":
    threading.Thread(target=plain, daemon=True).start()
    time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
else:
    plain()
json.dump({"reward": 1.0}, open(os.environ["RELAX_OUTPUT_JSON"], "w"))
'''


def rss_bytes() -> int:
    """Resident set size of this process (VmRSS), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z"


async def supervise_api(app, port: int, restarts: list[str], task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serves the API on ``port``; when the server dies, logs why, counts it and restarts it."""
    first = True
    while True:
        try:
            if first:
                first = False
                await serve_api(app, port=port, task_status=task_status)
            else:
                await serve_api(app, port=port)
            return
        except Exception as exc:  # noqa: BLE001 - counting server deaths is the point
            restarts.append(repr(exc)[:200])
            log.error("API server died (%d so far): %r", len(restarts), exc)


async def abort_periodically(client, every_s: float, counter: list[int]) -> None:
    while True:
        await trio.sleep(every_s)
        await client.abort_all()
        counter[0] += 1


async def soak(args: argparse.Namespace) -> dict:
    rss_start = rss_bytes()
    tmp = Path(tempfile.mkdtemp(prefix="relaxtrio-soak-"))
    model_dir = build_tiny_model(tmp / "model")
    (tmp / "agent.py").write_text(AGENT)
    pid_file = tmp / "pids"
    pid_file.touch()
    tokenizer = load_tokenizer(model_dir)
    config = RolloutConfig(n_samples_per_prompt=args.samples, rollout_batch_size=args.groups,
                           show_progress=False)
    restarts: list[str] = []
    aborts = [0]
    trained_ids: collections.Counter[str] = collections.Counter()
    dropped_ids: collections.Counter[str] = collections.Counter()
    dropped: collections.Counter[str] = collections.Counter()
    steps = 0
    rss_first_step = 0
    attached = 0
    deadline = time.monotonic() + args.minutes * 60
    prompts = [Prompt(index=i, messages=({"role": "user", "content": f"question {i}"},), metadata={})
               for i in range(64)]
    async with trio.open_nursery() as nursery:
        engine_url = await nursery.start(serve_engine, EngineConfig(model_path=model_dir))
        async with (open_engine_fleet(FleetConfig(), worker_urls=[engine_url]) as fleet,
                    open_engine_client(engine_url) as client):
            registry = SessionRegistry()
            handler = EngineTurnHandler(client=fleet, compiler=ChatCompiler(tokenizer),
                                        config=GenerationConfig(max_response_tokens=8))
            base_url = await nursery.start(supervise_api, create_app(registry, handler), free_port(),
                                           restarts)
            nursery.start_soon(abort_periodically, client, args.abort_every_s, aborts)
            agent = AgentConfig(command=f"{sys.executable} agent.py", cwd=tmp,
                                env={"SOAK_PID_FILE": str(pid_file)}, timeout_s=120, term_grace_s=1)
            async with open_rollout_pipeline(
                config=config, agent=agent, registry=registry, handler=handler, base_url=base_url,
                prompts=PromptStream(prompts=prompts, shuffle=False),
            ) as pipeline:
                while time.monotonic() < deadline:
                    result = await pipeline.run_step(steps)
                    steps += 1
                    if steps == 1:
                        rss_first_step = rss_bytes()
                    for scored in result.groups:
                        trained_ids.update(session.session_id for session in scored.group.sessions)
                        attached += sum(s.retries.statistics().num_attached for s in scored.group.sessions)
                    for group in result.dropped:
                        reason = (group.dropped_reason or "no reason").split(":")[-1].strip()[:60]
                        dropped[reason] += len(group.sessions)
                        dropped_ids.update(session.session_id for session in group.sessions)
                        attached += sum(s.retries.statistics().num_attached for s in group.sessions)
        nursery.cancel_scope.cancel()
    await trio.sleep(0.5)  # let the kernel reap what the pipeline terminated
    lines = [line.split() for line in pid_file.read_text().splitlines() if line.strip()]
    pids = [int(line[0]) for line in lines]
    started = {line[2] for line in lines}
    accounted = trained_ids + dropped_ids
    return {
        "bench": "soak", "minutes": args.minutes, "groups": args.groups, "samples": args.samples,
        "steps": steps, "sessions_started": len(started), "trained": sum(trained_ids.values()),
        "dropped": sum(dropped.values()), "dropped_reasons": dict(dropped),
        "unaccounted": len(started - set(accounted)),
        "duplicated": sum(n - 1 for n in accounted.values()),
        "trained_without_agent": len(set(trained_ids) - started),
        "dropped_before_agent_ran": len(set(dropped_ids) - started),
        "orphan_processes": sum(alive(pid) for pid in pids),
        "server_restarts": len(restarts), "server_deaths": restarts[:3],
        "agent_modes": dict(collections.Counter(line[1] for line in lines)),
        "retries_attached": attached, "engine_abort_alls": aborts[0],
        "rss_start_bytes": rss_start, "rss_after_first_step_bytes": rss_first_step,
        "rss_end_bytes": rss_bytes(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=4, help="concurrent Groups per step")
    parser.add_argument("--samples", type=int, default=2, help="Sessions per Group")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--abort-every-s", type=float, default=7.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    line = trio.run(soak, args)
    print(json.dumps(line), flush=True)
    ok = all(line[key] == 0 for key in ("unaccounted", "duplicated", "trained_without_agent",
                                        "orphan_processes", "server_restarts"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
