"""The SGLang client (one engine) against a real embedded engine, plus MockTransport for 5xx /
transport faults."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import trio

from relaxtrio import (
    BackendTimeoutError,
    ContextLengthExceededError,
    EngineRejectedError,
    EngineUnavailableError,
)
from relaxtrio.engine.scheduler import Scheduler
from relaxtrio.engine.server import EngineConfig, serve_engine
from relaxtrio.forest import WeightSpan
from relaxtrio.sglang.client import (
    CONTEXT_LENGTH_MARKERS,
    EngineClientConfig,
    SamplingParams,
    context_token_limit,
    open_engine_client,
)

PROMPT = [1, 87, 555, 201, 57, 74, 271, 321, 294, 284, 446, 295, 2, 201, 1, 67, 312, 691, 697, 201]
LONG = SamplingParams(max_new_tokens=3000, temperature=0.0, ignore_eos=True)
FAST = EngineClientConfig(retry_sleep_s=0.0, max_attempts=3)


def test_sampling_params_to_json_drops_none() -> None:
    params = SamplingParams(max_new_tokens=8, temperature=0.0, stop=("a", "b"), stop_token_ids=(2,))
    assert params.to_json() == {"max_new_tokens": 8, "temperature": 0.0, "stop": ["a", "b"],
                                "stop_token_ids": [2]}
    assert SamplingParams().to_json() == {}


async def test_generate_against_the_embedded_engine(
    engine_url: str, reference_logprobs: Callable
) -> None:
    async with open_engine_client(engine_url) as client:
        with trio.fail_after(30):
            result = await client.generate(
                PROMPT, SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True), rid="c1"
            )
        assert len(result.output_ids) == len(result.output_logprobs) == 6
        assert result.finish_type == "length" and result.finish_matched == 6
        assert result.prompt_tokens == len(PROMPT) and result.completion_tokens == 6
        assert result.cached_tokens == 0 and result.weight_version == "default"
        assert result.weight_versions == (WeightSpan("default", 0, 6),)
        assert result.meta_info["id"] == "c1"
        ref = reference_logprobs(PROMPT, list(result.output_ids))
        assert max(abs(a - b) for a, b in zip(result.output_logprobs, ref, strict=True)) < 1e-4
        assert await client.health() is True
        assert (await client.model_info())["weight_version"] == "default"
        assert (await client.server_info())["context_length"] == 4096


async def test_context_token_limit_leaves_a_budget_the_engine_accepts(nursery: trio.Nursery,
                                                                      tiny_model_dir: Path) -> None:
    # A lineage clamped to the limit (prompt + budget == limit) is generated in full; at the bare
    # context length (what the clamp used before) it is the "Requested token count exceeds" refusal.
    url = await nursery.start(serve_engine, EngineConfig(model_path=tiny_model_dir, context_length=64))
    async with open_engine_client(url, config=FAST) as client:
        limit = context_token_limit(await client.server_info())
        assert limit == 62
        prompt = [5] * 40
        result = await client.generate(prompt, SamplingParams(max_new_tokens=limit - len(prompt), ignore_eos=True),
                                       rid="fits")
        assert len(result.output_ids) == limit - len(prompt)
        with pytest.raises(ContextLengthExceededError, match="Requested token count exceeds"):
            await client.generate(prompt, SamplingParams(max_new_tokens=64 - len(prompt)), rid="over")
    assert context_token_limit({"max_req_input_len": 4090}) == 4090
    assert context_token_limit({}) is None


async def test_engine_errors_are_mapped(nursery: trio.Nursery, tiny_model_dir: Path) -> None:
    url = await nursery.start(serve_engine, EngineConfig(model_path=tiny_model_dir, context_length=64))
    async with open_engine_client(url, config=FAST) as client:
        with pytest.raises(ContextLengthExceededError, match="longer than the model's context"):
            await client.generate([5] * 64, SamplingParams(), rid="x1")
        with pytest.raises(ContextLengthExceededError, match="Requested token count exceeds"):
            await client.generate([5] * 50, SamplingParams(max_new_tokens=20), rid="x2")
        with pytest.raises(ContextLengthExceededError, match="exceeds the maximum allowed length"):
            await client.generate([5] * 60, SamplingParams(), rid="x3")
        with pytest.raises(EngineRejectedError, match="n > 1") as info:
            await client.generate([5, 6], SamplingParams(n=2), rid="x4")
        assert info.value.status_code == 400 and info.value.engine_url == url
        with pytest.raises(EngineRejectedError, match="top_p must be in"):
            await client.generate([5, 6], SamplingParams(top_p=0.0), rid="x5")
        with pytest.raises(EngineRejectedError) as info:
            await client.update_weights_from_disk("/nonexistent/dir", weight_version="v9")
        assert info.value.status_code == 400


async def test_abort_uses_the_control_pool_while_generations_fill_theirs(
    engine_url: str, scheduler: Scheduler
) -> None:
    """One generation connection, two generations; abort must not queue behind them.

    See docs/client-quirks.md#control-calls-behind-generations.
    """
    results = {}
    returned = {"g1": trio.Event(), "g2": trio.Event()}
    async with open_engine_client(engine_url, max_generation_connections=1) as client:

        async def run(rid: str) -> None:
            results[rid] = await client.generate(PROMPT, LONG, rid=rid)
            returned[rid].set()

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, "g1")
                await scheduler.wait_statistics(lambda s: s.num_running_reqs >= 1)
                nursery.start_soon(run, "g2")  # waits for the single generation connection
                await client.abort("g1")
                await returned["g1"].wait()
                # g2 is running once a token was generated after g1's abort (the step that
                # dropped g1 generated none).
                tokens = scheduler.statistics().num_generated_tokens
                await scheduler.wait_statistics(
                    lambda s: s.num_running_reqs >= 1 and s.num_generated_tokens > tokens)
                await client.abort_all()
    assert results["g1"].finish_type == "abort" and results["g2"].finish_type == "abort"
    assert len(results["g1"].output_ids) == len(results["g1"].output_logprobs) > 0


async def test_control_calls_reach_the_engine(engine_url: str, tiny_model_dir: Path) -> None:
    async with open_engine_client(engine_url, config=FAST) as client:
        with trio.fail_after(30):
            assert client.url == engine_url.rstrip("/")
            assert await client.health_status() == 200
            await client.pause_generation("retract")
            async with httpx.AsyncClient() as http:
                assert (await http.get(engine_url + "/ready")).status_code == 503
                await client.update_weights_from_disk(str(tiny_model_dir), weight_version="w1")
                await client.continue_generation()
                assert (await http.get(engine_url + "/ready")).status_code == 200
            assert await client.weight_version() == "w1"
            await client.update_weight_version("w2")
            assert (await client.model_info())["weight_version"] == "w2"
            await client.close_session("s1")
            await client.flush_cache()


async def test_health_status_says_refused_apart_from_an_answer() -> None:
    """The fleet removes a worker whose connection is refused at once (``__cause__`` a
    ``ConnectError``), and counts a non-200 answer as one failed probe."""
    async with open_engine_client("http://127.0.0.1:9", config=FAST) as client:
        with pytest.raises(EngineUnavailableError) as caught:
            await client.health_status()
        assert isinstance(caught.value.__cause__, httpx.ConnectError)
        assert await client.health() is False

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404)

    async with open_engine_client("http://e", config=FAST, transport=_mock(handler)) as client:
        assert await client.health_status() == 404


def _mock(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.MockTransport:
    return httpx.MockTransport(handler)


OK_BODY = {
    "text": "x", "output_ids": [5, 2],
    "meta_info": {"id": "r", "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": 3,
                  "completion_tokens": 2, "weight_version": "v1", "extra_future_key": 1,
                  "output_token_logprobs": [[-0.5, 5, None], [-0.25, 2, None]]},
}


async def test_retries_5xx_then_succeeds(autojump_clock: trio.testing.MockClock) -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(trio.current_time())
        if len(calls) < 3:
            return httpx.Response(503, json={"object": "error", "message": "busy", "code": 503})
        return httpx.Response(200, json=OK_BODY)

    config = EngineClientConfig(retry_sleep_s=1.0, max_attempts=6)
    async with open_engine_client("http://engine", config=config, transport=_mock(handler)) as c:
        result = await c.generate([1, 2, 3], SamplingParams(), rid="r")
    assert calls == [0.0, 1.0, 2.0]
    assert result.output_ids == (5, 2) and result.output_logprobs == (-0.5, -0.25)
    assert result.finish_type == "stop" and result.finish_matched == 2
    assert result.cached_tokens is None  # missing means unknown, not 0
    assert result.weight_versions == (WeightSpan("v1", 0, 2),)  # older servers: one span


async def test_retries_are_bounded(autojump_clock: trio.testing.MockClock) -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(500, text="Internal Server Error")

    config = EngineClientConfig(retry_sleep_s=1.0, max_attempts=4)
    async with open_engine_client("http://engine", config=config, transport=_mock(handler)) as c:
        with pytest.raises(EngineUnavailableError, match="HTTP 500") as info:
            await c.abort("r1")
    assert len(calls) == 4 and trio.current_time() == 3.0
    assert info.value.status_code == 500 and info.value.engine_url == "http://engine"


async def test_client_errors_are_not_retried(autojump_clock: trio.testing.MockClock) -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(404, json={"detail": "Not Found"})

    async with open_engine_client("http://e", config=FAST, transport=_mock(handler)) as c:
        with pytest.raises(EngineRejectedError, match="Not Found"):
            await c.server_info()
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("exc", "expected"),
    [(httpx.ConnectError("refused"), EngineUnavailableError),
     (httpx.RemoteProtocolError("reset"), EngineUnavailableError),
     (httpx.ReadTimeout("slow"), BackendTimeoutError)],
)
async def test_transport_failures(
    autojump_clock: trio.testing.MockClock, exc: Exception, expected: type
) -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise exc

    async with open_engine_client("http://e", config=FAST, transport=_mock(handler)) as c:
        with pytest.raises(expected) as info:
            await c.generate([1], SamplingParams(), rid="r")
        assert await c.health() is False
    assert isinstance(info.value.__cause__, type(exc))
    assert len(calls) == FAST.max_attempts * 2


@pytest.mark.parametrize(
    "body",
    [
        {"error": "unknown field `x`"},
        {"error": {"message": "some message"}},
        {"object": "error", "message": "some message", "type": "400", "param": None, "code": 400},
    ],
)
async def test_all_error_envelopes_are_read(body: dict) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json=body)

    async with open_engine_client("http://e", config=FAST, transport=_mock(handler)) as c:
        with pytest.raises(EngineRejectedError) as info:
            await c.generate([1], SamplingParams(), rid="r")
    message = body["error"] if isinstance(body.get("error"), str) else "some message"
    assert message in str(info.value)


@pytest.mark.parametrize("marker", CONTEXT_LENGTH_MARKERS)
@pytest.mark.parametrize("shape", ["string", "object", "openai"])
async def test_every_context_length_message_is_classified(marker: str, shape: str) -> None:
    text = f"prefix {marker} suffix"
    body = {"string": {"error": text}, "object": {"error": {"message": text}},
            "openai": {"object": "error", "message": text, "code": 400}}[shape]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json=body)

    async with open_engine_client("http://e", config=FAST, transport=_mock(handler)) as c:
        with pytest.raises(ContextLengthExceededError):
            await c.generate([1], SamplingParams(), rid="r")


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda b: b["meta_info"].update(output_token_logprobs=[[-0.5, 5, None]]),
         "1 output logprobs for 2 output ids"),
        (lambda b: b["meta_info"].update(output_token_logprobs=[[None, 5, None], [-1.0, 2, None]]),
         "no logprob"),
        (lambda b: b["meta_info"].update(output_token_logprobs=[[-0.5, 6, None], [-1.0, 2, None]]),
         "is for id 6"),
        (lambda b: b["meta_info"].pop("finish_reason"), "finish_reason"),
        (lambda b: b.update(output_ids="5 2"), "output_ids"),
        (lambda b: b["meta_info"].update(weight_versions=[{"version": "v", "start": 0, "end": 3}]),
         "weight_versions"),
    ],
)
async def test_malformed_responses_fail_loudly(mutate: Callable[[dict], object], match: str) -> None:
    body = json.loads(json.dumps(OK_BODY))
    mutate(body)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=body)

    async with open_engine_client("http://e", config=FAST, transport=_mock(handler)) as c:
        with pytest.raises(EngineUnavailableError, match=match):
            await c.generate([1], SamplingParams(), rid="r")


async def test_requests_carry_the_native_fields() -> None:
    seen: list[tuple[str, dict]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content or b"null")))
        if request.url.path == "/generate":
            return httpx.Response(200, json=OK_BODY)
        return httpx.Response(200, json={"success": True, "message": "ok"})

    async with open_engine_client("http://a", config=FAST, transport=_mock(handler)) as c:
        await c.generate([1, 2], SamplingParams(max_new_tokens=4), rid="r9", session_id="s")
        await c.continue_generation()
        await c.update_weight_version("v7")
    assert seen[0] == ("/generate", {"rid": "r9", "input_ids": [1, 2], "return_logprob": True,
                                     "sampling_params": {"max_new_tokens": 4}, "session_id": "s"})
    assert seen[1:] == [("/continue_generation", {}),
                        ("/update_weight_version", {"new_version": "v7", "abort_all_requests": False})]


async def test_a_call_on_a_closed_control_client_is_an_engine_unavailable_error() -> None:
    """httpx raises RuntimeError for a request on a closed client; a call whose owner closed the
    client (a fleet shutting down while a restarted engine is readmitted) gets the error type
    the fleet's callers handle instead."""
    import httpx
    import pytest

    from relaxtrio._errors import EngineUnavailableError
    from relaxtrio.sglang._http import EngineClientConfig, send_with_retries

    client = httpx.AsyncClient()
    await client.aclose()
    with pytest.raises(EngineUnavailableError, match="the client was closed"):
        await send_with_retries(client, "GET", "http://127.0.0.1:9", "/health", None,
                                httpx_timeout=httpx.Timeout(1.0), config=EngineClientConfig())
