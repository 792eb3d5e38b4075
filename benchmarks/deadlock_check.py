"""Deadlock check: the external-capacity table against a simulated slot-limited executor.

The table is docs/scheduling.md#external-agent-capacity.

Agents run through a simulated external executor with a hard slot limit: each agent process
first asks the executor (a FIFO slot server on 127.0.0.1) for a slot and holds it until it exits.
For every row of the table the check runs the real pipeline (real API server, real agent
processes, the embedded engine on a tiny random model) twice:

* ``slots = required``: the capacity check passes and the run completes;
* ``slots = required - 1``: the capacity check refuses to start; with the check bypassed the run
  deadlocks at the first-request barrier and the barrier watchdog reports it (the run is then
  cancelled: every agent is terminated).

Prints one JSON line per case and then the table; exits non-zero when a case disagrees with the
table. Usage: ``python benchmarks/deadlock_check.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import trio

from relaxtrio import ConfigError
from relaxtrio.api.app import create_app, serve_api
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.config import AgentConfig, FleetConfig, GenerationConfig, RolloutConfig
from relaxtrio.engine.server import EngineConfig, serve_engine
from relaxtrio.models import load_tokenizer
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.rollout.capacity import check_external_slots, plan_capacity
from relaxtrio.rollout.dataset import Prompt, PromptStream
from relaxtrio.rollout.eval import EvalDataset, run_eval
from relaxtrio.rollout.pipeline import open_rollout_pipeline
from relaxtrio.rollout.turns import EngineTurnHandler
from relaxtrio.fleet.fleet import open_engine_fleet
from relaxtrio.testing.tiny_models import build_tiny_model

SLOT_AGENT = r'''
import json, os, socket, sys
import httpx

sock = socket.create_connection(("127.0.0.1", int(os.environ["EXECUTOR_PORT"])))
assert sock.makefile().readline().strip() == "granted"  # blocks until the executor has a slot
task = json.load(open(os.environ["RELAX_INPUT_JSON"]))
url = os.environ["RELAX_BASE_URL"].rstrip("/") + "/v1/chat/completions"
r = httpx.post(url, json={"model": "m", "messages": task["messages"], "max_tokens": 4},
               headers={"Authorization": "Bearer " + os.environ["RELAX_SESSION_ID"]}, timeout=600)
r.raise_for_status()
json.dump({"reward": 1.0}, open(os.environ["RELAX_OUTPUT_JSON"], "w"))
'''

# (row label, concurrency, n, eval group size or None, resident flag)
# One resident train Group per row: then one missing slot is a certain deadlock (with several
# Groups, another Group's completion may free the slot and turn the deadlock into a stall).
ROWS = [
    ("eval disabled", 1, 2, None, False),
    ("eval on, train not resident", 1, 2, 3, False),
    ("eval on, train resident (prelaunch)", 1, 2, 3, True),
]
WATCHDOG_S = 5.0  # agent start-up (python + httpx import) takes ~1 s here
DEADLOCK_LIMIT_S = 60.0


class SlotExecutor:
    """A FIFO slot server: a connection holds one slot from ``granted`` until it closes."""

    def __init__(self, slots: int) -> None:
        self.slots = trio.Semaphore(slots)
        self.peak = 0
        self.in_use = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        async with self.slots:
            self.in_use += 1
            self.peak = max(self.peak, self.in_use)
            try:
                await stream.send_all(b"granted\n")
                while await stream.receive_some(1024):
                    pass
            except trio.BrokenResourceError:
                pass
            finally:
                self.in_use -= 1


def _prompts(n: int) -> list[Prompt]:
    return [Prompt(index=i, messages=({"role": "user", "content": f"question {i}"},), metadata={})
            for i in range(n)]


async def run_case(model_dir: Path, work: Path, row: tuple, slots: int) -> dict:
    label, concurrency, n, eval_g, resident = row
    evals = [("eval", eval_g)] if eval_g else []
    plan = plan_capacity(agentic_concurrency=concurrency, n_samples_per_prompt=n,
                         eval_group_sizes=evals, prelaunch=resident)
    case = {"bench": "deadlock_check", "row": label, "T": plan.train_slots, "E_peak": plan.eval_peak,
            "required": plan.required, "slots": slots}
    try:
        check_external_slots(plan, slots)
        case["capacity_check"] = "ok"
    except ConfigError as exc:
        case["capacity_check"] = "refused"
        case["refusal"] = str(exc).split(". With")[0]
    (work / "agent.py").write_text(SLOT_AGENT)
    executor = SlotExecutor(slots)
    tokenizer = load_tokenizer(model_dir)
    config = RolloutConfig(n_samples_per_prompt=n, rollout_batch_size=concurrency,
                           agentic_concurrency=concurrency, prelaunch=resident,
                           barrier_warn_s=WATCHDOG_S, show_progress=False)
    started = time.monotonic()
    outcome = "deadlock not reported in time"
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, executor.handle, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        engine_url = await nursery.start(serve_engine, EngineConfig(model_path=model_dir))
        async with open_engine_fleet(FleetConfig(), worker_urls=[engine_url]) as client:
            registry = SessionRegistry()
            handler = EngineTurnHandler(client=client, compiler=ChatCompiler(tokenizer),
                                        config=GenerationConfig(max_response_tokens=4))
            base_url = await nursery.start(serve_api, create_app(registry, handler))
            agent = AgentConfig(command=f"{sys.executable} agent.py", cwd=work,
                                env={"EXECUTOR_PORT": str(port)}, timeout_s=120, term_grace_s=1)
            async with open_rollout_pipeline(
                config=config, agent=agent, registry=registry, handler=handler, base_url=base_url,
                prompts=PromptStream(prompts=_prompts(8), shuffle=False),
            ) as pipeline:
                async def run() -> None:
                    await pipeline.run_step(0, last=not eval_g)
                    if eval_g:
                        await run_eval(pipeline, [EvalDataset(name="eval", prompts=tuple(_prompts(2)),
                                                              n_samples_per_prompt=eval_g)])
                        await pipeline.run_step(1, last=True)

                with trio.move_on_after(DEADLOCK_LIMIT_S):
                    async with trio.open_nursery() as inner:
                        async def stop_on_watchdog() -> None:
                            await pipeline.watchdog.wait_warnings(1)
                            inner.cancel_scope.cancel()

                        inner.start_soon(stop_on_watchdog)
                        await run()
                        outcome = "completed"
                        inner.cancel_scope.cancel()
                if pipeline.barrier_warnings:
                    outcome = "deadlock reported by barrier watchdog"
        nursery.cancel_scope.cancel()
    case.update(outcome=outcome, seconds=round(time.monotonic() - started, 2),
                executor_peak_slots=executor.peak)
    return case


async def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="relaxtrio-deadlock-") as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model")
        cases = []
        for row in ROWS:
            label, concurrency, n, eval_g, resident = row
            evals = [("eval", eval_g)] if eval_g else []
            required = plan_capacity(agentic_concurrency=concurrency, n_samples_per_prompt=n,
                                     eval_group_sizes=evals, prelaunch=resident).required
            for slots in (required, required - 1):
                work = Path(tempfile.mkdtemp(dir=tmp))
                case = await run_case(model_dir, work, row, slots)
                print(json.dumps(case), flush=True)
                cases.append(case)
    header = f"{'row':38} {'T':>3} {'E_peak':>6} {'required':>8} {'slots':>5}  {'check':9} outcome"
    print("\n" + header + "\n" + "-" * len(header))
    for c in cases:
        print(f"{c['row']:38} {c['T']:>3} {c['E_peak']:>6} {c['required']:>8} {c['slots']:>5}  "
              f"{c['capacity_check']:9} {c['outcome']} ({c['seconds']} s)")
    ok = all((c["slots"] == c["required"]) == (c["outcome"] == "completed") for c in cases)
    ok &= all((c["slots"] < c["required"]) == (c["capacity_check"] == "refused") for c in cases)
    print("\nall rows behave as the table says" if ok else "\nMISMATCH with the table")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    trio.run(main)
