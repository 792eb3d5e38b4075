"""Decode throughput of the embedded engine and of vLLM on SmolLM2-135M, side by side.

Starts one engine at a time on the real model (``ensure_smollm2()``, fp32, the same thread count
for both), warms it up, then for 1, 4 and 16 streams sends that many greedy requests at once
(64 new tokens each, ``ignore_eos``) on the same token prompts (~100-token chat prompts, one
topic per stream), once per cell. The embedded engine is ``python -m relaxtrio.engine`` driven by
the SGLang client; vLLM is ``python -m vllm.entrypoints.openai.api_server`` from its own venv
(``$RELAXTRIO_VLLM_PYTHON`` or ``.engines/vllm``, built by ``scripts/setup_vllm.sh``) with the flags
training uses, driven by :class:`relaxtrio.vllm.client.VllmEngineClient`. Prints one JSON line:

    {"bench": "engines", "cells": [{"streams": 1, "embedded_tok_s": ..., "vllm_tok_s": ...,
     "ratio": ...}, ...], "vllm_start_s": ..., ...}

``tok_s`` = generated tokens / wall seconds of the cell (prefill included); ``ratio`` = vLLM /
embedded. One run per cell: on a shared machine, read the load average next to it. On cores
that other processes also keep busy, ``--threads 1`` measures the engines rather than OpenMP's
spin-waiting (with 2 threads at load 9-13 on 2 cores the embedded engine fell to 0.6-4.6 tok/s).
Usage: ``python benchmarks/engines.py [--threads 2] [--new-tokens 64] [--streams 1 4 16]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import httpx
import trio
from _bench import Child, emit, load_average

from relaxtrio.models import ensure_smollm2, load_tokenizer
from relaxtrio.sglang.client import SamplingParams, open_engine_client
from relaxtrio.vllm.connections import open_vllm_client

REPO: Final = Path(__file__).resolve().parents[1]
_TOPICS: Final = ("rivers", "mountains", "deserts", "forests", "oceans", "glaciers", "volcanoes",
                  "islands", "caves", "lakes", "canyons", "prairies", "swamps", "reefs", "dunes",
                  "fjords")
VLLM_START_TIMEOUT_S: Final = 900.0


def _prompt(tokenizer: Any, topic: str) -> list[int]:
    """A chat prompt of about 100 tokens (SmolLM2 tokenizer)."""
    text = f"Write a short, friendly paragraph about {topic}. "
    text += "Mention where they are found, why they matter to people, and one surprising fact. " * 4
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                              add_generation_prompt=True, tokenize=True,
                                              return_dict=False))


async def _cell(client: Any, prompts: Sequence[list[int]], new_tokens: int, tag: str) -> float:
    """Send ``len(prompts)`` greedy requests at once; return generated tokens per second."""
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    counts: list[int] = []

    async def one(i: int) -> None:
        result = await client.generate(prompts[i], sampling, rid=f"{tag}-{i}")
        counts.append(len(result.output_ids))

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(len(prompts)):
            nursery.start_soon(one, i)
    elapsed = time.perf_counter() - start
    assert counts == [new_tokens] * len(prompts), counts
    return sum(counts) / elapsed


async def _measure(client: Any, prompts: Sequence[list[int]], streams: Sequence[int],
                   new_tokens: int, name: str) -> dict[int, float]:
    await _cell(client, prompts[:2], 8, f"{name}-warmup")
    return {n: await _cell(client, prompts[:n], new_tokens, f"{name}-{n}") for n in streams}


async def _embedded(model_dir: Path, prompts: Sequence[list[int]], streams: Sequence[int],
                    new_tokens: int, threads: int) -> dict[int, float]:
    cmd = [sys.executable, "-m", "relaxtrio.engine", "--model", str(model_dir), "--port", "0",
           "--max-running-requests", str(max(streams)), "--num-threads", str(threads)]
    child = await Child.start(cmd, timeout_s=300)
    try:
        async with open_engine_client([child.value]) as client:
            return await _measure(client, prompts, streams, new_tokens, "embedded")
    finally:
        await child.stop()


def _vllm_python() -> str:
    python = os.environ.get("RELAXTRIO_VLLM_PYTHON") or str(REPO / ".engines" / "vllm" / "bin" / "python")
    if not os.access(python, os.X_OK):
        raise SystemExit(f"no vLLM interpreter at {python}: run scripts/setup_vllm.sh or set "
                         "RELAXTRIO_VLLM_PYTHON")
    return python


async def _wait_healthy(process: trio.Process, url: str) -> None:
    async with httpx.AsyncClient(timeout=5) as http:
        with trio.fail_after(VLLM_START_TIMEOUT_S):
            while process.returncode is None:
                try:
                    if (await http.get(url + "/health")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await trio.sleep(1.0)  # a server start has no event to wait on
    raise RuntimeError(f"vLLM exited with {process.returncode} while starting")


async def _vllm(model_dir: Path, prompts: Sequence[list[int]], streams: Sequence[int],
                new_tokens: int, threads: int, port: int) -> tuple[dict[int, float], float]:
    url = f"http://127.0.0.1:{port}"
    cmd = [_vllm_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--dtype", "float32", "--enable-prefix-caching", "--enable-scale-out",
           "--logprobs-mode", "processed_logprobs", "--max-model-len", "2048",
           "--max-num-seqs", str(max(streams)), "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    process = await trio.lowlevel.open_process(cmd, env=env, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        await _wait_healthy(process, url)
        start_s = time.perf_counter() - start
        async with open_vllm_client(url) as client:
            return await _measure(client, prompts, streams, new_tokens, "vllm"), start_s
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # the API server, its engine core and worker
        with trio.move_on_after(30):
            await process.wait()
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    model_dir = ensure_smollm2()
    tokenizer = load_tokenizer(model_dir)
    streams = sorted(args.streams)
    prompts = [_prompt(tokenizer, _TOPICS[i % len(_TOPICS)]) for i in range(max(streams))]
    embedded = await _embedded(model_dir, prompts, streams, args.new_tokens, args.threads)
    vllm, vllm_start_s = await _vllm(model_dir, prompts, streams, args.new_tokens, args.threads,
                                     args.vllm_port)
    return {
        "bench": "engines",
        "cells": [{"streams": n, "embedded_tok_s": round(embedded[n], 1),
                   "vllm_tok_s": round(vllm[n], 1), "ratio": round(vllm[n] / embedded[n], 2)}
                  for n in streams],
        "new_tokens": args.new_tokens,
        "prompt_tokens": len(prompts[0]),
        "threads": args.threads,
        "vllm_start_s": round(vllm_start_s, 1),
        "cpu_count": os.cpu_count(),
        "load_average": load_average(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="compute threads of each engine")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--vllm-port", type=int, default=18741)
    args = parser.parse_args(argv)
    result = trio.run(run, args)
    for cell in result["cells"]:
        print(f"# {cell['streams']:>2} streams: embedded {cell['embedded_tok_s']:7.1f} tok/s, "
              f"vLLM {cell['vllm_tok_s']:7.1f} tok/s, ratio {cell['ratio']:.2f}", file=sys.stderr)
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
