"""In-process agents with scripted timing, for rollout pipeline tests under the mock clock.

No process and no socket: the launcher (:attr:`~relaxtrio.config.AgentConfig.launcher`) drives
its Session directly, the way a turn does. Each turn sends a request (first-request barrier),
waits at the Group's generation gate, generates for ``generate_s`` seconds with the request in
flight at the "engine" (:meth:`PartialRollout.track`), commits the answer to the Session's
forest, and then works off the engine for ``then_s`` seconds (a tool call). The agent exits 0
with ``{"reward": 1.0}``, so implicit export trains the last answer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.config import AgentConfig, GenerationConfig, RolloutConfig
from relaxtrio.forest import Conversation
from relaxtrio.nursery.agent import AgentRun
from relaxtrio.nursery.session import Session, SessionRegistry
from relaxtrio.rollout.dataset import PromptStream
from relaxtrio.rollout.pipeline import RolloutPipeline, open_rollout_pipeline
from relaxtrio.rollout.turns import EngineTurnHandler
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine


@attrs.frozen
class Turn:
    """One scripted turn: seconds generating at the engine, then seconds off it (a tool)."""

    generate_s: float = 1.0
    then_s: float = 0.0


@attrs.define(eq=False)
class ScriptedAgents:
    """The launcher of in-process agents; task ``i`` (the prompt ``task i``) runs
    ``scripts[i]`` (default: one :class:`Turn`).

    Attributes:
        registry: the pipeline's Session registry (the launcher finds its Session there).
        scripts: turns per task index.
        started: ``(group_id, task)`` of every agent started, in start order.
    """

    registry: SessionRegistry
    scripts: Mapping[int, Sequence[Turn]] = attrs.field(factory=dict)
    started: list[tuple[str, int]] = attrs.field(factory=list)

    async def __call__(self, agent: AgentConfig, env: Any, payload: Mapping[str, Any], budget: Any,
                       **_: object) -> AgentRun:
        session = self.registry.get(env.session_id)
        task = int(payload["messages"][0]["content"].rsplit(" ", 1)[1])
        self.started.append((env.group_id, task))
        history: list[dict[str, Any]] = [dict(payload["messages"][0])]
        for i, turn in enumerate(self.scripts.get(task, (Turn(),))):
            if i:
                history.append({"role": "user", "content": f"tool result {i}"})
            await _turn(session, history, turn, f"{env.session_id}:t{i}")
            await trio.sleep(turn.then_s)
        return AgentRun(return_code=0, output_text=json.dumps({"reward": 1.0}), log_tail="", active_s=0.0)


async def _turn(session: Session, history: list[dict[str, Any]], turn: Turn, rid: str) -> None:
    """One request: barrier, gate, generation in flight, answer committed and appended."""
    group = session.group
    group.note_request(session)
    await session.wait_generation_allowed()
    with session.partial.track(rid):
        await trio.sleep(turn.generate_s)
    forest = session.forest
    observation = forest.add_observation(forest.match(Conversation.from_wire(history)), token_ids=[1, 2])
    reply = {"role": "assistant", "content": f"answer {len(history)}"}
    forest.add_response(observation, reply, token_ids=[3, 4], rollout_logprobs=[-0.5, -0.5],
                        finish_reason="stop", request_id=rid, rollout_id=group.rollout_id)
    history.append(reply)


@asynccontextmanager
async def open_scripted_pipeline(tokenizer: Any, stream: PromptStream, config: RolloutConfig,
                                 scripts: Mapping[int, Sequence[Turn]],
                                 tmp_path: Path) -> AsyncIterator[tuple[RolloutPipeline, ScriptedAgents]]:
    """A rollout pipeline whose agents are :class:`ScriptedAgents` running ``scripts``; yields
    it and the agents (their ``started`` list)."""
    registry = SessionRegistry()
    agents = ScriptedAgents(registry=registry, scripts=scripts)
    engine = ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id,
                            replies=lambda ids: Reply(text="unused"))
    handler = EngineTurnHandler(client=engine, compiler=ChatCompiler(tokenizer),
                                config=GenerationConfig(max_response_tokens=16))
    async with open_rollout_pipeline(
            config=config, registry=registry, handler=handler, prompts=stream,
            agent=AgentConfig(command="unused", cwd=tmp_path, launcher=agents, first_request_timeout_s=None),
            base_url="http://unused.invalid") as pipeline:
        yield pipeline, agents
