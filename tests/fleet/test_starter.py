"""The local engine starter on stand-in commands (no model): the URL line, startup failures, stop."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
import trio
from tests.support.procs import alive

from relaxtrio import BackendError
from relaxtrio.fleet.starter import LocalStarter, ProcessSpec, with_flag

_ANNOUNCE = ("import sys, time; print('booting'); "
             "print('RELAXTRIO_ENGINE_URL=http://127.0.0.1:' + sys.argv[sys.argv.index('--port') + 1], "
             "flush=True); time.sleep(600)")


def _spec(tmp_path: Path, code: str, *, announces_url: bool = True, port: str = "4711") -> ProcessSpec:
    return ProcessSpec(name="engine 0", cmd=(sys.executable, "-c", code, "--host", "127.0.0.1",
                                             "--port", port),
                       log_path=tmp_path / "engine-0.log", env={"STAND_IN": "1"},
                       announces_url=announces_url)


@pytest.mark.slow
async def test_the_announced_url_is_read_and_stop_ends_the_group(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            handle = await LocalStarter().start(_spec(tmp_path, _ANNOUNCE), timeout_s=30,
                                                nursery=nursery)
            assert handle.url == "http://127.0.0.1:4711" and handle.node == "local"
            assert handle.pid is not None and handle.returncode is None
            await handle.stop()
            assert handle.returncode is not None and not alive(handle.pid)
    assert "booting" in (tmp_path / "engine-0.log").read_text()  # stdout copied into the log


@pytest.mark.slow
async def test_an_sglang_style_url_comes_from_host_and_port(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            job = _spec(tmp_path, "import time; time.sleep(600)", announces_url=False, port="4712")
            handle = await LocalStarter().start(job, timeout_s=30, nursery=nursery)
            assert handle.url == "http://127.0.0.1:4712"
            await handle.kill()
            assert await handle.wait() == -signal.SIGKILL
            assert handle.describe_exit() == "code 137 (killed by SIGKILL)"


@pytest.mark.slow
async def test_an_exit_during_startup_names_the_status_and_the_log(tmp_path: Path) -> None:
    code = "import sys; print('no model here', file=sys.stderr); sys.exit(3)"
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            with pytest.raises(BackendError, match=r"(?s)engine 0 exited with code 3 during "
                                                   r"startup .*engine-0.log.*no model here"):
                await LocalStarter().start(_spec(tmp_path, code), timeout_s=30, nursery=nursery)


def test_with_flag_replaces_one_value() -> None:
    assert with_flag(("x", "--port", "0", "--host", "h"), "--port", "9") == ("x", "--port", "9", "--host", "h")
