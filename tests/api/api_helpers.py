"""Helpers for API tests: a scripted turn handler, the real turn pipeline on a scripted engine,
request and SSE helpers. Live Sessions and served apps are shared: tests/support."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.config import GenerationConfig
from relaxtrio.forest import ResponseNode, export_samples
from relaxtrio.nursery.session import Session
from relaxtrio.nursery.turns import TurnRequest, TurnResult
from relaxtrio.nursery.turns import TurnContext
from relaxtrio.rollout.turns import EngineTurnHandler
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine

CHAT = "/agentic_api/v1/chat/completions"
RESPONSES = "/agentic_api/v1/responses"
MESSAGES = "/agentic_api/v1/messages"
ENDPOINTS = {"chat": CHAT, "responses": RESPONSES, "messages": MESSAGES}


@attrs.define(eq=False)
class ScriptedHandler:
    """Answers every turn with ``reply`` (after waiting on ``gate`` when set) and records calls.

    ``first_request`` is set when the first turn arrives and ``first_completion`` when the first
    turn has been answered, so tests wait on events instead of polling the lists.
    """

    reply: Callable[[TurnRequest], dict] = lambda request: {"role": "assistant", "content": "ok"}
    gate: trio.Event | None = None
    requests: list[TurnRequest] = attrs.field(factory=list)
    completed: list[str] = attrs.field(factory=list)
    error: Exception | None = None
    finish_reason: str | None = None
    first_request: trio.Event = attrs.field(factory=trio.Event)
    first_completion: trio.Event = attrs.field(factory=trio.Event)

    async def complete(self, turn: TurnContext, request: TurnRequest) -> TurnResult:
        self.requests.append(request)
        self.first_request.set()
        turn.mark_prepared()  # like the real handler: checks done, the stream may open
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        message = self.reply(request)
        self.completed.append(turn.session_id)
        self.first_completion.set()
        finish = self.finish_reason or ("tool_calls" if message.get("tool_calls") else "stop")
        return TurnResult(
            message=message,
            finish_reason=finish,
            prompt_tokens=7,
            completion_tokens=3,
            request_id=f"{turn.session_id}:t1",
            state_hash="0" * 64,
        )


def scripted_pipeline(
    compiler: ChatCompiler,
    replies: list[Reply] | Callable[[tuple[int, ...]], Reply],
    *,
    reasoning_parser: str | None = "qwen3",
    max_response_tokens: int = 256,
) -> tuple[EngineTurnHandler, ScriptedEngine]:
    """The real turn pipeline (match → render → generate → parse → commit) on a scripted engine."""
    engine = ScriptedEngine(tokenizer=compiler.tokenizer, eos_id=compiler.tokenizer.eos_token_id, replies=replies)
    config = GenerationConfig(max_response_tokens=max_response_tokens, tool_call_parser="hermes",
                              reasoning_parser=reasoning_parser)
    return EngineTurnHandler(client=engine, compiler=compiler, config=config), engine  # type: ignore[arg-type]


def assert_one_lineage(session: Session, responses: int) -> None:
    """Every turn extended the previous one: one leaf, ``responses`` response nodes on its path."""
    leaves = session.forest.leaves()
    assert len(leaves) == 1, f"expected one lineage, got {len(leaves)} leaves"
    lineage = session.forest.lineage(leaves[0])
    assert sum(isinstance(node, ResponseNode) for node in lineage) == responses
    [sample] = export_samples(session.forest, None)
    assert sum(sample.loss_mask) > 0


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """Hermes-style tool-call text, as a model would write it."""
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


async def post(app, path: str, body: Any = None, *, token: str | None = None, raw: bytes | None = None,
               headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
    """POSTs through the quart test client; returns (status, parsed JSON or text, headers)."""
    all_headers = {"content-type": "application/json", **(headers or {})}
    if token is not None:
        all_headers["Authorization"] = f"Bearer {token}"
    data = raw if raw is not None else json.dumps(body).encode()
    async with app.test_app() as test_app:
        response = await test_app.test_client().post(path, data=data, headers=all_headers)
        text = await response.get_data(as_text=True)
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = text
    return response.status_code, parsed, response.headers


@attrs.frozen
class SseFrame:
    """One SSE frame: a comment, or an event with optional name and its data text."""

    comment: str | None = None
    event: str | None = None
    data: str | None = None

    def json(self) -> Any:
        assert self.data is not None
        return json.loads(self.data)


def parse_sse(data: bytes | str) -> list[SseFrame]:
    """Splits an SSE stream into frames (strict: every frame ends with a blank line)."""
    text = data.decode() if isinstance(data, bytes) else data
    assert text.endswith("\n\n") or not text, f"stream does not end with a blank line: {text[-40:]!r}"
    frames = []
    for block in text.split("\n\n")[:-1]:
        lines = block.split("\n")
        if all(line.startswith(":") for line in lines):
            frames.append(SseFrame(comment=lines[0][1:].strip()))
            continue
        event = None
        data_lines = []
        for line in lines:
            field, _, value = line.partition(": ")
            if field == "event":
                event = value
            elif field == "data":
                data_lines.append(value)
            else:
                raise AssertionError(f"unexpected SSE line {line!r}")
        frames.append(SseFrame(event=event, data="\n".join(data_lines)))
    return frames


def events(frames: Sequence[SseFrame]) -> list[SseFrame]:
    """Frames that carry data (no comments, no pings)."""
    return [f for f in frames if f.data is not None and f.event != "ping"]
