"""``python -m relaxtrio.engine`` as a real subprocess: URL line, serving, clean SIGTERM exit."""

from __future__ import annotations

import pytest

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import trio

pytestmark = pytest.mark.slow  # starts real processes

PREFIX = "RELAXTRIO_ENGINE_URL="


async def _read_url_line(stream: trio.abc.ReceiveStream) -> tuple[str, list[str]]:
    buffer = b""
    while b"\n" not in buffer:
        chunk = await stream.receive_some()
        assert chunk, f"engine stdout closed early: {buffer!r}"
        buffer += chunk
    lines = buffer.decode().splitlines()
    return lines[0], lines


async def test_cli_prints_url_serves_and_exits_on_sigterm(tiny_model_dir: Path) -> None:
    cmd = [sys.executable, "-m", "relaxtrio.engine", "--model", str(tiny_model_dir),
           "--host", "127.0.0.1", "--port", "0", "--max-running-requests", "2",
           "--weight-version", "w0"]
    process = await trio.lowlevel.open_process(cmd, stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        with trio.fail_after(120):
            first, lines = await _read_url_line(process.stdout)
        assert first.startswith(PREFIX) and len(lines) == 1
        url = first[len(PREFIX):]
        assert url.startswith("http://127.0.0.1:") and int(url.rsplit(":", 1)[1]) > 0
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            assert (await http.get("/health")).status_code == 200
            info = (await http.get("/server_info")).json()
            assert info["max_running_requests"] == 2
            assert (await http.get("/model_info")).json()["weight_version"] == "w0"
            r = await http.post("/generate", json={"input_ids": [1, 2, 3],
                                                   "sampling_params": {"max_new_tokens": 3,
                                                                       "ignore_eos": True}})
            assert len(r.json()["output_ids"]) == 3
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            code = await process.wait()
        assert code == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
