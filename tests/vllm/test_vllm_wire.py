"""The vLLM client without a vLLM server: request translation, answers a vLLM 0.32.0 server gave
(recorded in recorded_replies.json), error mapping and an unreachable engine. (What the package
may import: tests/test_layering.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import pytest
import trio

from relaxtrio import (
    ContextLengthExceededError,
    EngineRejectedError,
    EngineUnavailableError,
    InvalidRequestError,
)
from relaxtrio.forest import WeightSpan
from relaxtrio.sglang._http import EngineClientConfig
from relaxtrio.vllm.client import SamplingParams
from relaxtrio.vllm.connections import open_vllm_client
from relaxtrio.vllm.info import context_token_limit, logprobs_mode_problem
from relaxtrio.vllm.wire import (
    DEFAULT_MAX_NEW_TOKENS,
    error_from_response,
    parse_generate_response,
    server_request_id,
    vllm_sampling_params,
)

RECORDED: Final[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "recorded_replies.json").read_text(encoding="utf-8"))
URL: Final = "http://127.0.0.1:1"


def parse(name: str, **kwargs: Any):
    return parse_generate_response(RECORDED[name], return_logprob=True, weight_version="v0", **kwargs)


def test_sampling_params_are_renamed_for_vllm():
    wire = vllm_sampling_params(SamplingParams(
        max_new_tokens=7, min_new_tokens=2, sampling_seed=3, no_stop_trim=True, temperature=0.7,
        top_p=1.0, top_k=-1, stop_token_ids=(5,), ignore_eos=False, logit_bias={"9": -1.0},
        stream_interval=4), return_logprob=True)
    assert wire == {"max_tokens": 7, "min_tokens": 2, "seed": 3, "include_stop_str_in_output": True,
                    "temperature": 0.7, "top_p": 1.0, "top_k": -1, "stop_token_ids": [5],
                    "ignore_eos": False, "logit_bias": {"9": -1.0}, "logprobs": 0,
                    "detokenize": False}


def test_sampling_defaults_and_stop_strings():
    assert vllm_sampling_params(SamplingParams(), return_logprob=False) == {
        "max_tokens": DEFAULT_MAX_NEW_TOKENS, "detokenize": False}
    with_stop = vllm_sampling_params(SamplingParams(stop="\n"), return_logprob=False)
    assert with_stop["stop"] == "\n" and "detokenize" not in with_stop  # stop strings need text


@pytest.mark.parametrize(("params", "field"), [
    (SamplingParams(stop_regex="a+"), "stop_regex"),
    (SamplingParams(json_schema="{}"), "json_schema"),
    (SamplingParams(custom_params={"a": 1}), "custom_params"),
    (SamplingParams(n=2), "n"),
])
def test_fields_vllm_cannot_honour_are_refused_by_name(params: SamplingParams, field: str):
    with pytest.raises(InvalidRequestError) as refused:
        vllm_sampling_params(params, return_logprob=True)
    assert refused.value.param == f"sampling_params.{field}"


def test_abort_key_is_vllms_prefixed_id():
    assert server_request_id("s1-t3#") == "generate-tokens-s1-t3#"


def test_recorded_length_stop_and_eos_answers():
    length, stop, eos = parse("length"), parse("stop_token"), parse("eos")
    assert (length.finish_type, length.finish_matched) == ("length", 4)
    assert len(length.output_ids) == len(length.output_logprobs) == length.completion_tokens == 4
    assert length.prompt_tokens == 10 and length.cached_tokens is None and length.text == ""
    assert length.weight_versions == (WeightSpan("default", 0, 4),)
    assert length.weight_version == "default"
    assert (stop.finish_type, stop.finish_matched, stop.output_ids[-1]) == ("stop", 4093, 4093)
    assert (eos.finish_type, eos.finish_matched) == ("stop", eos.output_ids[-1])  # the EOS id
    assert "choices" not in length.meta_info and length.meta_info["request_id"] == "generate-tokens-rec-length"


def test_recorded_abort_keeps_partial_output():
    aborted = parse("abort")
    assert aborted.finish_type == "abort" and aborted.finish_matched is None
    assert 0 < len(aborted.output_ids) == len(aborted.output_logprobs)
    assert aborted.weight_versions == (WeightSpan("default", 0, len(aborted.output_ids)),)


def test_an_answer_without_tokens_reports_the_last_known_version():
    body = json.loads(json.dumps(RECORDED["abort"]))
    body["choices"][0].update(token_ids=None, logprobs=None, weight_versions=None)
    aborted = parse_generate_response(body, return_logprob=True, weight_version="v7")
    assert (aborted.output_ids, aborted.weight_version, aborted.weight_versions) == ((), "v7", ())


@pytest.mark.parametrize("breakage", ["one logprob less", "logprob of another id", "NaN logprob",
                                      "unknown finish", "span past the ids", "two choices"])
def test_broken_answers_are_engine_failures(breakage: str):
    body = json.loads(json.dumps(RECORDED["length"]))
    choice = body["choices"][0]
    rows = choice["logprobs"]["content"]
    if breakage == "one logprob less":
        rows.pop()
    elif breakage == "logprob of another id":
        rows[1]["token_id"] += 1
    elif breakage == "NaN logprob":
        rows[0]["logprob"] = float("nan")
    elif breakage == "unknown finish":
        choice["finish_reason"] = "tool_calls"
    elif breakage == "span past the ids":
        choice["weight_versions"][0]["end"] = 99
    else:
        body["choices"].append(choice)
    with pytest.raises(EngineUnavailableError):
        parse_generate_response(body, return_logprob=True, weight_version="v0")


def _error(name: str) -> tuple[int, bytes]:
    status, body = RECORDED["errors"][name]
    return status, json.dumps(body).encode()


def test_recorded_errors_say_whose_fault_they_are():
    status, content = _error("bad_temperature")
    rejected = error_from_response(status, content, engine_url=URL, path="/inference/v1/generate")
    assert isinstance(rejected, EngineRejectedError) and rejected.status_code == 400
    assert "temperature must be non-negative" in str(rejected)
    status, content = _error("prompt_too_long")
    too_long = error_from_response(status, content, engine_url=URL, path="/inference/v1/generate")
    assert isinstance(too_long, ContextLengthExceededError)
    status, content = _error("empty_prompt")
    assert isinstance(error_from_response(status, content, engine_url=URL, path="/x"), EngineRejectedError)
    failed = error_from_response(500, b'{"error": {"message": "boom"}}', engine_url=URL, path="/x")
    assert isinstance(failed, EngineUnavailableError) and failed.status_code == 500


def test_info_readers():
    assert context_token_limit({"context_length": 2048}) == 2048
    assert context_token_limit({}) is None
    assert logprobs_mode_problem({"logprobs_mode": "processed_logprobs"}) is None
    assert "--logprobs-mode processed_logprobs" in logprobs_mode_problem({"logprobs_mode": "raw_logprobs"})


async def test_an_unreachable_engine_is_unavailable_and_unhealthy():
    config = EngineClientConfig(max_attempts=2, retry_sleep_s=0.0, connect_timeout_s=2.0)
    with trio.fail_after(30):
        async with open_vllm_client(URL, config=config) as client:
            assert not await client.health()
            with pytest.raises(EngineUnavailableError) as unavailable:
                await client.generate([1, 2], SamplingParams(max_new_tokens=2), rid="r")
            with pytest.raises(EngineUnavailableError):
                await client.update_weights_from_disk("/weights/v1", weight_version="v1")
            with pytest.raises(InvalidRequestError):
                await client.generate([1], SamplingParams(), rid="img", image_data=["data:x"])
            nothing = await client.generate([1, 2], SamplingParams(max_new_tokens=0), rid="zero")
    assert unavailable.value.engine_url == URL
    assert (nothing.output_ids, nothing.finish_type, nothing.weight_version) == ((), "length", "default")
