"""Throughput of the embedded engine on SmolLM2-135M: 1 stream, 4 streams, and transformers.

Starts ``python -m relaxtrio.engine`` on the real model (``ensure_smollm2()``), warms up, then
measures greedy decoding of a fixed number of new tokens (``ignore_eos``) after a ~100-token chat
prompt, first one request alone, then four at once, through the relaxtrio engine client. In the
same run (engine idle meanwhile), ``transformers`` ``model.generate`` decodes the same four
prompts as one left-padded batch of 4 (greedy, ``min_new_tokens = max_new_tokens``), in this
process with the same torch thread count. Prints one JSON line:

    {"bench": "engine_throughput", "tok_s_1": ..., "tok_s_4": ..., "ratio": ..., "target_ratio": 1.5,
     "hf_tok_s_4": ..., "ratio_4_vs_hf": ..., "target_ratio_vs_hf": 1.0, ...}

``tok_s_N`` = generated tokens of the phase / wall seconds of the phase (prefill included), best
of ``--repeats``. Usage: ``python benchmarks/engine_throughput.py [--new-tokens 48] [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

import trio

from relaxtrio.models import ensure_smollm2, load_tokenizer
from relaxtrio.sglang.client import SamplingParams, open_engine_client

TARGET_RATIO: Final = 1.5
TARGET_RATIO_VS_HF: Final = 1.0
_URL_PREFIX: Final = "RELAXTRIO_ENGINE_URL="
_TOPICS: Final = ("rivers", "mountains", "deserts", "forests", "oceans")


def _prompt(tokenizer, topic: str) -> list[int]:
    """A chat prompt of about 100 tokens (SmolLM2 tokenizer)."""
    text = f"Write a short, friendly paragraph about {topic}. "
    text += "Mention where they are found, why they matter to people, and one surprising fact. " * 4
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
        return_dict=False,
    )
    return list(ids)


async def _read_url(process: trio.Process) -> str:
    assert process.stdout is not None
    buffer = b""
    while b"\n" not in buffer:
        chunk = await process.stdout.receive_some()
        if not chunk:
            raise RuntimeError("engine exited before printing its URL")
        buffer += chunk
    line = buffer.decode().splitlines()[0]
    if not line.startswith(_URL_PREFIX):
        raise RuntimeError(f"unexpected first line from the engine: {line!r}")
    return line[len(_URL_PREFIX):]


async def _phase(client, prompts: list[list[int]], new_tokens: int, tag: str) -> float:
    """Run len(prompts) requests at once; return generated tokens per second."""
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    counts: list[int] = []

    async def one(i: int) -> None:
        result = await client.generate(prompts[i], sampling, rid=f"{tag}-{i}", return_logprob=True)
        counts.append(len(result.output_ids))

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(len(prompts)):
            nursery.start_soon(one, i)
    elapsed = time.perf_counter() - start
    assert counts == [new_tokens] * len(prompts), counts
    return sum(counts) / elapsed


def _hf_generate_tok_s(model_dir: Path, prompts: list[list[int]], new_tokens: int, repeats: int,
                       pad_id: int) -> float:
    """Best tokens/s of ``model.generate`` on ``prompts`` as one left-padded greedy batch."""
    import torch

    from relaxtrio.models import load_model

    model = load_model(model_dir)
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])  # (4, P)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # (4, P)
    kwargs = dict(attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                  min_new_tokens=new_tokens, pad_token_id=pad_id)
    best = 0.0
    with torch.inference_mode():
        model.generate(ids, **{**kwargs, "max_new_tokens": 8, "min_new_tokens": 8})  # warm up
        for _ in range(repeats):
            start = time.perf_counter()
            out = model.generate(ids, **kwargs)  # (4, P + new_tokens)
            elapsed = time.perf_counter() - start
            assert out.shape[1] == width + new_tokens, out.shape
            best = max(best, len(prompts) * new_tokens / elapsed)
    return best


async def run(model_dir: Path, new_tokens: int, repeats: int) -> dict:
    tokenizer = load_tokenizer(model_dir)
    prompts = [_prompt(tokenizer, topic) for topic in _TOPICS]
    cmd = [sys.executable, "-m", "relaxtrio.engine", "--model", str(model_dir), "--port", "0",
           "--max-running-requests", "8"]
    process = await trio.lowlevel.open_process(cmd, stdout=subprocess.PIPE)
    try:
        with trio.fail_after(300):
            url = await _read_url(process)
        async with open_engine_client(url) as client:
            await _phase(client, prompts[:2], 8, "warmup")  # first-call costs, batched path
            best_1 = max([await _phase(client, prompts[:1], new_tokens, f"one{r}")
                          for r in range(repeats)])
            best_4 = max([await _phase(client, prompts[1:5], new_tokens, f"four{r}")
                          for r in range(repeats)])
            info = await client.server_info()
    finally:
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(30):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    hf_4 = await trio.to_thread.run_sync(_hf_generate_tok_s, model_dir, prompts[1:5], new_tokens,
                                         repeats, pad_id)
    return {
        "bench": "engine_throughput",
        "tok_s_1": round(best_1, 2),
        "tok_s_4": round(best_4, 2),
        "ratio": round(best_4 / best_1, 3),
        "target_ratio": TARGET_RATIO,
        "hf_tok_s_4": round(hf_4, 2),
        "ratio_4_vs_hf": round(best_4 / hf_4, 3),
        "target_ratio_vs_hf": TARGET_RATIO_VS_HF,
        "new_tokens": new_tokens,
        "prompt_tokens": len(prompts[0]),
        "repeats": repeats,
        "max_batch_size_seen": info["internal_states"][0]["max_batch_size_seen"],
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2, help="best of N runs per phase")
    args = parser.parse_args(argv)
    model_dir = ensure_smollm2()
    result = trio.run(run, model_dir, args.new_tokens, args.repeats)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
