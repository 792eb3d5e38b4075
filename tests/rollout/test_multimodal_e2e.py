"""End to end with images: dataset row with <image> → real openai-SDK agent process → real API
server → real embedded engine with the tiny random Qwen2-VL → exported sample → trainer step."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import trio
from tests.support.images import data_url, full_forward_logprobs, make_image
from tests.support.apps import serve_agent_api
from tests.support.chat import observation
from tests.support.lineage import train_token_ids

from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.config import AgentConfig, GenerationConfig
from relaxtrio.engine.server import EngineConfig, serve_engine
from relaxtrio.forest import ObservationNode, ResponseNode
from relaxtrio.nursery.group import run_group
from relaxtrio.nursery.group import Group
from relaxtrio.nursery.session import SessionRegistry
from relaxtrio.rollout.dataset import load_prompts
from relaxtrio.rollout.lineage_images import lineage_image_urls
from relaxtrio.rollout.turns import EngineTurnHandler
from relaxtrio.sglang.client import SamplingParams
from relaxtrio.testing.scored import scored_samples
from tests.support.fleets import open_fleet_of_one
from relaxtrio.train import TrainConfig, Trainer, merge_multimodal_inputs

pytestmark = pytest.mark.slow  # starts real processes

# Turn 1 sends the dataset's image; turns 2 and 3 add an image in a user message each. (Not in a
# tool result: that must answer a tool call of an earlier assistant message, which this untrained
# model does not make; an image in a tool result is test_multimodal_turns' and the compiler tests'.)
IMAGE_AGENT = r'''
import asyncio, json, os
from openai import AsyncOpenAI

async def main():
    task = json.load(open(os.environ["RELAX_INPUT_JSON"]))
    later = json.load(open("later_images.json"))
    messages = task["messages"]
    client = AsyncOpenAI(base_url=os.environ["RELAX_BASE_URL"], api_key=os.environ["RELAX_SESSION_ID"],
                         timeout=600, max_retries=0)
    usage = []
    follow_ups = [
        {"role": "user", "content": [{"type": "text", "text": "And this one?"},
                                     {"type": "image_url", "image_url": {"url": later[0]}}]},
        {"role": "user",
         "content": [{"type": "text", "text": "zoomed in:"}, {"type": "image_url", "image_url": {"url": later[1]}}]},
        None,
    ]
    for follow_up in follow_ups:
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
        usage.append(reply.usage.prompt_tokens)
        messages.append(reply.choices[0].message.model_dump())
        if follow_up is not None:
            messages.append(follow_up)
    json.dump({"reward": 1.0, "metadata": {"prompt_tokens": usage}}, open(os.environ["RELAX_OUTPUT_JSON"], "w"))
    await client.close()

asyncio.run(main())
'''


async def test_image_agent_end_to_end(tiny_vlm_dir: Path, vlm_model, vlm_vision, tmp_path: Path) -> None:
    make_image(60, 90, seed=11, mode="RGBA").save(tmp_path / "cat.png")
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"input": [{"role": "user", "content": "<image>What is in this image?"}],
                                "images": ["cat.png"], "metadata": {"label": "cat"}}) + "\n")
    [prompt] = load_prompts(data, multimodal_keys={"image": "images"})
    later = [data_url(56, 84, seed=12), data_url(28, 28, seed=13)]
    (tmp_path / "later_images.json").write_text(json.dumps(later))
    (tmp_path / "agent.py").write_text(IMAGE_AGENT)

    compiler = ChatCompiler.from_pretrained(tiny_vlm_dir)
    group = Group.create("train:group_mm", num_sessions=1, input_payload=prompt.session_input(),
                         dataset_metadata=prompt.metadata, max_context_tokens=4096, timeout_s=120)
    [session] = group.sessions
    registry = SessionRegistry()
    trainer = Trainer.from_pretrained(tiny_vlm_dir, TrainConfig(lr=1e-3))
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            engine_url = await nursery.start(serve_engine, EngineConfig(model_path=tiny_vlm_dir))
            async with open_fleet_of_one(engine_url) as client:
                handler = EngineTurnHandler(client=client, compiler=compiler,
                                            config=GenerationConfig(max_response_tokens=6, seed=4321))
                async with serve_agent_api(registry, handler) as base_url:
                    await run_group(group, agent=AgentConfig(command=f"{sys.executable} agent.py", cwd=tmp_path,
                                                             timeout_s=90),
                                    base_url=base_url, registry=registry)
                assert not group.dropped, group.dropped_reason
                [sample] = session.samples
                _check_sample(session, sample, compiler, later, vlm_model, vlm_vision)

                # One RL step: train on the sample, push the weights, generate from the same images.
                before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
                stats = trainer.train_step(scored_samples([sample], [1.0]))
                assert math.isfinite(stats.loss) and stats.rollout_logprob_abs_diff_max < 1e-4
                assert any(not v.equal(before[k]) for k, v in trainer.model.named_parameters())
                weights = trainer.save_weights(tmp_path / "weights")
                await client.update_weights_from_disk(str(weights), weight_version="step-1")
                obs = session.forest.lineage(session.forest.leaves()[0])[-2]
                result = await client.generate(
                    session.forest.rollout_token_ids(obs),
                    SamplingParams(max_new_tokens=4, temperature=1.0, sampling_seed=5, ignore_eos=True),
                    rid="after-update#", image_data=lineage_image_urls(session.forest, obs))
            nursery.cancel_scope.cancel()
    assert result.weight_version == "step-1"
    prompt = train_token_ids(session.forest, obs)
    merged = merge_multimodal_inputs(sample.multimodal_inputs)
    trainer.model.eval()
    fresh = full_forward_logprobs(trainer.model, prompt + result.output_ids, vlm_vision.image_token_id,
                                  merged, len(prompt))
    assert max(abs(a - b) for a, b in zip(result.output_logprobs, fresh, strict=True)) < 1e-4
    stale = full_forward_logprobs(vlm_model, prompt + result.output_ids, vlm_vision.image_token_id,
                                  merged, len(prompt))
    assert max(abs(a - b) for a, b in zip(result.output_logprobs, stale, strict=True)) > 1e-3  # new weights


def _check_sample(session, sample, compiler, later, vlm_model, vlm_vision) -> None:
    forest = session.forest
    [leaf] = forest.leaves()
    lineage = forest.lineage(leaf)
    assert [type(n) for n in lineage] == [ObservationNode, ResponseNode] * 3
    observations = lineage[0::2]
    dataset_url = session.input_payload["messages"][0]["content"][0]["image_url"]["url"]
    assert dataset_url.startswith("data:image/png;base64,")
    assert [n.multimodal.image_urls for n in observations] == [(dataset_url,), (later[0],), (later[1],)]
    # Each observation node holds both views of exactly what the compiler renders.
    messages = forest.messages(leaf)
    expected = [observation(compiler, messages[:1], delta=False),
                observation(compiler, messages[2:3], delta=True),
                observation(compiler, messages[4:5], delta=True)]
    for node, obs in zip(observations, expected, strict=True):
        assert node.token_ids == obs.token_ids and node.rollout_token_ids == obs.rollout_token_ids

    pad = vlm_vision.image_token_id
    payloads = sample.multimodal_inputs
    assert tuple(p.image_urls[0] for p in payloads) == (dataset_url, later[0], later[1])  # lineage order
    merged = merge_multimodal_inputs(payloads)
    features = int((merged["image_grid_thw"].prod(axis=1) // vlm_vision.merge_size**2).sum())
    assert sample.token_ids.count(pad) == features == sum(n for p in payloads for n in p.num_image_tokens)
    assert sample.rollout_token_ids.count(pad) == 3  # one placeholder per image, never re-expanded
    assert sample.metadata["label"] == "cat" and sample.reward == 1.0
    # Usage and context limits count the expanded (training) ids.
    used = [sum(len(n.token_ids) for n in lineage[: 2 * k + 1]) for k in range(3)]
    assert sample.metadata["prompt_tokens"] == used == [forest.train_token_count(n) for n in observations]
    assert [len(n.token_ids) - len(n.rollout_token_ids) for n in observations] == [
        n.multimodal.num_image_tokens[0] - 1 for n in observations] == [5, 5, 0]

    # The engine's logprobs equal one full forward over the expanded ids with the merged images.
    fresh = full_forward_logprobs(vlm_model, sample.token_ids, pad, merged, 1)
    for t, mask in enumerate(sample.loss_mask[1:], start=1):
        if mask:
            assert abs(sample.rollout_logprobs[t] - fresh[t - 1]) < 1e-4, t
