"""Prefix cache of the embedded engine on the example task: prefill tokens saved.

Starts one embedded engine (``python -m relaxtrio.engine`` on the default model, SmolLM2-135M),
runs ``python -m relaxtrio rollout`` on the default example against it (``--engine-url``: every
Session's turns reach this engine), then reads the engine's scheduler counters from
``/get_server_info`` (``internal_states[0]``):

- ``num_prefill_tokens``: prompt ids the engine had to prefill over the run (computed + served);
- ``num_prefix_hit_tokens``: those served from the prefix cache instead of computed.

``saved_share = hit / prefill``: the fraction of prefill work the cache removed. A follow-up turn
of a Session carries its whole history, so without the cache every turn re-prefills it.

One JSON line. Usage: ``python benchmarks/prefix_cache.py [--num-rollout 1] [-- extra rollout
flags]`` (about 1-3 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

from relaxtrio.models import ensure_smollm2
from relaxtrio.fleet.embedded import open_embedded_engine


def _rollout(engine_url: str, out: Path, num_rollout: int, extra: list[str]) -> float:
    """Runs the default example's rollout against ``engine_url``; returns its wall seconds."""
    cmd = [sys.executable, "-m", "relaxtrio", "rollout", "--engine-url", engine_url,
           "--num-rollout", str(num_rollout), "--output-dir", str(out), "--log-level", "WARNING", *extra]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if proc.returncode != 0:
        raise SystemExit(f"rollout failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return time.monotonic() - start


async def main(num_rollout: int, extra: list[str]) -> None:
    model_dir = await trio.to_thread.run_sync(ensure_smollm2)
    with tempfile.TemporaryDirectory(prefix="prefix-cache-") as tmp:
        async with open_embedded_engine(model_dir, log_path=Path(tmp) / "engine.log") as url:
            wall_s = await trio.to_thread.run_sync(_rollout, url, Path(tmp) / "run", num_rollout, extra)
            async with httpx.AsyncClient(timeout=30) as client:
                info = (await client.get(url.rstrip("/") + "/get_server_info")).json()
    stats = info["internal_states"][0]
    prefill, hit = stats["num_prefill_tokens"], stats["num_prefix_hit_tokens"]
    print(json.dumps({
        "bench": "prefix_cache", "num_rollout": num_rollout, "rollout_wall_s": round(wall_s, 1),
        "prefill_tokens": prefill, "prefix_hit_tokens": hit, "computed_tokens": prefill - hit,
        "saved_share": round(hit / prefill, 3) if prefill else None,
        "generated_tokens": stats["num_generated_tokens"], "load_average": list(os.getloadavg()),
    }), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-rollout", type=int, default=1)
    parser.add_argument("extra", nargs="*", help="more rollout flags, after --")
    args = parser.parse_args()
    trio.run(main, args.num_rollout, args.extra)
