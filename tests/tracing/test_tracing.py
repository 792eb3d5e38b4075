"""OpenTelemetry spans: the span tree of one step over the in-process embedded engine (real agent
processes, real HTTP), the W3C ``traceparent`` on engine calls, Session ids never in a span, and
nothing imported without a flag."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tests.support.fleets import open_fleet_of_one
from tests.support.pipeline import open_test_pipeline, prompts

from relaxtrio.config import GenerationConfig, RolloutConfig
from relaxtrio.sglang._http import EngineClientConfig, send_with_retries
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine
from relaxtrio.tracing import current_tracing, session_hash, trace_run

TREE = ["relaxtrio.run", "relaxtrio.step", "relaxtrio.group", "relaxtrio.session", "relaxtrio.request",
        "relaxtrio.engine_call"]


def _lineage(span, by_id) -> list[str]:
    names = []
    while span is not None:
        names.append(span.name)
        span = by_id.get(span.parent.span_id) if span.parent is not None else None
    return names[::-1]


@pytest.mark.slow  # the agents are real processes
async def test_one_step_span_tree_and_no_session_id_in_any_span(tokenizer, engine_url: str,
                                                                 tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    config = RolloutConfig(n_samples_per_prompt=2, rollout_batch_size=1, show_progress=False)
    with trio.fail_after(120):
        async with trace_run("train", exporter=exporter), open_fleet_of_one(engine_url) as fleet:
            async with open_test_pipeline(tmp_path, tokenizer, fleet, prompts([{}] * 2),
                                          config=config) as (pipeline, _):
                with current_tracing().step_span(0):
                    result = await pipeline.run_step(0)
    spans = exporter.get_finished_spans()
    by_id = {s.get_span_context().span_id: s for s in spans}
    assert len({s.get_span_context().trace_id for s in spans}) == 1  # one trace: the run
    calls = [s for s in spans if s.name == "relaxtrio.engine_call" and s.attributes["url.path"] == "/generate"]
    assert calls and all(_lineage(c, by_id) == TREE for c in calls)
    sessions = [s.session_id for g in result.groups for s in g.group.sessions]
    session_spans = [s for s in spans if s.name == "relaxtrio.session"]
    assert sorted(s.attributes["relaxtrio.session.hash"] for s in session_spans) == sorted(map(session_hash, sessions))
    assert {s.attributes["relaxtrio.session.status"] for s in session_spans} == {"completed"}
    requests = [s for s in spans if s.name == "relaxtrio.request"]
    assert len(requests) >= 2 and all(s.attributes["relaxtrio.request.completion_tokens"] > 0 for s in requests)
    for span in spans:  # the credential appears in no attribute, name or event of any span
        text = json.dumps({"name": span.name, "attributes": dict(span.attributes or {}),
                           "events": [dict(e.attributes or {}) for e in span.events]}, default=str)
        assert not any(sid in text for sid in sessions), span.name


@pytest.mark.slow  # the agents are real processes
async def test_a_session_parked_across_steps_keeps_one_span_under_the_step_that_started_it(
        tokenizer, tmp_path: Path) -> None:
    never, long_started = trio.Event(), trio.Event()
    partial_ids = tokenizer.encode("the first part", add_special_tokens=False)

    def replies(ids):
        task = int(tokenizer.decode(list(ids)).rsplit("task ", 1)[1].split("<", 1)[0].split()[0])
        if task != 1:
            return Reply(text="fine", gate=long_started)  # step 0 closes while task 1 generates
        if tuple(ids[-len(partial_ids):]) == tuple(partial_ids):
            return Reply(text=" and the rest")  # the resumed attempt
        long_started.set()
        return Reply(ids=partial_ids + [5, 6, 7], finish="length", gate=never, partial=len(partial_ids))

    engine = ScriptedEngine(tokenizer=tokenizer, eos_id=tokenizer.eos_token_id, replies=replies)
    config = RolloutConfig(n_samples_per_prompt=1, rollout_batch_size=1, over_sampling_batch_size=2,
                           partial_rollout=True, show_progress=False)
    exporter = InMemorySpanExporter()
    with trio.fail_after(60):
        async with trace_run("train", exporter=exporter), open_test_pipeline(
                tmp_path, tokenizer, engine, prompts([{}, {}, {}]), config=config,
                generation=GenerationConfig(max_response_tokens=40)) as (pipeline, _):
            with current_tracing().step_span(0):
                await pipeline.run_step(0)
            [parked] = pipeline.resident_groups
            with current_tracing().step_span(1):
                await pipeline.run_step(1)
    spans = exporter.get_finished_spans()
    steps = {s.attributes["relaxtrio.rollout_id"]: s for s in spans if s.name == "relaxtrio.step"}
    [group] = [s for s in spans if s.name == "relaxtrio.group" and s.attributes["relaxtrio.group.id"] == parked.group_id]
    assert group.parent.span_id == steps[0].get_span_context().span_id  # started in step 0
    assert group.end_time > steps[1].start_time  # finished in step 1
    key = session_hash(parked.sessions[0].session_id)
    [session] = [s for s in spans if s.name == "relaxtrio.session" and s.attributes["relaxtrio.session.hash"] == key]
    [request] = [s for s in spans if s.name == "relaxtrio.request" and s.parent.span_id == session.get_span_context().span_id]
    # The agent's one request stayed open across the abort: one span through both steps.
    assert request.start_time < steps[0].end_time < steps[1].start_time < request.end_time
    assert request.attributes["relaxtrio.request.finish_reason"] == "stop"
    sessions = [s for s in spans if s.name == "relaxtrio.session"]
    assert len(sessions) == 3 and all(s.end_time is not None for s in sessions)


class _RecordingTransport(httpx.AsyncHTTPTransport):
    """httpx's real transport, keeping the headers of each request it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[httpx.Headers] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.headers.append(request.headers)
        return await super().handle_async_request(request)


