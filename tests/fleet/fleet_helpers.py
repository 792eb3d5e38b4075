"""Helpers of the fleet tests."""

from __future__ import annotations

import httpx
import pytest

from tests.support.waits import wait_until
from relaxtrio.sglang.wire import SamplingParams

# When a peer dies while httpx sends a request, httpx leaves the request body's async generator
# unfinished and the garbage collector reports it; that is httpx's bookkeeping, not a leak of ours.
IGNORE_DROPPED_BODY = [
    pytest.mark.filterwarnings(
        "ignore:Async generator 'httpx._content.ByteStream.__aiter__':ResourceWarning"),
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object ByteStream.__aiter__"
        ":pytest.PytestUnraisableExceptionWarning"),
]


def long_sampling() -> SamplingParams:
    """A generation long enough to be caught running (the tiny model never stops by itself)."""
    return SamplingParams(max_new_tokens=3000, temperature=1.0, ignore_eos=True)


async def wait_running(url: str, num_running: int, *, timeout_s: float = 60.0) -> None:
    """Wait until the engine at ``url`` decodes at least ``num_running`` requests and has
    generated a few tokens since this call."""
    start: list[int] = []

    async def decoding() -> bool:
        state = (await http.get(f"{url}/server_info")).json()["internal_states"][0]
        start[:] = start or [state["num_generated_tokens"]]
        return (state["num_running_reqs"] >= num_running
                and state["num_generated_tokens"] >= start[0] + 2 * num_running)

    async with httpx.AsyncClient() as http:
        await wait_until(decoding, timeout_s=timeout_s, what=f"{num_running} running request(s) on {url}")
