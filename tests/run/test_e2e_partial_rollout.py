"""Partial rollout on the real engine: a long generation aborted at step close resumes in the
next step on new weights; the agent sees one normal response and every segment's logprobs equal
a fresh forward pass of the weights it was sampled with."""

from __future__ import annotations

import pytest

from pathlib import Path

import torch
import trio
from tests.support.pipeline import open_test_pipeline, prompts

from relaxtrio.config import GenerationConfig, RolloutConfig
from relaxtrio.engine.server import EngineConfig, load_engine, serve_engine_state
from relaxtrio.forest import ResponseNode
from relaxtrio.models import load_model, load_tokenizer
from relaxtrio.fleet.fleet import EngineFleet
from tests.support.fleets import open_fleet_of_one

pytestmark = pytest.mark.slow  # starts real processes

LONG = 400


async def _push_weights(client: EngineFleet, weights_dir: Path, version: str) -> None:
    """Loads new weights into the engine without losing in-flight generations (pause with
    retract, load, continue; shielded so the engine is never left paused)."""
    with trio.CancelScope(shield=True):
        await client.pause_generation("retract")
        try:
            await client.update_weights_from_disk(str(weights_dir), weight_version=version)
        finally:
            await client.continue_generation()


def _logprobs(model, ids: list[int], start: int, end: int) -> list[float]:
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()  # (T, V)
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[t - 1, ids[t]]) for t in range(start, end)]


async def test_partial_rollout_resumes_on_new_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    tokenizer = load_tokenizer(tiny_model_dir)
    flag = tmp_path / "short-may-finish"
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, over_sampling_batch_size=2,
                           partial_rollout=True, show_progress=False)
    generation = GenerationConfig(max_response_tokens=LONG, ignore_eos=True, seed=11)
    # Prompt 2 (started in step 1 to fill the over-sampling demand) waits forever, so step 1
    # closes on the resumed long generation.
    stream = prompts([{"mode": "wait_file", "max_tokens": 3}, {"max_tokens": LONG},
                      {"mode": "wait_file", "wait_file": str(tmp_path / "never")}])
    new_weights = tmp_path / "weights-v2"
    perturbed = load_model(tiny_model_dir)
    with torch.no_grad():
        for p in perturbed.parameters():
            p.add_(0.05 * torch.randn_like(p))
    perturbed.save_pretrained(new_weights)

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            engine_config = EngineConfig(model_path=tiny_model_dir)
            engine = await load_engine(engine_config)
            url = await nursery.start(serve_engine_state, engine, engine_config)
            async with (
                open_fleet_of_one(url) as client,
                open_test_pipeline(tmp_path, tokenizer, client, stream, config=config,
                                   generation=generation,
                                   env={"AGENT_WAIT_FILE": str(flag)}) as (pipeline, _),
            ):
                async def release_short_once_long_generates() -> None:
                    # Until the flag exists only prompt 1's long generation runs on the engine.
                    await engine.scheduler.wait_statistics(lambda s: s.num_generated_tokens >= 8)
                    flag.write_text("go")

                nursery.start_soon(release_short_once_long_generates)
                first = await pipeline.run_step(0)
                assert first.aborted_requests == 1, "the long generation was in flight at close"
                [long_group] = pipeline.resident_groups
                assert long_group.paused
                await _push_weights(client, new_weights, "v2")
                second = await pipeline.run_step(1, last=True)
            nursery.cancel_scope.cancel()

    [scored] = [g for g in second.groups if g.group is long_group]
    [sample] = scored.samples
    session = long_group.sessions[0]
    [leaf] = session.forest.leaves()
    assert isinstance(leaf, ResponseNode) and leaf.abort_count == 1
    assert session.num_requests == 1 and sample.metadata["rollout_turns"] == 1
    assert len(leaf.token_ids) == LONG  # contiguous: partial ids + resumed ids, nothing lost
    spans = [(s.version, s.start, s.end) for s in sample.weight_versions]
    assert [v for v, _, _ in spans] == ["default", "v2"]
    (_, start, cut), (_, cut2, end) = spans
    assert cut == cut2 and start == sample.prompt_length and end == len(sample.token_ids)
    assert 0 < cut - start < LONG
    ids = list(sample.token_ids)
    old = _logprobs(load_model(tiny_model_dir), ids, start, cut)
    new = _logprobs(load_model(new_weights), ids, cut, end)
    got = list(sample.rollout_logprobs)
    assert max(abs(a - b) for a, b in zip(got[start:cut], old, strict=True)) < 1e-4
    assert max(abs(a - b) for a, b in zip(got[cut:end], new, strict=True)) < 1e-4
    assert sample.loss_mask[start:end] == (1,) * (end - start)
