"""/generate of the embedded engine: response shapes, finishes, logprobs, batching, sampling."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
import torch
import trio

PROMPT = [1, 87, 555, 201, 57, 74, 271, 321, 294, 284, 446, 295, 2, 201, 1, 67, 312, 691, 697, 201]
TOP_KEYS = {"text", "output_ids", "meta_info"}
META_KEYS = {
    "id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions",
    "reasoning_tokens", "completion_tokens", "cached_tokens", "weight_versions", "e2e_latency",
    "response_sent_to_client_ts",
}
LOGPROB_KEYS = {"input_token_logprobs", "output_token_logprobs", "output_token_logprobs_length"}


async def generate(http: httpx.AsyncClient, input_ids: list[int], **sampling: object) -> dict:
    with trio.fail_after(60):
        r = await http.post(
            "/generate",
            json={"input_ids": input_ids, "sampling_params": sampling, "return_logprob": True},
        )
    assert r.status_code == 200, r.text
    return r.json()


def _ids_and_logprobs(body: dict) -> tuple[list[int], list[float]]:
    rows = body["meta_info"]["output_token_logprobs"]
    assert [row[1] for row in rows] == body["output_ids"]
    assert all(row[2] is None for row in rows)
    return body["output_ids"], [row[0] for row in rows]


@pytest.fixture(scope="module")
def eos_prompt(tiny_model: torch.nn.Module, tokenizer) -> list[int]:
    """A prompt whose greedy continuation is one ordinary token and then EOS (found by search)."""
    eos = tokenizer.eos_token_id
    vocab = tiny_model.config.vocab_size
    for k in range(1, len(PROMPT)):
        prefix = torch.tensor(PROMPT[:k]).repeat(vocab, 1)  # (V, k)
        with torch.inference_mode():
            first_in = torch.cat([prefix, torch.arange(vocab).unsqueeze(1)], dim=1)  # (V, k+1)
            first = tiny_model(input_ids=first_in).logits[:, -1].argmax(-1)  # (V,)
            second_in = torch.cat([first_in, first.unsqueeze(1)], dim=1)  # (V, k+2)
            second = tiny_model(input_ids=second_in).logits[:, -1].argmax(-1)  # (V,)
        hits = ((second == eos) & (first != eos)).nonzero().flatten().tolist()
        if hits:
            return PROMPT[:k] + [hits[0]]
    raise AssertionError("no prompt with a two-token EOS continuation for this seed")


async def test_response_has_sglang_shape(http: httpx.AsyncClient) -> None:
    body = await generate(http, PROMPT, max_new_tokens=5, temperature=0.0, ignore_eos=True)
    assert set(body) == TOP_KEYS
    meta = body["meta_info"]
    assert set(meta) == META_KEYS | LOGPROB_KEYS
    assert meta["finish_reason"] == {"type": "length", "length": 5}
    assert meta["prompt_tokens"] == len(PROMPT)
    assert meta["completion_tokens"] == len(body["output_ids"]) == 5
    assert meta["output_token_logprobs_length"] == 5
    assert meta["input_token_logprobs"] == []
    assert meta["cached_tokens"] == 0
    assert meta["weight_version"] == "default"
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 5}]
    assert len(meta["id"]) == 32  # a uuid4 hex when no rid is given
    assert isinstance(meta["e2e_latency"], float) and meta["e2e_latency"] > 0
    assert isinstance(body["text"], str)


async def test_without_logprobs_has_no_logprob_keys(http: httpx.AsyncClient) -> None:
    r = await http.post("/generate", json={"input_ids": PROMPT, "rid": "plain",
                                           "sampling_params": {"max_new_tokens": 2}})
    meta = r.json()["meta_info"]
    assert set(meta) == META_KEYS and meta["id"] == "plain"


async def test_eos_is_in_output_ids_and_trimmed_from_text(
    http: httpx.AsyncClient, eos_prompt: list[int], tokenizer
) -> None:
    eos = tokenizer.eos_token_id
    body = await generate(http, eos_prompt, max_new_tokens=10, temperature=0.0)
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos}
    assert len(body["output_ids"]) == 2 and body["output_ids"][-1] == eos
    assert body["text"] == tokenizer.decode(body["output_ids"][:1])
    kept = await generate(http, eos_prompt, max_new_tokens=10, temperature=0.0,
                          no_stop_trim=True, skip_special_tokens=False)
    assert kept["text"].endswith("<|im_end|>")
    # Length is checked before stop ids (SGLang order): EOS as the last allowed token says length.
    last = await generate(http, eos_prompt, max_new_tokens=2, temperature=0.0)
    assert last["output_ids"][-1] == eos
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
    # ignore_eos runs past it; min_new_tokens masks it until 4 tokens exist.
    ignored = await generate(http, eos_prompt, max_new_tokens=4, temperature=0.0, ignore_eos=True)
    assert ignored["meta_info"]["finish_reason"]["type"] == "length"
    masked = await generate(http, eos_prompt, max_new_tokens=8, temperature=0.0, min_new_tokens=4)
    assert eos not in masked["output_ids"][:3]


async def test_stop_token_ids_and_stop_strings(http: httpx.AsyncClient, tokenizer) -> None:
    free = await generate(http, PROMPT, max_new_tokens=12, temperature=0.0, ignore_eos=True)
    ids = free["output_ids"]
    k = next(i for i in range(3, 12) if ids[i] not in ids[:i])
    by_id = await generate(http, PROMPT, max_new_tokens=12, temperature=0.0, stop_token_ids=[ids[k]])
    assert by_id["output_ids"] == ids[: k + 1]
    assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[k]}

    text = tokenizer.decode(ids)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop and stop not in text[: len(text) // 2]
    by_str = await generate(http, PROMPT, max_new_tokens=12, temperature=0.0, stop=[stop, "\u00a7\u00a7"])
    assert by_str["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    out = by_str["output_ids"]
    assert out == ids[: len(out)]
    assert stop in tokenizer.decode(out) and stop not in tokenizer.decode(out[:-1])
    assert by_str["text"] == text[: text.index(stop)]
    untrimmed = await generate(http, PROMPT, max_new_tokens=12, temperature=0.0, stop=stop,
                               no_stop_trim=True)
    assert untrimmed["text"] == text[: text.index(stop) + len(stop)]


@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
async def test_logprobs_equal_a_full_forward(
    http: httpx.AsyncClient, reference_logprobs: Callable, temperature: float
) -> None:
    body = await generate(http, PROMPT, max_new_tokens=24, temperature=temperature,
                          ignore_eos=True, sampling_seed=7)
    ids, logprobs = _ids_and_logprobs(body)
    ref = reference_logprobs(PROMPT, ids, temperature if temperature > 0 else 1.0)
    assert max(abs(a - b) for a, b in zip(logprobs, ref, strict=True)) < 1e-4


async def test_concurrent_requests_are_batched_and_exact(
    http: httpx.AsyncClient, reference_logprobs: Callable
) -> None:
    prompts = [PROMPT[:3], PROMPT, PROMPT[:11], PROMPT + PROMPT[:7]]
    bodies: dict[int, dict] = {}

    async def one(i: int) -> None:
        bodies[i] = await generate(http, prompts[i], max_new_tokens=16 + 4 * i, temperature=0.8,
                                   sampling_seed=i, ignore_eos=True)

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(one, i)
    for i, prompt in enumerate(prompts):
        ids, logprobs = _ids_and_logprobs(bodies[i])
        assert len(ids) == 16 + 4 * i
        ref = reference_logprobs(prompt, ids, 0.8)
        assert max(abs(a - b) for a, b in zip(logprobs, ref, strict=True)) < 1e-4
    info = (await http.get("/server_info")).json()
    assert info["internal_states"][0]["max_batch_size_seen"] >= 2


async def test_seeded_sampling_is_reproducible(http: httpx.AsyncClient) -> None:
    kw = dict(max_new_tokens=20, temperature=1.0, ignore_eos=True)
    a = await generate(http, PROMPT, sampling_seed=123, **kw)
    b = await generate(http, PROMPT, sampling_seed=123, **kw)
    c = await generate(http, PROMPT, sampling_seed=124, **kw)
    assert a["output_ids"] == b["output_ids"]
    assert a["output_ids"] != c["output_ids"]
    g1 = await generate(http, PROMPT, max_new_tokens=20, temperature=0.0, ignore_eos=True)
    g2 = await generate(http, PROMPT, max_new_tokens=20, temperature=0.0, ignore_eos=True)
    assert g1["output_ids"] == g2["output_ids"]


async def test_truncation_and_bias_options(http: httpx.AsyncClient) -> None:
    greedy = await generate(http, PROMPT, max_new_tokens=10, temperature=0.0, ignore_eos=True)
    for option in ({"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}):
        body = await generate(http, PROMPT, max_new_tokens=10, temperature=1.0, ignore_eos=True,
                              sampling_seed=3, **option)
        assert body["output_ids"] == greedy["output_ids"], option
        # Logprobs are taken before truncation, so they are not 0 although one token was kept.
        assert all(row[0] < 0 for row in body["meta_info"]["output_token_logprobs"])
    biased = await generate(http, PROMPT, max_new_tokens=5, temperature=0.0, ignore_eos=True,
                            logit_bias={"77": 100.0})
    assert biased["output_ids"] == [77] * 5
    penalized = await generate(http, PROMPT, max_new_tokens=5, temperature=0.0, ignore_eos=True,
                               logit_bias={"77": 100.0}, repetition_penalty=2.0,
                               frequency_penalty=2.0, presence_penalty=2.0)
    assert penalized["output_ids"][0] == 77


async def test_text_prompt_and_logprob_extras(http: httpx.AsyncClient, tokenizer) -> None:
    r = await http.post("/generate", json={
        "text": "hello world", "sampling_params": {"max_new_tokens": 3, "temperature": 0},
        "return_logprob": True, "top_logprobs_num": 2, "return_text_in_logprobs": True,
        "return_prompt_token_ids": True, "session_id": "s1", "some_future_key": {"x": 1},
    })
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["prompt_token_ids"] == tokenizer.encode("hello world")
    meta = body["meta_info"]
    assert meta["prompt_tokens"] == len(body["prompt_token_ids"])
    for row, top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True):
        assert row[2] == tokenizer.decode([row[1]])
        assert len(top) == 2 and top[0][1] == row[1] and top[0][0] == pytest.approx(row[0])


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"seed": 1}, "unknown field `seed`, expected one of `max_new_tokens`"),
        ({"max_tokens": 1}, "unknown field `max_tokens`"),
        ({"max_new_tokens": 16.0}, "invalid type: floating point `16.0`"),
        ({"temperature": "hot"}, "invalid type"),
    ],
)
async def test_schema_gate_rejects_with_string_error(
    http: httpx.AsyncClient, sampling: dict, message: str
) -> None:
    r = await http.post("/generate", json={"input_ids": PROMPT, "sampling_params": sampling})
    assert r.status_code == 400
    assert isinstance(r.json()["error"], str) and message in r.json()["error"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input_ids": PROMPT, "sampling_params": {"top_p": 0}}, "top_p must be in (0, 1], got 0.0."),
        ({"input_ids": PROMPT, "sampling_params": {"temperature": -1}},
         "temperature must be a non-negative finite number, got -1.0."),
        ({"input_ids": PROMPT, "sampling_params": {"top_k": 0}}, "top_k must be -1"),
        ({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"input_ids": PROMPT, "sampling_params": {"n": 2}}, "n > 1 is not supported"),
        ({"input_ids": []}, "input_ids cannot be empty."),
        ({"sampling_params": {}}, "Either text, input_ids or input_embeds should be provided."),
        ({"input_ids": [[1, 2], [3]]}, "batch form"),
        ({"input_ids": [1, 99999]}, "outside the vocabulary"),
    ],
)
async def test_value_errors_use_the_message_envelope(
    http: httpx.AsyncClient, body: dict, message: str
) -> None:
    r = await http.post("/generate", json=body)
    assert r.status_code == 400
    assert message in r.json()["error"]["message"]


async def test_a_body_that_is_not_utf8_json_is_refused_as_such(http: httpx.AsyncClient) -> None:
    """As the agent API: a UTF-16 / UTF-32 / non-UTF-8 body is "not valid UTF-8 JSON" (in the
    route's own envelope), never a UTF-16 codec error; a UTF-8 BOM is still accepted."""
    text = json.dumps({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}})
    for raw in (b"\xff\xfe\xfa", text.encode("utf-16"), text.encode("utf-32"), b'{"text": "\xff"}'):
        r = await http.post("/generate", content=raw)
        assert r.status_code == 400
        assert r.json()["error"].startswith("invalid JSON body: the body is not valid UTF-8 JSON")
        r = await http.post("/abort_request", content=raw)
        assert r.status_code == 400 and "the body is not valid UTF-8 JSON" in r.json()["message"]
        assert "utf-16" not in r.text.lower()
    with trio.fail_after(60):
        r = await http.post("/generate", content=b"\xef\xbb\xbf" + text.encode())
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 1


