"""The servers the agent-API benchmarks drive, and their chat bodies.

``python benchmarks/_agent_api.py --serve full|bare|bare_hop [--engine-url URL] [--sessions N]
[--server-cpu C]`` serves, pinned to one CPU (hypercorn through ``relaxtrio.api.app.serve_api``):

* ``bare``: one quart-trio route that reads and parses the JSON body and answers a fixed chat
  completion (the framework ceiling);
* ``full``: the agent API (``create_app``) over ``N`` bare Sessions (``relaxtrio.testing.sessions``)
  with ``EngineTurnHandler`` on the engine at ``URL`` (an instant engine) and SmolLM2's tokenizer;
* ``bare_hop``: the bare route plus one ``/generate`` call to the engine at ``URL`` through
  ``EngineClient`` (a fixed 16-id prompt) before its fixed answer: the ceiling of any gateway that
  forwards each request to an engine, with none of relaxtrio's per-request work.

Its first stdout line is ``RELAXTRIO_BENCH_SERVER={"url": ..., "sessions": [...]}``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import logging
import sys
from typing import Any, Final

import _bench
import httpx
import trio

READY_PREFIX: Final = "RELAXTRIO_BENCH_SERVER="
REPLY_TEXT: Final = "Sure. Here is a short answer to your question."
BARE_REPLY: Final = {
    "id": "chatcmpl-bare", "object": "chat.completion", "created": 0, "model": "bench",
    "choices": [{"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": REPLY_TEXT}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
SYSTEM: Final = ("You are a careful assistant. Answer briefly, cite the relevant rule, and say "
                 "when you are unsure. " * 3).strip()
PARAGRAPH: Final = ("The quarterly report lists revenue by region, the headcount per team and the "
                    "open risks; the appendix repeats the figures of the previous quarter. ")
CHAT_PATH: Final = "/v1/chat/completions"
NO_TIMEOUT: Final = httpx.Timeout(None, connect=10.0)


def user(tag: str, text: str = PARAGRAPH + "What changed?") -> dict[str, str]:
    return {"role": "user", "content": f"[{tag}] {text}"}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def system() -> dict[str, str]:
    return {"role": "system", "content": SYSTEM}


def reply_ids() -> list[int]:
    """The instant engine's reply: ``REPLY_TEXT`` in SmolLM2 ids, then its end-of-turn id."""
    from relaxtrio.chat.compiler import ChatCompiler
    from relaxtrio.models import ensure_smollm2, load_tokenizer

    compiler = ChatCompiler(load_tokenizer(ensure_smollm2()))
    ids = compiler.tokenizer.encode(REPLY_TEXT, add_special_tokens=False)
    return [*ids, compiler.stop_token_ids[0]]


async def start_instant_engine(cpu: int | None) -> _bench.Child:
    """An instant engine process answering ``REPLY_TEXT``, pinned to ``cpu``."""
    ids = await trio.to_thread.run_sync(reply_ids)
    cmd = [_bench.python(), "-m", "relaxtrio.testing.instant_engine", "--eos-id", str(ids[-1]),
           "--reply-ids", *map(str, ids)]
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    return await _bench.Child.start(cmd)


async def start_server(kind: str, *, cpu: int | None, engine_url: str | None = None,
                       num_sessions: int = 0, env: dict[str, str] | None = None,
                       timeline_events: int | None = None) -> _bench.Child:
    """A server process of this module (see the module docstring); ``value`` is its JSON line.
    ``timeline_events``: each Session's timeline bound (0: recording off; None: the default)."""
    cmd = [_bench.python(), __file__, "--serve", kind, "--sessions", str(num_sessions)]
    if timeline_events is not None:
        cmd += ["--timeline-events", str(timeline_events)]
    if cpu is not None:
        cmd += ["--server-cpu", str(cpu)]
    if engine_url is not None:
        cmd += ["--engine-url", engine_url]
    return await _bench.Child.start(cmd, READY_PREFIX, timeout_s=600, env=env)


def server_info(server: _bench.Child) -> tuple[str, list[str]]:
    """(agent base URL without the trailing slash, Session ids) of a started server."""
    info = json.loads(server.value)
    return info["url"].rstrip("/"), info["sessions"]


async def post_chat(pool: Any, url: str, session_id: str | None, body: dict[str, Any]) -> Any:
    """One chat completion through ``pool`` (a ``ConnectionPool``); the reply's message.

    Raises:
        RuntimeError: any status other than 200.
    """
    headers = {"Authorization": f"Bearer {session_id or 'none'}"}
    response = await pool.request("POST", url + CHAT_PATH, headers=headers, json=body,
                                  transport_timeout=NO_TIMEOUT)
    if response.status_code != 200:
        raise RuntimeError(f"HTTP {response.status_code}: {response.content[:300]!r}")
    return response.json()["choices"][0]["message"]


