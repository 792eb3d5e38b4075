"""A real API server + pipeline over a given engine client, for pipeline tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.config import AgentConfig, GenerationConfig, RolloutConfig
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.rollout.dataset import Prompt, PromptStream
from relaxtrio.rollout.pipeline import RolloutPipeline, open_rollout_pipeline
from relaxtrio.rollout.turns import EngineTurnHandler
from tests.support.agents import write_httpx_agent
from tests.support.apps import serve_agent_api


def prompts(metadatas: Sequence[dict[str, Any]]) -> PromptStream:
    """One prompt per metadata dict (in order, repeating)."""
    rows = [Prompt(index=i, messages=({"role": "user", "content": f"task {i}"},), metadata=dict(m))
            for i, m in enumerate(metadatas)]
    return PromptStream(prompts=rows, shuffle=False)


@asynccontextmanager
async def open_test_pipeline(
    tmp_path: Path,
    tokenizer: Any,
    client: Any,
    stream: PromptStream,
    *,
    config: RolloutConfig,
    generation: GenerationConfig | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 60.0,
    eval_concurrency: int | None = None,
    export_policy: str = "strict",
    launcher: Any = None,
    failed_log_dir: Path | None = None,
) -> AsyncIterator[tuple[RolloutPipeline, SessionRegistry]]:
    """Serves the API on 127.0.0.1:0 and opens a pipeline running the httpx test agent
    (as local subprocesses, or through ``launcher``, e.g. the Ray executor)."""
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir(exist_ok=True)
    command = write_httpx_agent(agent_dir)
    registry = SessionRegistry()
    handler = EngineTurnHandler(client=client, compiler=ChatCompiler(tokenizer),
                                config=generation or GenerationConfig(max_response_tokens=16))
    async with serve_agent_api(registry, handler) as base_url:
        async with open_rollout_pipeline(
            config=config,
            agent=AgentConfig(command=f"{command} ok", cwd=agent_dir, env=env or {},
                              timeout_s=timeout_s, term_grace_s=0.5, export_policy=export_policy,
                              launcher=launcher,
                              failed_log_dir=failed_log_dir),
            registry=registry, handler=handler, base_url=base_url, prompts=stream,
            eval_concurrency=eval_concurrency,
        ) as pipeline:
            yield pipeline, registry
