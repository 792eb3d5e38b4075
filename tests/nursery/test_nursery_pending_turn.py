"""PendingTurn.result_unless: one task waits for a turn's end or for its client to go away."""

from __future__ import annotations

import trio
import trio.lowlevel
import trio.testing
from tests.support.sessions import open_session

from relaxtrio import SessionAbortedError
from relaxtrio.forest import Conversation
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.nursery.turns import TurnContext, TurnRequest, TurnResult

REQUEST = TurnRequest(conversation=Conversation.from_wire([{"role": "user", "content": "hi"}], None, None))


class _GatedHandler:
    """Answers each turn once ``gate`` is set; records the turns it completed."""

    def __init__(self) -> None:
        self.gate = trio.Event()
        self.completed = 0

    async def complete(self, turn: TurnContext, request: TurnRequest) -> TurnResult:
        turn.mark_prepared()
        await self.gate.wait()
        self.completed += 1
        return TurnResult(message={"role": "assistant", "content": "ok"}, finish_reason="stop",
                          prompt_tokens=1, completion_tokens=1, request_id=f"{turn.session_id}:t1",
                          state_hash="a" * 64)


async def test_the_turns_end_ends_the_wait_for_the_client() -> None:
    handler, gone_waits = _GatedHandler(), []

    async def never_gone() -> None:
        gone_waits.append(1)
        await trio.sleep_forever()

    async def open_gate() -> None:
        await trio.testing.wait_all_tasks_blocked()  # the request waits for its client
        handler.gate.set()

    async with open_session(SessionRegistry()) as session, trio.open_nursery() as nursery:
        pending = session.start_turn(handler, REQUEST)
        nursery.start_soon(open_gate)
        result = await pending.result_unless(never_gone)
    assert result is not None and result.message["content"] == "ok"
    assert gone_waits == [1]  # it did wait for the client, and that wait was cancelled


async def test_a_client_that_goes_first_leaves_the_turn_running() -> None:
    handler, client_gone = _GatedHandler(), trio.Event()
    async with open_session(SessionRegistry()) as session:
        pending = session.start_turn(handler, REQUEST)
        client_gone.set()
        assert await pending.result_unless(client_gone.wait) is None
        handler.gate.set()
        with trio.fail_after(5):
            while not handler.completed:  # the turn goes on and is committed without its client
                await trio.lowlevel.checkpoint()


async def test_an_ended_turn_is_returned_without_a_checkpoint() -> None:
    handler = _GatedHandler()
    handler.gate.set()
    async with open_session(SessionRegistry()) as session:
        pending = session.start_turn(handler, REQUEST)
        await pending.wait_prepared()
        await pending.result()  # the turn has ended
        with trio.testing.assert_no_checkpoints():
            result = await pending.result_unless(trio.sleep_forever)
    assert result is not None


async def test_the_sessions_end_answers_the_waiting_request() -> None:
    handler, errors = _GatedHandler(), []
    async with trio.open_nursery() as nursery:  # noqa: SIM117 - the Session ends inside the nursery
        async with open_session(SessionRegistry()) as session:
            pending = session.start_turn(handler, REQUEST)

            async def wait() -> None:
                try:
                    await pending.result_unless(trio.sleep_forever)
                except SessionAbortedError as exc:
                    errors.append(exc)

            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
        # leaving open_session ended the Session: its turn was cancelled, the request answered
    assert len(errors) == 1 and not handler.completed
    assert session.num_cancelled_turns == 1  # what serve reports as cut off at its stop


async def test_turns_that_ended_before_the_close_are_not_counted_as_cancelled() -> None:
    handler = _GatedHandler()
    handler.gate.set()
    async with open_session(SessionRegistry()) as session:
        await session.start_turn(handler, REQUEST).result()
    assert handler.completed == 1 and session.num_cancelled_turns == 0
