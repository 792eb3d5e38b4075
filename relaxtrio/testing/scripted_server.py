"""A scripted engine behind SGLang's native HTTP API, for tests that run a whole job as a process.

:class:`~relaxtrio.testing.scripted_engine.ScriptedEngine` replaces the engine client inside a
test's own trio loop. A test that runs ``python -m relaxtrio rollout`` (or ``train``) as a
subprocess needs the same thing at a URL: :func:`serve_scripted_engine` serves a
:class:`ScriptedEngine` over ``/generate`` and the control routes that the engine client calls
(``/health``, ``/model_info``, ``/server_info``, ``/abort_request``, ``/pause_generation``,
``/continue_generation``, ``/update_weights_from_disk``, ``/update_weight_version``,
``/close_session``, ``/flush_cache``), with SGLang 0.5's response shapes. The job is pointed
at it with ``--engine-url URL`` (a worker, not a gateway) and reads its tokenizer from
``--hf-checkpoint``.

Replies are chosen by :class:`Rule`: the first rule whose regular expression is found in the
decoded prompt (the whole lineage, special tokens included) answers. This is how the harness
examples' tests make a tiny model "call" the harness's own tools: the rule's text is the tool
call in the template's format (``<tool_call>{...}</tool_call>`` for hermes), encoded with the
job's tokenizer, so everything after the engine (parsers, protocols, the harness) runs for real.
A weight update is acknowledged without loading anything.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from typing import Any, Final

import attrs
import trio
from hypercorn.config import Config
from quart import Response, request
from quart_trio import QuartTrio

from relaxtrio._serving import serve_isolated
from relaxtrio.sglang.client import SamplingParams

from .scripted_engine import Reply, ScriptedEngine

__all__ = ["Rule", "rules_engine", "serve_scripted_engine"]

DEFAULT_CONTEXT_TOKENS: Final = 131072  # what /server_info reports: harness prompts are long


@attrs.frozen(kw_only=True)
class Rule:
    """One scripted answer.

    Attributes:
        match: a regular expression searched (``re.S``) in the decoded prompt.
        reply: the generated text (the stop id is appended).
        finish: ``stop`` or ``length``.
    """

    match: str
    reply: str
    finish: str = "stop"


def rules_engine(tokenizer: Any, eos_id: int, rules: Sequence[Rule], *,
                 logprob: float = -0.25) -> ScriptedEngine:
    """A :class:`ScriptedEngine` whose reply is the first rule matching the decoded prompt.

    Raises (from ``generate``):
        AssertionError: no rule matches (the request is answered with HTTP 500, and the test's
            own assertions then say which prompt was unexpected).
    """
    compiled = [(re.compile(rule.match, re.S), rule) for rule in rules]

    def choose(input_ids: tuple[int, ...]) -> Reply:
        text = tokenizer.decode(list(input_ids))
        for pattern, rule in compiled:
            if pattern.search(text):
                return Reply(text=rule.reply, finish=rule.finish)
        raise AssertionError(f"no scripted rule matches a prompt ending {text[-300:]!r}")

    return ScriptedEngine(tokenizer=tokenizer, eos_id=eos_id, replies=choose, logprob=logprob)


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, content_type="application/json")


def _generate_body(engine: ScriptedEngine, result: Any, rid: str) -> dict[str, Any]:
    finish: dict[str, Any] = {"type": result.finish_type}
    if result.finish_type == "stop":
        finish["matched"] = engine.eos_id
    elif result.finish_type == "length":
        finish["length"] = len(result.output_ids)
    ids = list(result.output_ids)
    meta = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": len(ids),
        "cached_tokens": 0,
        "weight_version": engine.weight_version,
        "weight_versions": [{"version": engine.weight_version, "start": 0, "end": len(ids)}] if ids else [],
        "output_token_logprobs": [[lp, t, None] for lp, t in zip(result.output_logprobs, ids, strict=True)],
    }
    return {"text": result.text, "output_ids": ids, "meta_info": meta}


def create_scripted_app(engine: ScriptedEngine, *, context_tokens: int = DEFAULT_CONTEXT_TOKENS) -> QuartTrio:
    """The HTTP app serving ``engine`` (see the module docstring for the routes)."""
    app = QuartTrio("relaxtrio-scripted-engine")
    started = time.time()

    @app.post("/generate")
    async def generate() -> Response:
        body = await request.get_json(force=True)
        params = body.get("sampling_params") or {}
        sampling = SamplingParams(max_new_tokens=params.get("max_new_tokens"))
        rid = str(body.get("rid") or f"scripted-{len(engine.calls)}")
        try:
            result = await engine.generate(body["input_ids"], sampling, rid=rid)
        except AssertionError as exc:
            return _json({"error": {"message": str(exc)}}, status=500)
        return _json(_generate_body(engine, result, rid))

    @app.get("/health")
    async def health() -> Response:
        return Response(b"", status=200)

    @app.get("/model_info")
    async def model_info() -> Response:
        return _json({"model_path": "scripted", "is_generation": True,
                      "weight_version": engine.weight_version, "has_image_understanding": False})

    @app.get("/server_info")
    async def server_info() -> Response:
        return _json({"model_path": "scripted", "context_length": context_tokens,
                      "max_req_input_len": context_tokens, "max_running_requests": 64,
                      "status": "ready", "startup_time": started, "version": "relaxtrio-scripted"})

    @app.post("/abort_request")
    async def abort_request() -> Response:
        body = await request.get_json(force=True)
        if body.get("abort_all"):
            await engine.abort_all()
        elif body.get("rid"):
            await engine.abort(str(body["rid"]))
        return Response(b"", status=200)

    @app.post("/update_weights_from_disk")
    async def update_weights() -> Response:
        body = await request.get_json(force=True)
        engine.weight_version = str(body.get("weight_version") or engine.weight_version)
        return _json({"success": True, "message": "scripted: nothing loaded", "num_paused_requests": 0})

    @app.post("/update_weight_version")
    async def update_weight_version() -> Response:
        body = await request.get_json(force=True)
        engine.weight_version = str(body.get("new_version") or engine.weight_version)
        return _json({"success": True, "message": ""})

    for path in ("/pause_generation", "/continue_generation", "/close_session", "/flush_cache"):
        async def ok() -> Response:
            return _json({"success": True, "message": ""})
        app.add_url_rule(path, path.strip("/"), ok, methods=["POST", "GET"])
    return app


async def serve_scripted_engine(
    engine: ScriptedEngine,
    *,
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serves ``engine`` on 127.0.0.1 (a free port) until cancelled.

    Args:
        engine: answers ``/generate`` and records every call in ``engine.calls``.
        context_tokens: the context length ``/server_info`` reports (tokens).
        task_status: receives the base URL (``http://127.0.0.1:<port>``) once listening.

    Cancellation:
        Cancelling closes the listener and every open connection; nothing is shielded.
    """
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.graceful_timeout = 1.0
    app = create_scripted_app(engine, context_tokens=context_tokens)
    async with trio.open_nursery() as nursery:
        [url] = await nursery.start(serve_isolated, app, config)
        task_status.started(url)
