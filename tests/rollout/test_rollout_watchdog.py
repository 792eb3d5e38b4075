"""The first-request barrier watchdog, in exact virtual time (MockClock autojump)."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from relaxtrio.nursery.group import Group
from relaxtrio.rollout.watchdog import BarrierWatchdog


async def test_warns_every_warn_s_until_the_barrier_passes(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    group = Group.create("train:group_w", num_sessions=2, input_payload={}, timeout_s=60)
    group.started_at = t0 = trio.current_time()
    watchdog = BarrierWatchdog(warn_s=10.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watchdog.watch, group)
        group.note_request(group.sessions[0])
        await watchdog.wait_warnings(2)
        assert trio.current_time() == t0 + 20
        group.note_request(group.sessions[1])  # the barrier passes: the watch returns
    assert watchdog.num_warnings == 2 and trio.current_time() == t0 + 20
    assert "event=barrier_wait group=train:group_w" in caplog.text and "waited_s=20.0" in caplog.text
    assert f"session 1 {group.sessions[1].session_id}" in caplog.text
    assert f"session 0 {group.sessions[0].session_id}" not in caplog.text
