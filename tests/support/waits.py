"""The one bounded wait for state that no event announces: a real process's (an engine that dies
or comes back, an agent that writes a file, a Ray actor that exits), or a worker thread's (an SDK
client with its own wall-clock timeouts).

Everything the test's own trio loop changes is waited on with events, ``statistics()`` after
``trio.testing.wait_all_tasks_blocked()``, or a ``MockClock``; these helpers are for the rest. The
bound is wall time (``time.monotonic``), so it holds whatever clock the trio run uses.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable

import trio

INTERVAL_S = 0.05
"""Seconds between two looks at the condition."""


class WaitTimeout(AssertionError):
    """The condition did not hold within the wait's bound (a test failure, not an error)."""


async def wait_until(condition: Callable[[], bool | Awaitable[bool]], *, timeout_s: float, what: str,
                     interval_s: float = INTERVAL_S) -> None:
    """Waits until ``condition()`` (sync or async) is true, looking every ``interval_s``.

    Args:
        condition: reads the state a real process or a worker thread changes.
        timeout_s: wall seconds before giving up.
        what: the awaited state in words, for the failure message.
        interval_s: wall seconds between looks.

    Raises:
        WaitTimeout: ``condition()`` was still false after ``timeout_s`` wall seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        holds = condition()
        if inspect.isawaitable(holds):
            holds = await holds
        if holds:
            return
        if time.monotonic() > deadline:
            raise WaitTimeout(f"still waiting for {what} after {timeout_s:g} s")
        await trio.sleep(interval_s)


def wait_until_sync(condition: Callable[[], bool], *, timeout_s: float, what: str,
                    interval_s: float = INTERVAL_S) -> bool:
    """:func:`wait_until` for code outside trio (fixtures, plain tests); returns whether it held.

    Returns False instead of raising, for teardown code that reports what is left itself.
    """
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True