async def test_engine_calls_carry_traceparent_only_inside_a_traced_span(engine_url: str) -> None:
    exporter = InMemorySpanExporter()
    transport = _RecordingTransport()
    config = EngineClientConfig(max_attempts=1)
    timeout = httpx.Timeout(30.0)
    async with httpx.AsyncClient(transport=transport) as client, trace_run("serve", exporter=exporter):
        await send_with_retries(client, "GET", engine_url, "/health", None, httpx_timeout=timeout, config=config)
        with current_tracing().request_span("a-secret-session-id", {}):
            response = await send_with_retries(client, "GET", engine_url, "/health", None,
                                               httpx_timeout=timeout, config=config)
    assert response.status_code == 200
    assert "traceparent" not in transport.headers[0]  # no active span: a health poll, not traced
    [call] = [s for s in exporter.get_finished_spans() if s.name == "relaxtrio.engine_call"]
    ctx = call.get_span_context()
    assert transport.headers[1]["traceparent"] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    assert int(ctx.trace_flags) & 1  # sampled
    [request] = [s for s in exporter.get_finished_spans() if s.name == "relaxtrio.request"]
    assert call.parent.span_id == request.get_span_context().span_id
    assert request.attributes["relaxtrio.session.hash"] == session_hash("a-secret-session-id")


async def test_otel_file_writes_one_json_line_per_span(tmp_path: Path) -> None:
    path = tmp_path / "spans" / "run.jsonl"
    async with trace_run("rollout", file=path):
        with current_tracing().step_span(7):
            pass
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [r["name"] for r in rows] == ["relaxtrio.step", "relaxtrio.run"]
    step, run = rows
    assert step["parent_span_id"] == run["span_id"] and step["trace_id"] == run["trace_id"]
    assert step["attributes"] == {"relaxtrio.rollout_id": 7} and run["parent_span_id"] is None


def test_session_hash_is_a_short_sha256() -> None:
    assert session_hash("abc") == "ba7816bf8f01cfea"
    assert len(session_hash("x" * 100)) == 16


_PROBE = """
import sys, argparse
from relaxtrio.cli.main import main
from relaxtrio.cli.train_flags import add_train_parser
from relaxtrio.cli.train_config import train_config
import relaxtrio.run.driver, relaxtrio.tools.serve, relaxtrio.tracing
parser = argparse.ArgumentParser()
add_train_parser(parser.add_subparsers(dest="command"))
train_config(parser.parse_args(["train"]))
print(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))
"""


@pytest.mark.slow  # a fresh interpreter
def test_nothing_imports_opentelemetry_without_a_flag() -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_otel_flags_of_train_rollout_and_serve(tmp_path: Path) -> None:
    import argparse

    from relaxtrio.cli.tool_flags import add_serve_parser, serve_config
    from relaxtrio.cli.train_config import train_config
    from relaxtrio.cli.train_flags import add_train_parser
    from relaxtrio.config import TracingConfig

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    add_train_parser(sub)
    add_train_parser(sub, name="rollout")
    add_serve_parser(sub)
    url, path = "http://127.0.0.1:4318/v1/traces", tmp_path / "spans.jsonl"
    train = train_config(parser.parse_args(["train", "--otel-endpoint", url]))
    assert train.tracing == TracingConfig(endpoint=url)
    rollout = train_config(parser.parse_args(["rollout", "--otel-file", str(path)]))
    assert rollout.tracing == TracingConfig(file=path) and rollout.tracing.enabled
    serve = serve_config(parser.parse_args(["serve", "--otel-file", str(path), "--otel-endpoint", url]))
    assert serve.tracing == TracingConfig(endpoint=url, file=path)
    assert not train_config(parser.parse_args(["train"])).tracing.enabled


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--otel-file", "{tmp}", "not a directory"),
    ("--otel-file", "", "not a directory"),
    ("--otel-file", "{tmp}/a_file/spans.jsonl", "is not a directory"),
    ("--otel-endpoint", "notaurl", "an http(s) URL"),
])
def test_bad_otel_flags_are_config_errors_naming_the_flag(tmp_path: Path, flag: str, value: str,
                                                           message: str) -> None:
    import argparse

    from relaxtrio import ConfigError
    from relaxtrio.cli.tool_flags import tracing_config

    (tmp_path / "a_file").write_text("x")
    args = argparse.Namespace(otel_endpoint=None, otel_file=None)
    setattr(args, flag[2:].replace("-", "_"),
            Path(value.format(tmp=tmp_path)) if flag == "--otel-file" else value)
    with pytest.raises(ConfigError, match=rf"^{flag} .*{re.escape(message)}"):
        tracing_config(args)
