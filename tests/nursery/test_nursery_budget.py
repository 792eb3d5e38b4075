"""Active-time budgets at Group level, in exact virtual time (MockClock autojump)."""

from __future__ import annotations

import trio
import trio.testing

from relaxtrio.nursery.group import Group
from relaxtrio.nursery.session import Session


def _group(n: int, budget_s: float) -> Group:
    return Group.create("train:group_b", num_sessions=n, input_payload={}, timeout_s=budget_s)


async def _expire_times(group: Group, out: dict[int, float]) -> None:
    async def agent(session: Session) -> None:
        with session.budget.scope:
            await trio.sleep_forever()
        out[session.index] = trio.current_time()

    async with trio.open_nursery() as nursery:
        for session in group.sessions:
            nursery.start_soon(agent, session)


def _all_requested(group: Group) -> Group:
    """Every Session has sent its first request (the barrier has passed)."""
    for session in group.sessions:
        group.note_request(session)
    return group


async def test_prelaunched_group_spends_no_budget_until_leased(autojump_clock: trio.testing.MockClock) -> None:
    group = _all_requested(_group(2, budget_s=10.0))  # first requests sent early, and held
    expired: dict[int, float] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_expire_times, group, expired)
        await trio.sleep(500)  # prelaunched, waiting for the Runtime lease
        assert expired == {}
        group.lease()
    assert expired == {0: 510.0, 1: 510.0}


async def test_pause_stops_budget_and_protection_keeps_it_running(
    autojump_clock: trio.testing.MockClock,
) -> None:
    group = _all_requested(_group(2, budget_s=10.0))
    expired: dict[int, float] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_expire_times, group, expired)
        group.lease()                          # t=0: both budgets run
        await trio.sleep(4)
        group.sessions[1].partial.note_aborted(protect=True)
        group.pause()                          # t=4: step close; pending protection not yet active
        assert group.sessions[1].partial.statistics().protection_pending
        assert group.sessions[1].partial.paused and not group.sessions[1].partial.protected
        await trio.sleep(100)
        group.resume()                         # t=104: session 1 becomes protected
        assert group.sessions[1].partial.protected
        await trio.sleep(2)
        group.pause()                          # t=106: only session 0 pauses
        await trio.sleep(20)
        group.resume()                         # t=126: session 0 has 10-4-2 = 4 s left
    assert expired[1] == 104 + (10 - 4)        # 6 s left at t=104, protected from t=106 on
    assert expired[0] == 126 + 4


async def test_generation_gate_needs_lease_barrier_and_no_pause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    group = _group(2, budget_s=100.0)
    passed: list[tuple[int, float]] = []

    async def generate(session: Session) -> None:
        await session.wait_generation_allowed()
        passed.append((session.index, trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(generate, group.sessions[0])
        group.note_request(group.sessions[0])
        await trio.sleep(1)
        group.lease()                           # leased, but session 1 has not asked yet
        await trio.sleep(1)
        assert passed == []
        group.note_request(group.sessions[1])   # t=2: barrier passes
        await trio.sleep(1)
        assert passed == [(0, 2.0)]
        group.pause()
        nursery.start_soon(generate, group.sessions[1])
        await trio.sleep(5)
        assert len(passed) == 1, "a paused Group does not generate"
        group.resume()                          # t=8
    assert passed == [(0, 2.0), (1, 8.0)]


async def test_budget_starts_when_the_sessions_enter_runtime(autojump_clock: trio.testing.MockClock) -> None:
    # Without prelaunch a Group is leased as soon as its agents start. Start-up and the wait for
    # the siblings' first requests used to spend the budget (expiry at t=10); Runtime begins only
    # when the lease is held and every Session has asked.
    group = _group(2, budget_s=10.0)
    expired: dict[int, float] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_expire_times, group, expired)
        group.lease()                          # t=0: leased, nobody has asked yet
        await trio.sleep(30)                   # agent start-up
        group.note_request(group.sessions[0])  # t=30: session 0 waits at the barrier
        await trio.sleep(20)
        assert expired == {} and not group.in_runtime
        group.note_request(group.sessions[1])  # t=50: barrier passes, Runtime begins
        assert group.in_runtime
    assert expired == {0: 60.0, 1: 60.0}


async def test_a_barrier_passed_while_paused_starts_budgets_on_resume(
    autojump_clock: trio.testing.MockClock,
) -> None:
    group = _group(1, budget_s=5.0)
    expired: dict[int, float] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_expire_times, group, expired)
        group.lease()
        group.pause()
        group.note_request(group.sessions[0])  # in Runtime, but paused between steps
        await trio.sleep(100)
        group.resume()                         # t=100
    assert expired == {0: 105.0}
