"""Time for tests whose trio clock is a ``MockClock`` that only the test moves (``mock_clock``)."""

from __future__ import annotations

import threading

import trio


class RealTimeLimit:
    """A wall-clock bound for a test whose trio clock is a ``MockClock`` that only moves when the
    test jumps it (``mock_clock``): ``trio.fail_after`` would never fire there, so a hang in the
    real I/O (an agent process, a socket) is bounded by this instead.

    Use ``async with RealTimeLimit(60):``; the body is cancelled and ``trio.TooSlowError`` raised
    once ``seconds`` of wall time passed. A worker thread waits on an event that exiting sets, so
    nothing outlives the block.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._done = threading.Event()
        self._nursery_manager = None

    async def __aenter__(self) -> RealTimeLimit:
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
