"""Idempotent retries (docs/agent-contract.md#retries), driven by the official SDKs' own retry logic.

The real server and the real turn pipeline run on a scripted engine whose first reply is slow (it
waits on a gate). A client with a short ``timeout`` gives up on it, closes its connection and,
with ``max_retries``, sends the same request again: the retry must get the first turn's answer,
the engine must have sampled once, and implicit export must find one leaf. Deliberate second
samples (another seed, a repeat after delivery, a concurrent sibling) still branch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anthropic
import openai
import pytest
import trio
from tests.api.api_helpers import assert_one_lineage, scripted_pipeline
from tests.support.apps import serve_app
from tests.support.sessions import open_session
from tests.support.waits import wait_until

from relaxtrio.api.app import create_app
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.nursery.session import Session, SessionRegistry
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine

pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|anthropic|httpx2|httpcore2)\.:ResourceWarning")

SHORT_TIMEOUT_S = 0.5
MESSAGES = [{"role": "user", "content": "Hello?"}]


@asynccontextmanager
async def served(registry: SessionRegistry, handler) -> AsyncIterator[tuple[str, Session]]:
    app = create_app(registry, handler)
    with trio.fail_after(30):
        async with serve_app(app) as base_url, open_session(registry) as session:
            yield base_url, session


async def until_retried(condition: Callable[[], bool]) -> None:
    """Waits until ``condition()`` holds. The SDK clients run in worker threads with their own
    wall-clock timeouts and retries, which no trio event announces: a bounded real-time wait."""
    await wait_until(condition, timeout_s=20, what="the SDK's retry", interval_s=0.005)


async def open_gate_once(session: Session, gate: trio.Event, condition: Callable[[Session], bool]) -> None:
    await until_retried(lambda: condition(session))
    gate.set()


def _attached(session: Session) -> bool:
    return session.retries.statistics().num_attached >= 1


def _one_generation(engine: ScriptedEngine) -> None:
    assert len(engine.calls) == 1, f"the engine sampled {len(engine.calls)} times"


async def test_openai_sdk_retry_attaches_to_the_generation_in_flight(
    registry: SessionRegistry, compiler: ChatCompiler
) -> None:
    gate = trio.Event()
    handler, engine = scripted_pipeline(compiler, [Reply(text="Slow answer.", gate=gate)])
    async with served(registry, handler) as (base_url, session), trio.open_nursery() as nursery:
        nursery.start_soon(open_gate_once, session, gate, _attached)
        async with openai.AsyncOpenAI(base_url=base_url, api_key=session.session_id,
                                      timeout=SHORT_TIMEOUT_S, max_retries=3) as client:
            reply = await client.chat.completions.create(model="policy", messages=MESSAGES)
    assert reply.choices[0].message.content == "Slow answer."
    _one_generation(engine)
    assert_one_lineage(session, 1)
    stats = session.retries.statistics()
    assert (stats.num_attached, stats.num_generating, stats.num_orphaned) == (1, 0, 0)
    assert reply.usage.completion_tokens == len(session.forest.leaves()[0].token_ids)


async def test_anthropic_sdk_retry_attaches_to_the_generation_in_flight(
    registry: SessionRegistry, compiler: ChatCompiler
) -> None:
    gate = trio.Event()
    handler, engine = scripted_pipeline(compiler, [Reply(text="Slow answer.", gate=gate)])
    async with served(registry, handler) as (base_url, session), trio.open_nursery() as nursery:
        nursery.start_soon(open_gate_once, session, gate, _attached)
        async with anthropic.AsyncAnthropic(base_url=base_url, api_key=session.session_id,
                                            timeout=SHORT_TIMEOUT_S, max_retries=3) as client:
            reply = await client.messages.create(model="claude-x", max_tokens=64, messages=MESSAGES)
    assert [block.text for block in reply.content] == ["Slow answer."]
    _one_generation(engine)
    assert_one_lineage(session, 1)
    assert session.retries.statistics().num_attached == 1


async def test_retry_after_commit_gets_the_undelivered_answer_then_a_repeat_branches(
    registry: SessionRegistry, compiler: ChatCompiler
) -> None:
    gate = trio.Event()
    handler, engine = scripted_pipeline(compiler, [Reply(text="Slow answer.", gate=gate),
                                                   Reply(text="Second sample.")])
    async with served(registry, handler) as (base_url, session):
        async with openai.AsyncOpenAI(base_url=base_url, api_key=session.session_id,
                                      timeout=SHORT_TIMEOUT_S, max_retries=0) as impatient:
            with pytest.raises(openai.APITimeoutError):
                await impatient.chat.completions.create(model="policy", messages=MESSAGES)
        # The client is gone (HTTP 499); the turn goes on and commits with no one to tell.
        await until_retried(lambda: session.retries.statistics().num_orphaned == 1)
        gate.set()
        await until_retried(lambda: session.retries.statistics().num_undelivered == 1)
        async with openai.AsyncOpenAI(base_url=base_url, api_key=session.session_id,
                                      max_retries=0) as client:
            retried = await client.chat.completions.create(model="policy", messages=MESSAGES)
            assert retried.choices[0].message.content == "Slow answer."
            _one_generation(engine)
            assert_one_lineage(session, 1)
            assert session.retries.statistics().num_undelivered == 0
            # That answer was delivered: the same request again is a deliberate second sample.
            again = await client.chat.completions.create(model="policy", messages=MESSAGES)
    assert again.choices[0].message.content == "Second sample."
    assert len(engine.calls) == 2 and len(session.forest.leaves()) == 2


async def test_retry_with_another_seed_samples_again(registry: SessionRegistry, compiler: ChatCompiler) -> None:
    gate = trio.Event()
    handler, engine = scripted_pipeline(compiler, [Reply(text="Slow answer.", gate=gate),
                                                   Reply(text="Seeded sample.")])
    async with served(registry, handler) as (base_url, session):
        async with openai.AsyncOpenAI(base_url=base_url, api_key=session.session_id,
                                      timeout=SHORT_TIMEOUT_S, max_retries=0) as impatient:
            with pytest.raises(openai.APITimeoutError):
                await impatient.chat.completions.create(model="policy", messages=MESSAGES)
        await until_retried(lambda: session.retries.statistics().num_orphaned == 1)
        async with openai.AsyncOpenAI(base_url=base_url, api_key=session.session_id,
                                      max_retries=0) as client:
            seeded = await client.chat.completions.create(model="policy", messages=MESSAGES, seed=7)
        assert seeded.choices[0].message.content == "Seeded sample."
        assert engine.calls[1][1].sampling_seed == 7
        gate.set()
        await until_retried(lambda: session.retries.statistics().num_undelivered == 1)
    assert len(engine.calls) == 2 and len(session.forest.leaves()) == 2


async def test_concurrent_sibling_while_the_first_client_waits_branches(
    registry: SessionRegistry, compiler: ChatCompiler
) -> None:
    gates = [trio.Event(), trio.Event()]
    handler, engine = scripted_pipeline(compiler, [Reply(text="First.", gate=gates[0]),
                                                   Reply(text="Sibling.", gate=gates[1])])
    answers: list[str] = []
    async with served(registry, handler) as (base_url, session), openai.AsyncOpenAI(
            base_url=base_url, api_key=session.session_id, max_retries=0) as client:

        async def ask() -> None:
            reply = await client.chat.completions.create(model="policy", messages=MESSAGES)
            answers.append(reply.choices[0].message.content)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask)
            await until_retried(lambda: len(engine.calls) == 1)
            nursery.start_soon(ask)
            await until_retried(lambda: len(engine.calls) == 2)
            for gate in gates:
                gate.set()
    assert sorted(answers) == ["First.", "Sibling."]
    assert len(session.forest.leaves()) == 2 and session.retries.statistics().num_attached == 0
