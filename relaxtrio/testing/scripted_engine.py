"""A scripted engine: an in-process stand-in for the fleet the turn code generates with
(:class:`~relaxtrio.fleet.fleet.EngineFleet`).

It replays given replies (text or ids) with fixed logprobs, so tests can force shapes a tiny
random model will not produce (tool calls, reasoning, aborts at a chosen token). A reply may wait
on a gate, so tests can cancel or abort at every stage. End-to-end tests use the real engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from relaxtrio.forest import WeightSpan
from relaxtrio.sglang.client import GenerateResult, SamplingParams


@attrs.define(kw_only=True)
class Reply:
    """One scripted generation.

    Attributes:
        text: generated text (encoded with the tokenizer), used when ``ids`` is None.
        ids: generated ids (the stop id is appended when ``finish == "stop"`` and missing).
        finish: ``stop`` or ``length``.
        gate: when set, the reply waits for it (an abort ends the wait with partial output).
        partial: how many ids an abort returns before the gate opened.
        stop_string: with ``finish == "stop"``, the stop string the reply ends on (reported as
            ``finish_matched``; no stop id is appended), as an engine reports a stop-string hit.
    """

    text: str | None = None
    ids: Sequence[int] | None = None
    finish: str = "stop"
    gate: trio.Event | None = None
    partial: int = 0
    stop_string: str | None = None


@attrs.define(eq=False, kw_only=True)
class ScriptedEngine:
    """Answers ``generate`` calls from ``replies`` in order (or from a function of the input).

    Attributes:
        tokenizer: encodes reply text (no special tokens added).
        eos_id: stop id appended to ``stop`` replies.
        replies: list consumed in order, or ``fn(input_ids) -> Reply``.
        logprob: the logprob reported for every generated id.
        weight_version: reported version label.
        calls: every (input_ids, sampling, rid) seen.
        aborted: rids that were aborted.
    """

    tokenizer: Any
    eos_id: int
    replies: list[Reply] | Callable[[tuple[int, ...]], Reply] = attrs.field(factory=list)
    logprob: float = -0.25
    weight_version: str = "default"
    calls: list[tuple[tuple[int, ...], SamplingParams, str]] = attrs.field(factory=list)
    aborted: list[str] = attrs.field(factory=list)
    _abort_events: dict[str, trio.Event] = attrs.field(factory=dict)

    def _next(self, input_ids: tuple[int, ...]) -> Reply:
        if callable(self.replies):
            return self.replies(input_ids)
        if not self.replies:
            raise AssertionError("scripted engine ran out of replies")
        return self.replies.pop(0)

    def _ids(self, reply: Reply) -> list[int]:
        ids = list(reply.ids) if reply.ids is not None else list(
            self.tokenizer.encode(reply.text or "", add_special_tokens=False))
        if reply.finish == "stop" and reply.stop_string is None and (not ids or ids[-1] != self.eos_id):
            ids.append(self.eos_id)
        return ids

    def _result(self, ids: list[int], finish: str, prompt_len: int,
                stop_string: str | None = None) -> GenerateResult:
        matched: Any = {"stop": stop_string or self.eos_id, "length": len(ids), "abort": None}[finish]
        return GenerateResult(
            output_ids=ids,
            output_logprobs=[self.logprob] * len(ids),
            finish_type=finish,
            finish_matched=matched,
            prompt_tokens=prompt_len,
            completion_tokens=len(ids),
            cached_tokens=0,
            weight_version=self.weight_version,
            weight_versions=[WeightSpan(self.weight_version, 0, len(ids))] if ids else [],
            text=self.tokenizer.decode(ids),
            meta_info={},
        )

    async def generate(self, input_ids: Sequence[int], sampling: SamplingParams, *, rid: str,
                       return_logprob: bool = True, **_: Any) -> GenerateResult:
        ids_in = tuple(input_ids)
        self.calls.append((ids_in, sampling, rid))
        reply = self._next(ids_in)
        ids = self._ids(reply)
        if reply.gate is not None:
            aborted = trio.Event()
            self._abort_events[rid] = aborted
            async with trio.open_nursery() as nursery:
                async def wait(event: trio.Event) -> None:
                    await event.wait()
                    nursery.cancel_scope.cancel()
                nursery.start_soon(wait, reply.gate)
                nursery.start_soon(wait, aborted)
            del self._abort_events[rid]
            if aborted.is_set() and not reply.gate.is_set():
                return self._result(ids[: reply.partial], "abort", len(ids_in))
        limit = sampling.max_new_tokens
        if limit is not None and len(ids) > limit:
            return self._result(ids[:limit], "length", len(ids_in))
        return self._result(ids, reply.finish, len(ids_in), reply.stop_string)

    async def abort(self, rid: str) -> None:
        self.aborted.append(rid)
        event = self._abort_events.get(rid)
        if event is not None:
            event.set()

    async def abort_all(self) -> None:
        for rid in list(self._abort_events):
            await self.abort(rid)
