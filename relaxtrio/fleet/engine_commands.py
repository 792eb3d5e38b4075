"""The command line and environment of one launched engine, per backend.

Inference engines pin their own torch and transformers, so SGLang and vLLM run on the
interpreter of an environment of their own (``--engine-python``; default
``<repo>/.engines/<backend>/bin/python``, which ``scripts/setup_vllm.sh`` builds for vLLM), never
on relaxtrio's. Only the embedded engine runs on relaxtrio's own interpreter.

- ``embedded``: ``python -m relaxtrio.engine --port 0`` (it prints the URL it got).
- ``sglang``: ``python -m sglang.launch_server --model-path DIR --tp-size G ...`` plus the
  ``--sglang-*`` flags.
- ``vllm``: ``python -m vllm.entrypoints.openai.api_server --model DIR`` with what training needs
  of it (token route, RL control routes, processed logprobs, prefix caching with per-request hit
  counts, fp32 on CPU) on a free port chosen here (vLLM cannot report a port 0 it bound).
"""

from __future__ import annotations

import os
import pwd
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from .._errors import ConfigError
from ..config import Backend, FleetConfig
from .starter import flag_value

__all__ = ["embedded_command", "engine_python", "free_port", "sglang_command", "vllm_command",
           "vllm_env"]

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
VLLM_KV_CACHE_GIB: Final = "1"  # vLLM's CPU default reserves far more than a small model needs


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (engines that cannot announce the port they bound)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def engine_python(config: FleetConfig, kind: Backend) -> str:
    """The interpreter launched engines of ``kind`` run on.

    Raises:
        ConfigError: an SGLang or vLLM engine and neither ``--engine-python`` nor
            ``<repo>/.engines/<kind>/bin/python`` exists.
    """
    if kind == "embedded":
        return sys.executable
    if config.engine_python is not None:
        if not config.engine_python.is_file():
            raise ConfigError(f"--engine-python {config.engine_python} is not a file",
                              param="--engine-python")
        return str(config.engine_python)
    default = REPO_ROOT / ".engines" / kind / "bin" / "python"
    if default.is_file():
        return str(default)
    setup = ("run scripts/setup_vllm.sh (it builds .engines/vllm)" if kind == "vllm"
             else f"install {kind} into an environment of its own")
    raise ConfigError(f"a launched {kind} engine runs in its own Python environment: {setup}, "
                      f"or pass --engine-python PATH (that environment's python)",
                      param="--engine-python")


def embedded_command(model_dir: Path, engine_args: Sequence[str]) -> list[str]:
    """The embedded engine's command line (port 0: it announces the one it bound)."""
    return [sys.executable, "-m", "relaxtrio.engine", "--model", str(model_dir),
            "--host", "127.0.0.1", "--port", "0", *engine_args]


def sglang_command(config: FleetConfig, model_dir: Path) -> list[str]:
    """An SGLang server's command line on a free port, with the ``--sglang-*`` flags.

    Raises:
        ConfigError: no SGLang environment (:func:`engine_python`).
    """
    return [engine_python(config, "sglang"), "-m", "sglang.launch_server",
            "--model-path", str(model_dir), "--host", "127.0.0.1", "--port", str(free_port()),
            "--tp-size", str(config.num_gpus_per_engine), *config.sglang_args]


def vllm_command(config: FleetConfig, model_dir: Path, engine_args: Sequence[str]) -> list[str]:
    """A vLLM server's command line on a free port.

    ``engine_args`` are the embedded engine's flags; their ``--max-running-requests`` becomes
    ``--max-num-seqs``.

    Raises:
        ConfigError: no vLLM environment (:func:`engine_python`).
    """
    cmd = [engine_python(config, "vllm"), "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(model_dir), "--dtype", "float32", "--enable-prefix-caching",
           "--enable-scale-out", "--logprobs-mode", "processed_logprobs",
           "--enable-prompt-tokens-details", "--disable-uvicorn-access-log",
           "--host", "127.0.0.1", "--port", str(free_port())]
    running = flag_value(list(engine_args), "--max-running-requests")
    if running is not None:
        cmd += ["--max-num-seqs", running]
    return cmd


def vllm_env(index: int, num_engines: int, engine_args: Sequence[str], *,
             local: bool = True) -> dict[str, str]:
    """Environment of vLLM engine ``index`` of ``num_engines`` on this machine's CPUs.

    The RL routes (``VLLM_SERVER_DEV_MODE``), a small KV cache, no model hub, the user's
    compile cache (a cold one costs minutes per start), and each engine its own cores: the
    engine flags' ``--num-threads`` (the run's split) or an equal share, bound to the cores this
    process may use from the ``index * threads``-th on. A variable set in the environment
    already is kept.
    """
    cores = sorted(os.sched_getaffinity(0))
    threads = int(flag_value(list(engine_args), "--num-threads") or 0) or max(1, len(cores) // num_engines)
    first = (index * threads) % len(cores)
    bound = cores[first:first + threads]
    wanted = {
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CPU_KVCACHE_SPACE": VLLM_KV_CACHE_GIB,
        "HF_HUB_OFFLINE": "1",
    }
    if local:
        home = pwd.getpwuid(os.getuid()).pw_dir
        wanted.update(VLLM_CACHE_ROOT=os.path.join(home, ".cache", "vllm"), OMP_NUM_THREADS=str(threads),
                      VLLM_CPU_OMP_THREADS_BIND=",".join(map(str, bound)))
        return {k: v for k, v in wanted.items() if k not in os.environ}
    return wanted