# ----------------------------------------------------------------------------------- servers
def _bare_app(engine: Any = None):
    """The bare route; with ``engine`` (an ``EngineClient``), one ``/generate`` per request."""
    from quart import Response, request
    from quart_trio import QuartTrio

    app = QuartTrio("bench.bare")
    reply = json.dumps(BARE_REPLY).encode()
    hop_prompt = list(range(1, 17))
    rids = itertools.count()
    if engine is not None:
        from relaxtrio.sglang.client import SamplingParams

        sampling = SamplingParams(max_new_tokens=16)

    async def chat() -> Response:
        body = json.loads(await request.get_data(cache=False))
        assert isinstance(body, dict)
        if engine is not None:
            await engine.generate(hop_prompt, sampling, rid=f"hop-{next(rids)}#")
        return Response(reply, content_type="application/json")

    app.add_url_rule("/agentic_api" + CHAT_PATH, "chat", chat, methods=["POST"])
    return app


def _open_one_engine(engine_url: str) -> Any:
    """The client of one engine (checkouts before the one-engine client took a list of URLs)."""
    import inspect

    from relaxtrio.sglang.client import EngineClient, open_engine_client

    single = "urls" not in inspect.signature(EngineClient).parameters
    return open_engine_client(engine_url if single else [engine_url])


def _open_fleet_of_one(engine_url: str) -> Any:
    """What the turn code generates with: the fleet of one engine (older checkouts: a client)."""
    try:
        from relaxtrio.config import FleetConfig
        from relaxtrio.fleet.fleet import open_engine_fleet
    except ImportError:
        return _open_one_engine(engine_url)
    return open_engine_fleet(FleetConfig(), worker_urls=[engine_url])


async def _serve(kind: str, engine_url: str | None, num_sessions: int) -> None:
    from relaxtrio.api.app import create_app, serve_api

    try:  # like `python -m relaxtrio train` and `serve` (absent from older checkouts: --baseline-src)
        from relaxtrio._serving import freeze_startup_heap
    except ImportError:
        freeze_startup_heap = None
    async with trio.open_nursery() as nursery:
        if kind == "bare":
            if freeze_startup_heap is not None:
                freeze_startup_heap()
            url = await nursery.start(serve_api, _bare_app())
            print(READY_PREFIX + json.dumps({"url": url, "sessions": []}), flush=True)
            return
        assert engine_url is not None
        if kind == "bare_hop":
            async with _open_one_engine(engine_url) as client:
                if freeze_startup_heap is not None:
                    freeze_startup_heap()
                url = await nursery.start(serve_api, _bare_app(client))
                print(READY_PREFIX + json.dumps({"url": url, "sessions": []}), flush=True)
                await trio.sleep_forever()
        from relaxtrio.chat.compiler import ChatCompiler
        from relaxtrio.config import GenerationConfig
        from relaxtrio.models import ensure_smollm2, load_tokenizer
        from relaxtrio.nursery.session import SessionRegistry
        from relaxtrio.rollout.turns import EngineTurnHandler
        from relaxtrio.testing.sessions import serve_bare_sessions

        compiler = ChatCompiler(load_tokenizer(ensure_smollm2()))
        registry = SessionRegistry()
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(_open_fleet_of_one(engine_url))
            handler = EngineTurnHandler(client=client, compiler=compiler,
                                        config=GenerationConfig(max_response_tokens=64))
            sessions = await nursery.start(serve_bare_sessions, registry, num_sessions)
            app = create_app(registry, handler, model_name="bench")
            if freeze_startup_heap is not None:
                freeze_startup_heap()
            url = await nursery.start(serve_api, app)
            print(READY_PREFIX + json.dumps(
                {"url": url, "sessions": [s.session_id for s in sessions]}), flush=True)
            await trio.sleep_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a server for the agent-API benchmarks")
    parser.add_argument("--serve", choices=["bare", "bare_hop", "full"], required=True)
    parser.add_argument("--engine-url")
    parser.add_argument("--sessions", type=int, default=0)
    parser.add_argument("--server-cpu", type=int, default=None)
    parser.add_argument("--timeline-events", type=int, default=None,
                        help="each Session's timeline bound (0: recording off)")
    args = parser.parse_args(argv)
    _bench.pin(args.server_cpu)
    if args.timeline_events is not None:
        from relaxtrio.nursery.timeline import set_default_capacity

        set_default_capacity(args.timeline_events)
    logging.basicConfig(level=logging.ERROR)
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(functools.partial(_serve, args.serve, args.engine_url, args.sessions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
