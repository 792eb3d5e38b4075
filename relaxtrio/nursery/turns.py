"""The values that cross from the API to the generation side for one model turn.

The API layer normalizes any protocol into a :class:`TurnRequest`; the Session hands it to a
:class:`TurnHandler` (implemented in :mod:`relaxtrio.rollout.turns`, which owns the engine
client, the chat-template compiler and the parsers) together with a :class:`TurnContext`, and
renders the :class:`TurnResult` back in the request's protocol.

The handler never sees the Session itself: :class:`TurnContext` is everything a turn may read
(the Session's id, position and forest, the rollout step) and call (the generation gate,
in-flight tracking for partial rollout), and a token count reads only the Session's forest.
This module imports nothing else of the nursery.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol

import attrs
import trio

from ..forest import Conversation, SessionForest

FinishReason = Literal["stop", "length", "tool_calls"]


@attrs.frozen(kw_only=True)
class TurnRequest:
    """One normalized model request.

    Attributes:
        conversation: canonical messages, tools and template kwargs (complete history).
        max_new_tokens: the request's turn limit in tokens, or None for the configured default.
        stop: stop strings for this turn.
        seed: sampling seed for this turn, or None.
        logprobs: whether the client asked for generated-token logprobs.
        protocol: the API the request came in on (for logs and metadata only).
    """

    conversation: Conversation
    max_new_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    protocol: Literal["chat", "responses", "messages"] = "chat"

    def sampling_digest(self) -> str:
        """A digest of what the turn samples with besides its state: token limit, stop
        strings, seed and whether logprobs are returned (the protocol only shapes the reply).

        Two requests from one state with equal digests ask for the same generation
        (:mod:`relaxtrio.nursery.retries`).
        """
        fields = [self.max_new_tokens, list(self.stop), self.seed, self.logprobs]
        return hashlib.sha256(json.dumps(fields).encode()).hexdigest()


@attrs.frozen(kw_only=True)
class TokenLogprob:
    """A client-facing logprob entry: the decoded token text and its rollout logprob."""

    token: str
    logprob: float


@attrs.frozen(kw_only=True)
class TurnResult:
    """The committed answer of one turn.

    Attributes:
        message: the canonical assistant message exactly as committed to the SessionForest
            (content without the EOS/stop text, optional reasoning_content and tool_calls).
        finish_reason: ``stop``, ``length`` or ``tool_calls`` (tool_calls iff calls were returned).
        prompt_tokens: tokens of the lineage prefix the turn was generated from.
        completion_tokens: generated tokens of the turn (across resumed attempts).
        request_id: relaxtrio's id of the turn (also the engine rid prefix).
        state_hash: state hash of the committed response node.
        logprobs: per generated token, when the request asked for them; else None.
        stop_sequence: the request's stop string that ended the turn (``finish_reason`` is
            ``stop``), or None when the turn ended otherwise (EOS, length, tool calls).
    """

    message: dict[str, Any]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    request_id: str
    state_hash: str
    logprobs: tuple[TokenLogprob, ...] | None = None
    stop_sequence: str | None = None


class TurnContext(Protocol):
    """What one turn may read and call on the Session it serves (built by ``Session.run_turn``)."""

    @property
    def session_id(self) -> str:
        """The Session's id (request ids and errors name it)."""
        ...

    @property
    def forest(self) -> SessionForest:
        """The Session's forest: the turn matches against it and commits to it."""
        ...

    @property
    def session_index(self) -> int:
        """The Session's position in its Group (per-sample sampling seeds use it)."""
        ...

    @property
    def rollout_id(self) -> int:
        """The rollout step the Session's Group generates for now (read when committing: a turn
        parked at one step's close and resumed in the next records the next step)."""
        ...

    def mark_prepared(self) -> None:
        """Records that the turn passed every check that can fail before generation (history
        matched, observation rendered and committed, token budget within the context limit).

        A streamed request opens its stream only then (or when the turn ended), so those
        errors are plain JSON error answers instead of an in-stream failure
        (docs/agent-contract.md#buffered-sse). A handler that never calls it delays the stream
        until the turn ends.
        """
        ...

    async def wait_generation_allowed(self) -> None:
        """Waits until the Session may generate (Runtime lease, first-request barrier, no pause).

        Cancellation:
            A plain wait; nothing to clean up.
        """
        ...

    def track(self, rid: str) -> AbstractContextManager[None]:
        """Registers engine request ``rid`` as in flight while inside (step close aborts it).

        Enter it with no checkpoint after :meth:`wait_generation_allowed` returned, so a pause
        either sees the rid or closed the gate before the turn passed it.
        """
        ...

    def note_aborted(self, *, protect: bool) -> None:
        """Records that a generation came back aborted; ``protect`` makes the Session protected
        from pauses at the next resume (the request reached the abort limit)."""
        ...

    def record(self, kind: str, *fields: Any) -> None:
        """Adds ``(now, kind, *fields)`` to the Session's timeline (``attempt`` and ``turn``
        events, :mod:`relaxtrio.nursery.timeline`); cheap, never formats."""
        ...

    def note_images_as_text(self, count: int) -> None:
        """Records that ``count`` images of the turn's new observation were shown to the
        text-only policy as a text marker (``--agentic-text-only-images marker``)."""
        ...

    async def join_undelivered(self, parent_hash: str, sampling_digest: str) -> TurnResult | None:
        """The answer of an earlier generation from the same state with the same sampling
        inputs that no client received (an SDK retry), or None: then this turn samples.

        Called by the turn once its state is committed (the *attach* step). When an orphaned
        generation exists this request attaches to it: the committed answer comes back at
        once, one still generating is waited for. Otherwise the turn is registered as the
        generation of that key (docs/agent-contract.md#retries).

        Raises:
            RelaxError: the attached generation failed with it.

        Cancellation:
            Waits only when attached to a generation still running; that generation goes on.
        """
        ...


class TurnHandler(Protocol):
    """Generates and commits one turn for a Session (see :mod:`relaxtrio.rollout.turns`)."""

    async def complete(self, turn: TurnContext, request: TurnRequest) -> TurnResult:
        """Matches, renders, generates, parses and commits one turn.

        Raises:
            InvalidRequestError: a client mistake (including context length).
            BackendError: the engine failed.

        Cancellation:
            Cancelling aborts the engine request (shielded, bounded); nothing is committed.
        """
        ...

    async def count_tokens(self, forest: SessionForest, request: TurnRequest) -> int:
        """Tokens of the prompt :meth:`complete` would generate from in the Session whose
        forest is ``forest`` (the matched lineage plus the rendered new observation); nothing
        is generated and nothing is committed (the forest is only read).

        Raises:
            InvalidRequestError: a client mistake (a message the template cannot render).

        Cancellation:
            Safe to cancel at any point: nothing is committed.
        """
        ...


def call_end(exc: BaseException) -> str:
    """The ``finish`` recorded for an engine call that raised ``exc``: ``cancelled`` for a trio
    cancellation (also one that left a nursery as a group of cancellations only), else ``error``."""
    if isinstance(exc, BaseExceptionGroup):
        return "cancelled" if exc.split(trio.Cancelled)[1] is None else "error"
    return "cancelled" if isinstance(exc, trio.Cancelled) else "error"
