"""Process checks for tests: is a pid still a live (non-zombie) process, and pids an agent reports."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


class PidPipe:
    """A named pipe that a test's agent writes pids into; the test waits for them, without polling.

    The test end is opened read-write, so the pipe always has a writer: reads wait for data
    instead of seeing end-of-file, and an agent opening it for writing never blocks.
    """

    def __init__(self, path: Path) -> None:
        import trio

        os.mkfifo(path)
        self.path = path
        self._stream = trio.lowlevel.FdStream(os.open(path, os.O_RDWR | os.O_NONBLOCK))
        self._buffer = b""

    async def read_pids(self, count: int) -> list[int]:
        """Waits until ``count`` newline-terminated pids arrived in total; returns all so far."""
        while self._buffer.count(b"\n") < count:
            self._buffer += await self._stream.receive_some()
        return [int(p) for p in self._buffer.split()]

    async def aclose(self) -> None:
        """Closes the test end."""
        await self._stream.aclose()


class RealTimeLimit:
    """A wall-clock bound for a test whose trio clock is a ``MockClock`` that only moves when the
    test jumps it (``mock_clock``): ``trio.fail_after`` would never fire there, so a hang in the
    real I/O (an agent process, a socket) is bounded by this instead.

    Use ``async with RealTimeLimit(60):``; the body is cancelled and ``trio.TooSlowError`` raised
    once ``seconds`` of wall time passed. A worker thread waits on an event that exiting sets, so
    nothing outlives the block.
    """

    def __init__(self, seconds: float) -> None:
        import threading

        self.seconds = seconds
        self._done = threading.Event()
        self._nursery_manager = None

    async def __aenter__(self) -> RealTimeLimit:
        import trio

        self._nursery_manager = trio.open_nursery()
        nursery = await self._nursery_manager.__aenter__()

        async def watch() -> None:
            if not await trio.to_thread.run_sync(self._done.wait, self.seconds):
                raise trio.TooSlowError(f"still running after {self.seconds:g} s of wall time")

        nursery.start_soon(watch)
        return self

    async def __aexit__(self, *exc_info: object) -> bool | None:
        self._done.set()
        assert self._nursery_manager is not None
        return await self._nursery_manager.__aexit__(*exc_info)
