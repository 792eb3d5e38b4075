"""A Session's timeline ring buffer: bounded, oldest dropped first, off at capacity 0, and filled
by the Group's lease, barrier, pause and resume."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from tests.support.sessions import make_group

from relaxtrio.nursery.timeline import Timeline, default_capacity, set_default_capacity


async def test_the_buffer_keeps_the_newest_events_on_the_trio_clock(autojump_clock: trio.testing.MockClock) -> None:
    timeline = Timeline(3)
    for i in range(5):
        timeline.add("lease", i)
        await trio.sleep(1.0)
    events = timeline.events()
    assert [e[1:] for e in events] == [("lease", 2), ("lease", 3), ("lease", 4)]
    assert [e[0] for e in events] == [2.0, 3.0, 4.0]  # recorded at the clock's time
    assert timeline.dropped == 2 and timeline.capacity == 3


async def test_capacity_zero_records_nothing() -> None:
    timeline = Timeline(0)
    timeline.add("barrier")
    assert timeline.events() == () and timeline.capacity == 0 and timeline.dropped == 0


async def test_the_default_bound_applies_to_sessions_created_afterwards() -> None:
    before = default_capacity()
    try:
        set_default_capacity(0)
        off = make_group(1).sessions[0]
        set_default_capacity(7)
        on = make_group(1).sessions[0]
    finally:
        set_default_capacity(before)
    assert off.timeline.capacity == 0 and on.timeline.capacity == 7
    with pytest.raises(ValueError, match="capacity"):
        set_default_capacity(-1)


async def test_the_group_records_lease_barrier_pause_and_resume_on_every_session() -> None:
    group = make_group(2)
    group.lease(0)
    group.note_request(group.sessions[0])
    group.note_request(group.sessions[1])  # the barrier passes here, once
    group.note_request(group.sessions[1])
    group.pause()
    group.resume(1)
    for session in group.sessions:
        assert [e[1:] for e in session.timeline.events()] == [
            ("lease", 0), ("barrier",), ("pause", 0), ("resume", 1)]


def test_outside_a_trio_run_nothing_is_recorded() -> None:
    timeline = Timeline(4)
    timeline.add("lease", 0)  # no trio clock: a synchronous caller records nothing, raises nothing
    assert timeline.events() == ()
