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
from tests.support.sessions import leased_session, open_session
from tests.support.waits import wait_until

from relaxtrio.api.app import create_app
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.config import AgentConfig
from relaxtrio.nursery.agent import AgentRun
from relaxtrio.nursery.session import Session, SessionRegistry
from relaxtrio.nursery.session_task import run_session
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


def _sdk_agent(answers: list[str], gate: trio.Event):
    """An in-process agent (the launcher of :class:`AgentConfig`; no subprocess) whose openai SDK
    gives up on its first turn (``timeout`` 0.3 s, ``max_retries=2``: three timed-out attempts),
    then asks again with the same messages and another token limit, and writes a reward."""

    async def launch(agent: AgentConfig, env, payload, budget, **_: object) -> AgentRun:
        async with openai.AsyncOpenAI(base_url=env.base_url, api_key=env.session_id,
                                      timeout=0.3, max_retries=2) as client:
            with pytest.raises(openai.APITimeoutError):
                await client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=400)
            gate.set()  # the abandoned generation now finishes, with no client to tell
            reply = await client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=16)
        answers.append(reply.choices[0].message.content)
        return AgentRun(return_code=0, output_text='{"reward": 1}', log_tail="", active_s=0.0)

    return launch


async def test_an_answer_the_agent_never_received_is_a_side_leaf(
    registry: SessionRegistry, compiler: ChatCompiler, tmp_path
) -> None:
    """Issue 34, item 6: the first turn's client times out on every SDK attempt (the retries
    attach to the generation, which is held); the agent then asks again with another
    ``max_tokens``, a new sample. The abandoned answer is committed but never delivered: implicit
    export under ``strict`` leaves it out as a side leaf (counted) and trains the agent's own
    linear history, instead of failing the Session with "found 2"."""
    gate = trio.Event()
    handler, engine = scripted_pipeline(compiler, [Reply(text="Abandoned answer.", gate=gate),
                                                   Reply(text="Short answer.")])
    answers: list[str] = []
    session = leased_session()
    agent = AgentConfig(command="in-process", cwd=tmp_path, launcher=_sdk_agent(answers, gate))
    app = create_app(registry, handler)
    with trio.fail_after(30):
        async with serve_app(app) as base_url:
            await run_session(session, agent=agent, base_url=base_url, registry=registry)
    assert answers == ["Short answer."] and len(engine.calls) == 2
    assert session.retries.statistics().num_attached == 2  # both SDK retries joined the first generation
    assert len(session.forest.leaves()) == 2  # both answers are committed (and dumped)
    assert session.status == "completed", session.error
    [sample] = session.samples
    assert sample.reward == 1 and session.num_side_leaves == 1
    assert {session.forest.messages(leaf)[-1]["content"] for leaf in session.forest.leaves()} == {
        "Short answer.", "Abandoned answer."}
    trained = compiler.tokenizer.decode([t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m])
    assert "Short answer." in trained and "Abandoned" not in trained
