"""``python -m relaxtrio.engine``: run the embedded CPU engine (SGLang native API subset).

When the server listens it prints exactly one line ``RELAXTRIO_ENGINE_URL=http://<host>:<port>``
to stdout (flushed), so a parent process can start it with ``--port 0`` and read the URL.
SIGTERM / SIGINT abort in-flight requests (their callers get partial output), close the listener
and exit with status 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

import trio

from ..cpu_threads import MAX_THREADS
from .server import DEFAULT_PREFIX_CACHE_TOKENS, EngineConfig, serve_engine


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m relaxtrio.engine",
        description="relaxtrio's embedded CPU engine, speaking SGLang's native HTTP API.",
    )
    parser.add_argument("--model", "--model-path", dest="model", required=True,
                        help="Hugging Face model directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--max-running-requests", type=int, default=16,
                        help="requests decoded together in one batch")
    parser.add_argument("--context-length", type=int, default=None,
                        help="context window in tokens (default: the model's)")
    parser.add_argument("--weight-version", default="default")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--prefix-cache-tokens", type=int, default=DEFAULT_PREFIX_CACHE_TOKENS,
                        help="ids the prefix cache keeps across requests (0 disables it)")
    parser.add_argument("--num-threads", type=int, default=0,
                        help="torch compute threads (0: torch's default, one per core); the "
                             "training driver passes its share of the cores (relaxtrio.cpu_threads)")
    parser.add_argument("--log-level", default="warning")
    return parser


async def _serve(config: EngineConfig) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:

        async def wait_for_signal() -> None:
            async for _ in signals:
                return

        async with trio.open_nursery() as nursery:

            async def run(*, task_status: trio.TaskStatus[str]) -> None:
                await serve_engine(config, shutdown_trigger=wait_for_signal, task_status=task_status)

            url = await nursery.start(run)
            print(f"RELAXTRIO_ENGINE_URL={url}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, serve until SIGTERM / SIGINT, return the exit status."""
    args = _parser().parse_args(argv)
    if args.max_running_requests < 1:
        print("--max-running-requests must be at least 1", file=sys.stderr)
        return 2
    if not 0 <= args.num_threads <= MAX_THREADS:
        print(f"--num-threads must be between 0 and {MAX_THREADS}", file=sys.stderr)
        return 2
    if args.num_threads:
        import torch

        torch.set_num_threads(args.num_threads)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    config = EngineConfig(
        model_path=args.model,
        host=args.host,
        port=args.port,
        max_running_requests=args.max_running_requests,
        context_length=args.context_length,
        weight_version=args.weight_version,
        dtype=args.dtype,
        prefix_cache_tokens=args.prefix_cache_tokens,
    )
    trio.run(_serve, config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
