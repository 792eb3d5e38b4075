"""End to end: a real openai-SDK agent process, the real engine process, the tiny real model."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import pytest
import trio
from tests.support.apps import serve_agent_api

from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.config import AgentConfig, GenerationConfig
from relaxtrio.forest import ObservationNode, ResponseNode
from relaxtrio.models import load_model, load_tokenizer
from relaxtrio.nursery.group import run_group
from relaxtrio.nursery.group import Group
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.rollout.turns import EngineTurnHandler
from relaxtrio.fleet.embedded import open_embedded_engine
from tests.support.fleets import open_fleet_of_one

pytestmark = pytest.mark.slow  # starts real processes

OPENAI_AGENT = r'''
import asyncio, json, os
from openai import AsyncOpenAI

async def main():
    task = json.load(open(os.environ["RELAX_INPUT_JSON"]))
    messages = task["messages"]
    client = AsyncOpenAI(base_url=os.environ["RELAX_BASE_URL"], api_key=os.environ["RELAX_SESSION_ID"],
                         timeout=600, max_retries=0)
    first = await client.chat.completions.create(model="policy", messages=messages)
    messages.append(first.choices[0].message.model_dump())
    messages.append({"role": "user", "content": "Tell me more."})
    second = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
    assert second.usage.completion_tokens <= 6
    json.dump({"reward": 0.5, "metadata": {"turns": 2}}, open(os.environ["RELAX_OUTPUT_JSON"], "w"))
    await client.close()

asyncio.run(main())
'''


async def test_two_turn_openai_agent_exports_exact_tokens(tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(OPENAI_AGENT)
    tokenizer = load_tokenizer(tiny_model_dir)
    compiler = ChatCompiler(tokenizer)
    group = Group.create("train:group_e2e", num_sessions=2,
                         input_payload={"messages": [{"role": "user", "content": "What is 2 + 2?"}]},
                         dataset_metadata={"answer": "4"}, max_context_tokens=4096, timeout_s=300)
    registry = SessionRegistry()
    with trio.fail_after(180):
        async with (
            open_embedded_engine(tiny_model_dir, log_path=tmp_path / "engine.log") as engine_url,
            open_fleet_of_one(engine_url) as client,
        ):
            handler = EngineTurnHandler(
                client=client, compiler=compiler,
                config=GenerationConfig(max_response_tokens=12, temperature=1.0, seed=1234),
            )
            async with serve_agent_api(registry, handler) as base_url:
                await run_group(group, agent=AgentConfig(command=f"{sys.executable} agent.py", cwd=tmp_path,
                                                         timeout_s=120),
                                base_url=base_url, registry=registry)
    assert not group.dropped, group.dropped_reason
    assert len(registry) == 0

    model = load_model(tiny_model_dir)
    for session in group.sessions:
        [sample] = session.samples
        assert sample.reward == 0.5 and sample.metadata["turns"] == 2 and sample.metadata["answer"] == "4"
        [leaf] = session.forest.leaves()
        lineage = session.forest.lineage(leaf)
        kinds = [type(node) for node in lineage]
        assert kinds == [ObservationNode, ResponseNode, ObservationNode, ResponseNode]
        obs1, resp1, obs2, resp2 = lineage
        # Observations are exactly what the compiler renders: a full render, then a delta.
        assert obs1.token_ids == compiler.render(
            [{"role": "user", "content": "What is 2 + 2?"}], (), {}).token_ids
        assert obs2.token_ids == compiler.render_delta([{"role": "user", "content": "Tell me more."}], (), {}).token_ids
        assert 1 <= len(resp2.token_ids) <= 6
        # token ids = prompt ids + generated + observation + generated; mask 1 only on generated.
        assert sample.token_ids == obs1.token_ids + resp1.token_ids + obs2.token_ids + resp2.token_ids
        assert sample.prompt_length == len(obs1.token_ids)
        expected_mask = ((0,) * len(obs1.token_ids) + (1,) * len(resp1.token_ids)
                         + (0,) * len(obs2.token_ids) + (1,) * len(resp2.token_ids))
        assert sample.loss_mask == expected_mask
        # Rollout logprobs equal a fresh full forward pass of the same ids (fp32, T=1).
        ids = torch.tensor([sample.token_ids])
        with torch.inference_mode():
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        fresh = [0.0] + [float(logprobs[t - 1, sample.token_ids[t]]) for t in range(1, ids.shape[1])]
        for t, mask in enumerate(sample.loss_mask):
            if mask:
                assert abs(sample.rollout_logprobs[t] - fresh[t]) < 1e-4, t
            else:
                assert sample.rollout_logprobs[t] == 0.0