async def test_context_limits(nursery: trio.Nursery, tiny_model_dir) -> None:
    from relaxtrio.engine.server import EngineConfig, serve_engine

    url = await nursery.start(serve_engine, EngineConfig(model_path=tiny_model_dir, context_length=64))
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        body = await generate(http, [5] * 50, temperature=0.0, ignore_eos=True)  # no max_new_tokens
        assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 12}  # 63-50-1
        cases = [
            ([5] * 64, {}, "The input (64 tokens) is longer than the model's context length (64 tokens)."),
            ([5] * 50, {"max_new_tokens": 14},
             "Requested token count exceeds the model's maximum context length of 64 tokens. "
             "You requested a total of 64 tokens: 50 tokens from the input messages and 14 tokens"),
            ([5] * 58, {}, "Input length (58 tokens) exceeds the maximum allowed length (58 tokens)."),
        ]
        for ids, sampling, message in cases:
            r = await http.post("/generate", json={"input_ids": ids, "sampling_params": sampling})
            assert r.status_code == 400
            assert r.json()["error"]["message"].startswith(message)
        models = (await http.get("/v1/models")).json()
        assert models["data"][0]["max_model_len"] == 64


async def test_long_prompt_body(http: httpx.AsyncClient, reference_logprobs: Callable) -> None:
    prompt = (PROMPT * 200)[:3500]  # ~20 KB of JSON
    body = await generate(http, prompt, max_new_tokens=2, temperature=0.0, ignore_eos=True)
    ids, logprobs = _ids_and_logprobs(body)
    assert body["meta_info"]["prompt_tokens"] == 3500
    assert max(abs(a - b) for a, b in zip(logprobs, reference_logprobs(prompt, ids), strict=True)) < 1e-4
