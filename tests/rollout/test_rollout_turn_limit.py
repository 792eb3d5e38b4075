"""A request's own token limit is its turn limit, bounded by the context (not by the default).

See docs/canonical-contract.md#context-limits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from tests.support.sessions import leased_session

from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.config import GenerationConfig
from relaxtrio.forest import Conversation
from relaxtrio.models import load_tokenizer
from relaxtrio.nursery.turns import TurnRequest
from relaxtrio.rollout.turns import MAX_TURN_TOKENS, EngineTurnHandler
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine


async def _turn_budget(model_dir: Path, *, request_limit: int | None, default: int,
                       max_context_tokens: int | None) -> tuple[int, int]:
    tok = load_tokenizer(model_dir)
    engine = ScriptedEngine(tokenizer=tok, eos_id=tok.eos_token_id, replies=lambda ids: Reply(text="ok"))
    handler = EngineTurnHandler(client=engine, compiler=ChatCompiler(tok),
                                config=GenerationConfig(max_response_tokens=default))
    session = leased_session(session_id="s", max_context_tokens=max_context_tokens, budget_s=10)
    conversation = Conversation.from_wire([{"role": "user", "content": "hello there"}])
    with trio.fail_after(10):
        await handler.complete(session.turn_context(), TurnRequest(conversation=conversation, max_new_tokens=request_limit))
    [(prompt_ids, sampling, _)] = engine.calls
    return sampling.max_new_tokens, len(prompt_ids)


@pytest.mark.parametrize(("request_limit", "default", "expected"),
                         [(300, 16, 300), (5, 16, 5), (None, 16, 16),
                          (2**70, 16, MAX_TURN_TOKENS)])  # an agent's "no limit", cut for the engine
async def test_the_request_limit_is_the_turn_limit(tiny_model_dir: Path, request_limit, default,
                                                   expected) -> None:
    # Before, a request could only lower --rollout-max-response-len: 300 became 16.
    budget, _ = await _turn_budget(tiny_model_dir, request_limit=request_limit, default=default,
                                   max_context_tokens=None)
    assert budget == expected


async def test_the_context_bounds_the_request_limit(tiny_model_dir: Path) -> None:
    _, prompt = await _turn_budget(tiny_model_dir, request_limit=1, default=16, max_context_tokens=None)
    budget, _ = await _turn_budget(tiny_model_dir, request_limit=300, default=16,
                                   max_context_tokens=prompt + 40)
    assert budget == 40
