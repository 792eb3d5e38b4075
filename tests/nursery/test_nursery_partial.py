"""Partial-rollout state of one Session: tracking, aborts re-sent on a timer, pause and protection,
in exact virtual time (MockClock autojump)."""

from __future__ import annotations

import trio
import trio.testing

from relaxtrio.nursery.partial import ABORT_RESEND_S, PartialRollout


async def test_abort_all_resends_until_every_generation_returned(
    autojump_clock: trio.testing.MockClock,
) -> None:
    partial = PartialRollout()
    returned = {"a": trio.Event(), "b": trio.Event()}
    sent: list[tuple[str, float]] = []

    async def generate(rid: str, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with partial.track(rid):
            task_status.started()
            await returned[rid].wait()

    async def abort(rid: str) -> None:
        sent.append((rid, trio.current_time()))
        # "a" honours its first abort; "b"'s first two aborts arrive before its request.
        if rid == "a" or sum(r == "b" for r, _ in sent) == 3:
            returned[rid].set()

    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        for rid in returned:
            await nursery.start(generate, rid)
        assert partial.statistics().inflight_rids == ("a", "b")
        assert await partial.abort_all(abort) == 2
    assert trio.current_time() == t0 + 2 * ABORT_RESEND_S
    assert sent == [("a", t0), ("b", t0), ("b", t0 + ABORT_RESEND_S), ("b", t0 + 2 * ABORT_RESEND_S)]
    stats = partial.statistics()
    assert stats.inflight_rids == () and stats.num_abort_requests == 4


async def test_abort_all_with_nothing_in_flight_sends_nothing() -> None:
    partial = PartialRollout()
    sent: list[str] = []

    async def abort(rid: str) -> None:
        sent.append(rid)

    assert await partial.abort_all(abort) == 0 and sent == []


def test_protection_starts_at_the_next_resume() -> None:
    partial = PartialRollout()
    partial.note_aborted(protect=False)
    assert partial.pause() and partial.paused
    partial.resume()
    partial.note_aborted(protect=True)
    assert partial.statistics().protection_pending and not partial.protected
    assert partial.pause(), "a pending protection does not stop this pause"
    partial.resume()
    assert partial.protected and not partial.paused
    assert not partial.pause() and not partial.paused, "a protected Session ignores pauses"
    stats = partial.statistics()
    assert (stats.num_aborted, stats.protected, stats.paused) == (2, True, False)
