"""RetryLedger and the sampling digest: which requests count as the same generation."""

from __future__ import annotations

import pytest

from relaxtrio import InvalidRequestError
from relaxtrio.forest import Conversation
from relaxtrio.nursery.retries import RetryKey, RetryLedger
from relaxtrio.nursery.turns import TurnRequest, TurnResult

KEY = RetryKey("a" * 64, "d")
RESULT = TurnResult(message={"role": "assistant", "content": "hi"}, finish_reason="stop", prompt_tokens=3,
                    completion_tokens=1, request_id="s:t00001", state_hash="b" * 64)


def _request(**fields) -> TurnRequest:
    conv = Conversation.from_wire([{"role": "user", "content": "hi"}], None, None)
    return TurnRequest(conversation=conv, **fields)


def test_sampling_digest_covers_sampling_inputs_not_the_protocol() -> None:
    base = _request().sampling_digest()
    assert _request(protocol="messages").sampling_digest() == base
    for fields in ({"seed": 1}, {"max_new_tokens": 5}, {"stop": ("x",)}, {"logprobs": True}):
        assert _request(**fields).sampling_digest() != base, fields


def test_ledger_orphan_undelivered_and_delivered() -> None:
    ledger = RetryLedger()
    generation = ledger.open(KEY)
    generation.num_waiting = 1
    assert ledger.orphan(KEY) is None  # its client still waits: a sibling would branch
    generation.num_waiting = 0
    assert ledger.orphan(KEY) is generation
    assert ledger.statistics().num_generating == 1
    ledger.finish(generation, result=RESULT)
    assert ledger.statistics().num_undelivered == 1 and ledger.orphan(KEY) is generation
    ledger.deliver(generation)
    assert ledger.orphan(KEY) is None and ledger.statistics().num_orphaned == 0


async def test_failed_generation_leaves_and_its_waiters_get_the_error() -> None:
    ledger = RetryLedger()
    generation = ledger.open(KEY)
    error = InvalidRequestError("nope", param="messages")
    ledger.finish(generation, error=error)
    assert ledger.orphan(KEY) is None and ledger.statistics().num_orphaned == 0
    with pytest.raises(InvalidRequestError):
        await generation.wait_result()
