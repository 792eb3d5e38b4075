"""The vLLM engine client against a real vLLM server on SmolLM2 (one server per session).

Tests that change the server's state (pause, weights) put it back before they end. Waiting for
a request to be under way polls the server's ``/metrics`` counter of generated tokens: a real
server offers no event for it (a request aborted or paused before it starts shows nothing).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

import httpx
import pytest
import torch
import trio
from tests.vllm.vllm_helpers import CONTEXT_TOKENS, VllmServer

from relaxtrio import ContextLengthExceededError, EngineRejectedError
from relaxtrio.forest import WeightSpan
from relaxtrio.models import load_model
from relaxtrio.sglang._replies import GenerateResult
from relaxtrio.train.weight_store import DiskWeightStore
from relaxtrio.vllm.client import SamplingParams, VllmEngineClient
from relaxtrio.vllm.connections import open_vllm_client
from relaxtrio.vllm.info import context_token_limit, logprobs_mode_problem

pytestmark = pytest.mark.slow

# "You are a helpful assistant." as a SmolLM2 system turn, then the assistant header.
PROMPT: Final = (1, 9690, 198, 2683, 359, 253, 5356, 11173, 30, 2, 198, 1, 520, 9531, 198)
LONG_TOKENS: Final = 1000  # long enough that it is never over before the test acts on it
_GENERATED: Final = re.compile(r"^vllm:generation_tokens_total\{[^}]*\} ([0-9.e+]+)$", re.MULTILINE)


async def generated_tokens(url: str) -> float:
    """The server's count of tokens generated so far (all requests)."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(url + "/metrics")).text
    return sum(float(value) for value in _GENERATED.findall(text))


async def wait_generating(url: str, since: float, at_least: int = 4) -> None:
    """Return once the server has generated ``at_least`` tokens more than ``since``."""
    # Another process's progress shows only in its counters: no event to wait on.
    while await generated_tokens(url) < since + at_least:  # noqa: ASYNC110
        await trio.sleep(0.2)


def covers(spans: Sequence[WeightSpan], num_ids: int) -> bool:
    """The spans tile ``[0, num_ids)`` in order."""
    edges = [0, *(edge for span in spans for edge in (span.start, span.end)), num_ids]
    return all(a == b for a, b in zip(edges[::2], edges[1::2], strict=True))


def greedy(max_new_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, **kwargs)


async def test_generate_token_ids_with_rollout_logprobs(vllm_server: VllmServer):
    with trio.fail_after(120):
        async with open_vllm_client(vllm_server.url) as client:
            result = await client.generate(PROMPT, greedy(8), rid="gen-greedy")
            stop_id = result.output_ids[2]
            stopped = await client.generate(PROMPT, greedy(8, stop_token_ids=(stop_id,)),
                                            rid="gen-stop")
            info = await client.server_info()
    assert isinstance(result, GenerateResult)
    assert len(result.output_ids) == len(result.output_logprobs) == 8
    assert (result.finish_type, result.finish_matched) == ("length", 8)
    assert result.prompt_tokens == len(PROMPT) and result.completion_tokens == 8
    assert all(lp <= 0 for lp in result.output_logprobs)
    assert result.weight_versions == (WeightSpan(result.weight_version, 0, 8),)
    cut = result.output_ids.index(stop_id) + 1
    assert stopped.output_ids == result.output_ids[:cut]  # greedy: the same ids, up to the stop id
    assert (stopped.finish_type, stopped.finish_matched) == ("stop", stop_id)
    assert info["engine"] == "vllm" and info["version"] == "0.32.0"
    assert context_token_limit(info) == CONTEXT_TOKENS
    assert logprobs_mode_problem(info) is None


async def test_prefix_cache_hits_are_reported(vllm_server: VllmServer):
    prompt = [100 + (i * 7919) % 40000 for i in range(400)]  # in no other test
    with trio.fail_after(120):
        async with open_vllm_client(vllm_server.url) as client:
            first = await client.generate(prompt, greedy(2), rid="cache-first")
            second = await client.generate(prompt, greedy(2), rid="cache-second")
    assert first.cached_tokens == 0
    assert 0 < second.cached_tokens < len(prompt)  # whole blocks of the prompt


async def test_abort_returns_the_partial_output(vllm_server: VllmServer):
    results: list[GenerateResult] = []
    with trio.fail_after(180):
        async with open_vllm_client(vllm_server.url) as client:
            async def long_generation() -> None:
                results.append(await client.generate(
                    PROMPT, greedy(LONG_TOKENS, ignore_eos=True), rid="abort-me"))

            before = await generated_tokens(vllm_server.url)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(long_generation)
                await wait_generating(vllm_server.url, before)
                await client.abort("abort-me")
            again = await client.generate(PROMPT, greedy(4), rid="abort-me")  # the rid is free
    (partial,) = results
    assert partial.finish_type == "abort"
    assert 0 < len(partial.output_ids) < LONG_TOKENS
    assert len(partial.output_logprobs) == len(partial.output_ids)
    assert covers(partial.weight_versions, len(partial.output_ids))
    assert partial.output_ids[:4] == again.output_ids  # greedy: the same start


