"""The embedded engine's prefix cache: follow-up turns prefill only their new ids, same logprobs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import trio

from relaxtrio.engine._prefix_cache import PrefixCache
from relaxtrio.engine.server import EngineConfig, load_engine, serve_engine_state
from relaxtrio.sglang.client import SamplingParams, open_engine_client

PROMPT = [1, 87, 555, 201, 57, 74, 271, 321, 294, 284, 446, 295, 2, 201, 1, 67, 312, 691, 697, 201]
OBSERVATION = [2, 201, 1, 400, 401, 402, 403, 2, 201, 1, 67]
GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)


async def _two_turns(nursery: trio.Nursery, model_dir: Path, cache_tokens: int):
    config = EngineConfig(model_path=model_dir, prefix_cache_tokens=cache_tokens)
    state = await load_engine(config)
    url = await nursery.start(serve_engine_state, state, config)
    async with open_engine_client(url) as client:
        with trio.fail_after(60):
            first = await client.generate(PROMPT, GREEDY, rid="t1")
            follow_up = PROMPT + list(first.output_ids) + OBSERVATION
            second = await client.generate(follow_up, GREEDY, rid="t2")
    return first, second, follow_up, state.scheduler.statistics()


async def test_a_follow_up_turn_prefills_only_its_new_ids_with_equal_logprobs(
    nursery: trio.Nursery, tiny_model_dir: Path, reference_logprobs: Callable
) -> None:
    first_c, second_c, follow_up, stats = await _two_turns(nursery, tiny_model_dir, 4096)
    first_n, second_n, follow_up_n, stats_n = await _two_turns(nursery, tiny_model_dir, 0)
    assert first_c.output_ids == first_n.output_ids and follow_up == follow_up_n
    assert second_c.output_ids == second_n.output_ids
    # the finished first turn left input + output[:-1] in the cache (its last id was never fed)
    assert first_c.cached_tokens == 0
    assert second_c.cached_tokens == len(PROMPT) + len(first_c.output_ids) - 1
    assert stats.num_prefix_hit_tokens == second_c.cached_tokens
    assert stats.num_prefill_tokens == len(PROMPT) + len(follow_up)
    assert second_n.cached_tokens == 0 and stats_n.num_prefix_hit_tokens == 0
    diff = max(abs(a - b) for a, b in zip(second_c.output_logprobs, second_n.output_logprobs, strict=True))
    assert diff < 1e-5
    ref = reference_logprobs(follow_up, list(second_c.output_ids))
    assert max(abs(a - b) for a, b in zip(second_c.output_logprobs, ref, strict=True)) < 1e-4


async def test_samples_of_one_prompt_share_its_prefill_and_weight_updates_flush(
    nursery: trio.Nursery, tiny_model_dir: Path
) -> None:
    config = EngineConfig(model_path=tiny_model_dir, prefix_cache_tokens=4096, max_running_requests=4)
    state = await load_engine(config)
    url = await nursery.start(serve_engine_state, state, config)
    results = []
    async with open_engine_client(url) as client:
        with trio.fail_after(60):
            async with trio.open_nursery() as calls:
                for i in range(3):
                    calls.start_soon(_generate_into, results, client, f"s{i}")
            # admitted together: the first prefill stored the prompt, the others reused P - 1 ids
            assert sorted(r.cached_tokens for r in results) == [0, len(PROMPT) - 1, len(PROMPT) - 1]
            assert state.scheduler.statistics().num_prefix_cache_tokens > 0
            await client.update_weights_from_disk(str(tiny_model_dir), weight_version="v2")
            assert state.scheduler.statistics().num_prefix_cache_tokens == 0
            again = await client.generate(PROMPT, GREEDY, rid="s9")
            assert again.cached_tokens == 0
            await client.flush_cache()
            assert state.scheduler.statistics().num_prefix_cache_tokens == 0


async def _generate_into(results: list, client, rid: str) -> None:
    results.append(await client.generate(PROMPT, GREEDY, rid=rid))


def _kv(n: int, fill: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return [torch.full((1, 2, n, 4), fill)], [torch.full((1, 2, n, 4), -fill)]


def test_prefix_cache_lookup_insert_and_eviction() -> None:
    cache = PrefixCache(max_tokens=10)
    assert cache.lookup([1, 2, 3]) is None
    cache.insert([1, 2, 3], *_kv(3, 1.0))
    hit = cache.lookup([1, 2, 3])  # the last id must be computed: at most P - 1
    assert hit is not None and hit.length == 2 and hit.keys[0].shape == (1, 2, 2, 4)
    hit = cache.lookup([1, 2, 9, 9])
    assert hit is not None and hit.length == 2
    assert cache.lookup([7, 2, 3]) is None
    cache.insert([1, 2, 3, 4, 5], *_kv(5, 2.0))  # covers [1, 2, 3]: that entry goes
    assert len(cache) == 1 and cache.num_tokens == 5
    cache.insert([1, 2], *_kv(2, 3.0))  # adds nothing over [1, 2, 3, 4, 5]
    assert len(cache) == 1
    hit = cache.lookup([1, 2, 3, 4, 5, 6])
    assert hit is not None and hit.length == 5 and float(hit.keys[0][0, 0, 0, 0]) == 2.0
    cache.insert([8, 8, 8, 8, 8, 8], *_kv(6, 4.0))  # 11 > 10 tokens: the least recent goes
    assert len(cache) == 1 and cache.num_tokens == 6 and cache.lookup([1, 2, 3]) is None
    cache.insert(list(range(11)), *_kv(11, 5.0))  # larger than the whole cache: not kept
    assert cache.num_tokens == 6
    assert cache.num_hit_tokens == 2 + 2 + 5
    cache.clear()
    assert len(cache) == 0 and cache.num_tokens == 0
    disabled = PrefixCache(max_tokens=0)
    disabled.insert([1, 2], *_kv(2, 1.0))
    assert len(disabled) == 0