async def _pause_during_generation(client: VllmEngineClient, url: str, mode: str,
                                   max_new_tokens: int) -> tuple[GenerateResult, bool]:
    """Pause ``mode`` while a greedy generation runs; return its result and whether the server
    said it was paused."""
    results: list[GenerateResult] = []

    async def generation() -> None:
        results.append(await client.generate(PROMPT, greedy(max_new_tokens, ignore_eos=True),
                                             rid=f"pause-{mode}"))

    before = await generated_tokens(url)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(generation)
        await wait_generating(url, before)
        await client.pause_generation(mode)
        paused = await client.is_paused()
        await client.continue_generation()
    return results[0], paused


async def test_pause_keep_abort_wait_and_resume(vllm_server: VllmServer):
    with trio.fail_after(300):
        async with open_vllm_client(vllm_server.url) as client:
            kept, kept_paused = await _pause_during_generation(client, vllm_server.url, "keep", 48)
            aborted, _ = await _pause_during_generation(client, vllm_server.url, "abort",
                                                        LONG_TOKENS)
            waited, _ = await _pause_during_generation(client, vllm_server.url, "wait", 24)
            assert not await client.is_paused()
            assert await client.health()
    assert kept_paused
    assert (kept.finish_type, len(kept.output_ids)) == ("length", 48)  # nothing lost
    assert aborted.finish_type == "abort" and 0 < len(aborted.output_ids) < LONG_TOKENS
    assert len(aborted.output_logprobs) == len(aborted.output_ids)
    assert (waited.finish_type, len(waited.output_ids)) == ("length", 24)


@pytest.fixture(scope="module")
def perturbed_weights(tmp_path_factory: pytest.TempPathFactory, vllm_server: VllmServer) -> str:
    """SmolLM2 with noise added to every weight, written as a trainer weight version."""
    model = load_model(vllm_server.model_dir)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=generator))
    store = DiskWeightStore(tmp_path_factory.mktemp("weights"))
    return store.write(model, "v1")


async def test_weight_reload_keeps_requests_and_labels_tokens(
        vllm_server: VllmServer, perturbed_weights: str):
    results: list[GenerateResult] = []
    with trio.fail_after(300):
        async with open_vllm_client(vllm_server.url) as client:
            base = await client.generate(PROMPT, greedy(8), rid="weights-base")

            async def in_flight() -> None:
                results.append(await client.generate(PROMPT, greedy(64, ignore_eos=True),
                                                     rid="weights-in-flight"))

            try:
                before = await generated_tokens(vllm_server.url)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(in_flight)
                    await wait_generating(vllm_server.url, before)
                    await client.pause_generation("keep")
                    await client.update_weights_from_disk(perturbed_weights, weight_version="v1")
                    await client.continue_generation()
                after = await client.generate(PROMPT, greedy(8), rid="weights-after")
                info = await client.model_info()
            finally:
                await client.continue_generation()
                await client.update_weights_from_disk(str(vllm_server.model_dir),
                                                      weight_version="default")
            restored = await client.generate(PROMPT, greedy(8), rid="weights-restored")
    (straddling,) = results
    assert straddling.finish_type == "length" and len(straddling.output_ids) == 64
    versions = [span.version for span in straddling.weight_versions]
    assert versions == ["default", "v1"] and covers(straddling.weight_versions, 64)
    assert after.output_ids != base.output_ids
    assert after.weight_versions == (WeightSpan("v1", 0, 8),)
    assert info["weight_version"] == "v1"
    assert restored.output_ids == base.output_ids


async def test_refused_requests_are_the_requests_fault(vllm_server: VllmServer):
    with trio.fail_after(120):
        async with open_vllm_client(vllm_server.url) as client:
            with pytest.raises(EngineRejectedError) as rejected:
                await client.generate(PROMPT, SamplingParams(max_new_tokens=4, temperature=-1.0),
                                      rid="bad-temperature")
            with pytest.raises(ContextLengthExceededError):
                await client.generate([1] * CONTEXT_TOKENS, greedy(1), rid="too-long")
            clamped = await client.generate([1] * (CONTEXT_TOKENS - 3), greedy(50, ignore_eos=True),
                                            rid="clamped")
            assert await client.health()
    assert rejected.value.status_code == 400
    assert rejected.value.engine_url == vllm_server.url
    assert "temperature" in str(rejected.value)
    assert (clamped.finish_type, len(clamped.output_ids)) == ("length", 3)

