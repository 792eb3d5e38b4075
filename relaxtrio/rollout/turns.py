"""One model turn, token-in/token-out: match → render the new observation → generate → parse → commit.

:class:`EngineTurnHandler` is the :class:`~relaxtrio.nursery.turns.TurnHandler` used in
production and tests alike. It never re-tokenizes history: the generation input is the
concatenation of the token ids recorded along the matched lineage, plus the ids of the new
observation rendered by the chat-template compiler (a full render at a subtree root, a
dummy-prefix delta below it).

Partial rollout: when the engine answers ``finish_reason.type == "abort"`` (a pause aborted the
request), the partial ids and logprobs are kept, the request waits for the Group's generation
gate to reopen, and the next attempt sends lineage ids + partial ids with the remaining token
budget. The agent's HTTP request stays open the whole time. The handler sees the Session only
through its :class:`~relaxtrio.nursery.turns.TurnContext` (a token count, only through its
forest): in-flight rids and aborts are recorded there, and the rollout step a response records is read from it at commit.

One turn is four steps: *attach* (match the request to the forest, commit the new observation;
a retry of a request whose answer never reached its client gets that answer here, see
:mod:`relaxtrio.nursery.retries`), *budget* (the turn's token limit), *sample* (the abort-resume loop, giving a frozen
:class:`SampledTurn`) and *commit* (parse the assistant message, add the response node).

Images (docs/canonical-contract.md#images): an observation with ``image_url`` parts is
rendered into two views (:meth:`~relaxtrio.chat.compiler.ChatCompiler.observation_ids`, then
:meth:`~relaxtrio.chat.compiler.ChatCompiler.attach_images`).
Its node stores the processor-expanded training ids, the rollout ids with one placeholder per
image, and the images plus training inputs as its ``multimodal`` payload. Every generation sends
the lineage's rollout ids together with all images of the lineage's observations, in lineage
order, as ``image_data``: the engine expands each placeholder once, so an image committed in turn
1 is never re-expanded in turn 2. Context limits and ``prompt_tokens`` use the expanded length.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs
import trio

from .._errors import BackendError, ContextLengthExceededError, EngineUnavailableError, InvalidRequestError
from ..chat.compiler import ChatCompiler, RenderedObservation
from ..chat.parsers import decode_assistant, effective_finish_type
from ..config import GenerationConfig
from ..forest import (
    Conversation,
    Match,
    ObservationNode,
    ResponseNode,
    RootNode,
    SessionForest,
    WeightSpan,
    canonical_template_kwargs,
    context_length_message,
)
from ..nursery.turns import TurnContext, TurnRequest, TurnResult, call_end
from ..sglang.wire import SamplingParams
from ._mismatch import mismatch_warning
from .client_logprobs import content_logprobs
from .lineage_images import lineage_image_urls
from .text_images import count_markers, text_only_view

if TYPE_CHECKING:
    from ..fleet.fleet import EngineFleet

log = logging.getLogger(__name__)

ABORT_GRACE_S: Final = 5.0
MAX_EMPTY_ABORTS: Final = 8
MAX_TURN_TOKENS: Final = 2**31 - 1
"""The most tokens one generation request asks an engine for: a request's limit above it (an
agent's "no limit" such as 2**64) is cut to it, as a limit above the context's room is cut to
the room, so an engine never receives an integer its request parser cannot hold."""

_Node = RootNode | ObservationNode | ResponseNode


@attrs.frozen(kw_only=True)
class SampledTurn:
    """What the abort-resume loop generated for one turn, all attempts together.

    Attributes:
        request_id: relaxtrio's id of the turn (each attempt's rid is ``<request_id>:a<n>#``).
        token_ids: ``[t]`` generated ids, partial attempts first.
        rollout_logprobs: ``[t]`` engine logprobs, ``len(rollout_logprobs) == len(token_ids)``.
        weight_versions: weight-version spans over ``token_ids``.
        finish: the effective finish type of the last attempt (never ``abort``).
        matched_stop: the stop string that ended the turn, or None.
        abort_count: attempts that came back aborted.
        generation_s: seconds spent in engine calls (trio clock).
    """

    request_id: str
    token_ids: tuple[int, ...] = attrs.field(converter=tuple)
    rollout_logprobs: tuple[float, ...] = attrs.field(converter=tuple)
    weight_versions: tuple[WeightSpan, ...] = attrs.field(converter=tuple)
    finish: str
    matched_stop: str | None
    abort_count: int
    generation_s: float


@attrs.define(eq=False, kw_only=True)
class EngineTurnHandler:
    """Generates turns with an SGLang-API engine and commits them to the Session's forest.

    Attributes:
        client: the run's fleet (one engine or many, of any protocol:
            :class:`~relaxtrio.fleet.fleet.EngineFleet`).
        compiler: chat-template compiler of the policy's tokenizer.
        config: rollout sampling settings.
        fatal_error: the first :class:`~relaxtrio.EngineUnavailableError` (unreachable, timed
            out, 5xx after retries, protocol violation); the rollout pipeline stops the run on it
            instead of dropping Group after Group. An
            :class:`~relaxtrio.EngineRejectedError` (a 4xx about one request) only fails its turn.
    """

    client: EngineFleet
    compiler: ChatCompiler
    config: GenerationConfig
    _seq: int = 0
    _fatal_error: EngineUnavailableError | None = attrs.field(default=None, init=False)
    _engine_failed: trio.Event = attrs.field(factory=trio.Event, init=False)

    @property
    def fatal_error(self) -> EngineUnavailableError | None:
        """The first engine failure (unreachable, timed out, 5xx after retries), or None; the
        rollout pipeline stops the run on it instead of dropping Group after Group."""
        return self._fatal_error

    @fatal_error.setter
    def fatal_error(self, error: EngineUnavailableError) -> None:
        self._fatal_error = error
        self._engine_failed.set()

    async def wait_engine_failed(self) -> EngineUnavailableError:
        """Waits until a turn saw the engine itself fail; returns that first failure.

        Cancellation:
            A plain wait; nothing to clean up.
        """
        await self._engine_failed.wait()
        assert self._fatal_error is not None
        return self._fatal_error

    async def abort(self, rid: str) -> None:
        """Asks the engine to stop generating ``rid`` (done when its generate call returns).

        Raises:
            BackendError: the engine could not be reached.

        Cancellation:
            A checkpoint; an abort already sent stays sent.
        """
        await self.client.abort(rid)

    def _merge_kwargs(self, conv: Conversation) -> Conversation:
        """``conv`` under the server's template kwargs, as the policy is shown it (images of a
        text-only policy as text under ``--agentic-text-only-images marker``)."""
        conv = text_only_view(conv, policy=self.config.text_only_images, has_vision=self.compiler.vision is not None)
        if not self.config.template_kwargs:
            return conv
        # Messages and tools are canonical already: only the kwargs change, so skip re-validating
        # the whole history on every request.
        kwargs = canonical_template_kwargs(conv.template_kwargs, base=self.config.template_kwargs)
        return conv.with_template_kwargs(kwargs)

    def _stop_ids(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(self.compiler.stop_token_ids + self.config.stop_token_ids))

    async def complete(self, turn: TurnContext, request: TurnRequest) -> TurnResult:
        """Matches, renders, generates, parses and commits one turn.

        Raises:
            InvalidRequestError: no messages, a message the template cannot render, or an image
                the model cannot take (text-only model, remote URL, undecodable data).
            ContextLengthExceededError: the lineage leaves no room for generation (nothing new
                is committed when the observation itself does not fit).
            BackendError: the engine failed or returned an unusable answer.

        A request with the state and sampling inputs of an earlier one whose client went away
        (an SDK retry) samples nothing: it gets that turn's answer, waiting for it if it is still
        generating (:meth:`~relaxtrio.nursery.turns.TurnContext.join_undelivered`).

        Cancellation:
            Cancelling aborts the engine request (shielded, bounded by 5 s); no response node is
            committed. An observation committed before the cancel stays (it was a valid state).
        """
        wall_start = trio.current_time()
        conv = self._merge_kwargs(request.conversation)
        parent = await self._attach(turn, conv)
        budget = self._token_budget(turn.forest, parent, request)
        turn.mark_prepared()  # every error known before generation has been raised by now
        earlier = await turn.join_undelivered(parent.state_hash, request.sampling_digest())
        if earlier is not None:  # a retry of a request whose client went away
            return earlier
        prompt_ids = turn.forest.rollout_token_ids(parent)
        images = lineage_image_urls(turn.forest, parent)
        self._seq += 1
        request_id = f"{turn.session_id}:t{self._seq:05d}"
        sampled = await self._sample(turn, request, request_id, prompt_ids, images, budget)
        done = self._commit(turn, request, conv, parent, prompt_ids, sampled, wall_start)
        turn.record("turn", request_id, wall_start, parent.state_hash, done.state_hash,
                    done.prompt_tokens, done.completion_tokens, done.finish_reason)
        return done

    async def _attach(self, turn: TurnContext, conv: Conversation) -> _Node:
        """Matches ``conv`` against the forest and commits its unmatched suffix as an observation.

        Returns:
            The node the generation continues: the new observation, or the matched state.

        Raises:
            InvalidRequestError: no messages, or the observation cannot be rendered.
            ContextLengthExceededError: the observation itself does not fit (nothing committed).

        Cancellation:
            A checkpoint only with images (see :meth:`_render_observation`).
        """
        if not conv.messages:
            raise InvalidRequestError("messages projected to zero supported messages", param="messages")
        forest = turn.forest
        match = forest.match(conv)
        if any(m.get("role") == "assistant" for m in match.delta):
            # A replayed assistant message that matches no committed response becomes
            # observation text with loss mask 0, on a new branch; the line says whether the
            # history or only the tool list changed (docs/client-quirks.md#dropped-reasoning-on-replay).
            log.warning("%s", mismatch_warning(turn.session_id, forest, conv, match))
        if not match.delta:
            return match.parent
        obs = await self._render_observation(conv, match)
        node = forest.add_observation(match, token_ids=obs.token_ids, rollout_token_ids=obs.rollout_token_ids,
                                      multimodal=obs.multimodal)
        if self.config.text_only_images == "marker":
            turn.note_images_as_text(count_markers(match.delta))
        return node

    def _token_budget(self, forest: SessionForest, parent: _Node, request: TurnRequest) -> int:
        """Tokens the turn may generate: the request's own limit (its turn limit,
        docs/canonical-contract.md#context-limits; at most :data:`MAX_TURN_TOKENS`), else
        ``--rollout-max-response-len``, bounded by the room the context limit leaves after the
        lineage.

        Raises:
            ContextLengthExceededError: the lineage leaves no room.
        """
        budget = self.config.max_response_tokens
        if request.max_new_tokens is not None:
            budget = min(request.max_new_tokens, MAX_TURN_TOKENS)
        if forest.max_context_tokens is not None:
            used = forest.train_token_count(parent)
            room = forest.max_context_tokens - used
            if room <= 0:
                raise ContextLengthExceededError(
                    context_length_message(forest.max_context_tokens, used), param="messages",
                    prompt_tokens=used, max_context_tokens=forest.max_context_tokens,
                )
            budget = min(budget, room)
        return budget

    def _sampling_params(self, turn: TurnContext, request: TurnRequest, max_new_tokens: int,
                         stop_ids: tuple[int, ...]) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            top_k=self.config.top_k,
            stop=list(self.config.stop + request.stop) or None,
            stop_token_ids=list(stop_ids) or None,
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
            no_stop_trim=True,
            sampling_seed=(request.seed if request.seed is not None
                           else self.config.sampling_seed(turn.session_index)),
            ignore_eos=self.config.ignore_eos or None,
        )

    async def _sample(
        self,
        turn: TurnContext,
        request: TurnRequest,
        request_id: str,
        prompt_ids: Sequence[int],
        images: Sequence[str],
        budget: int,
    ) -> SampledTurn:
        """The abort-resume loop: generate until the engine finishes for a reason other than an
        abort, or the token budget is spent.

        Each attempt waits at the generation gate, then sends the lineage ids plus every id
        generated so far with the remaining budget. An aborted attempt (a pause at step close)
        keeps its partial ids and logprobs and is recorded on the turn context.

        Raises:
            BackendError: the engine failed, or aborted the request ``MAX_EMPTY_ABORTS`` times
                in a row without progress.

        Cancellation:
            Waits at the gate and in the engine; a cancel aborts the engine request (shielded,
            bounded by ``ABORT_GRACE_S``) and nothing is committed.
        """
        token_ids: list[int] = []
        logprobs: list[float] = []
        spans: list[WeightSpan] = []
        abort_count = empty_aborts = 0
        generation_s = 0.0
        stop_ids = self._stop_ids()
        limit = self.config.partial_rollout_max_aborted_count

        def sampled(finish: str, matched_stop: str | None = None) -> SampledTurn:
            return SampledTurn(request_id=request_id, token_ids=token_ids, rollout_logprobs=logprobs,
                               weight_versions=spans, finish=finish, matched_stop=matched_stop,
                               abort_count=abort_count, generation_s=generation_s)

        while True:
            gate_t = trio.current_time()
            await turn.wait_generation_allowed()
            remaining = budget - len(token_ids)
            if remaining <= 0:
                return sampled("length")
            sampling = self._sampling_params(turn, request, remaining, stop_ids)
            rid = f"{request_id}:a{abort_count}#"
            attempt_start = trio.current_time()
            # Tracked with no checkpoint after the gate check, so a pause either sees this rid
            # (and aborts it) or closed the gate before we passed it.
            try:
                with turn.track(rid):
                    result = await self._generate(prompt_ids + tuple(token_ids), sampling, rid, images,
                                                  routing_key=turn.session_id, prefix_key=turn.session_id)
            except BaseException as exc:  # the call's end on the timeline: it failed or was cancelled
                turn.record("attempt", request_id, gate_t, attempt_start, 0, (), call_end(exc))
                raise
            generation_s += trio.current_time() - attempt_start
            offset = len(token_ids)
            token_ids.extend(result.output_ids)
            logprobs.extend(result.output_logprobs)
            spans.extend(WeightSpan(version=s.version, start=s.start + offset, end=s.end + offset)
                         for s in result.weight_versions)
            finish = effective_finish_type(token_ids, result.finish_type, stop_ids)
            turn.record("attempt", request_id, gate_t, attempt_start, len(result.output_ids),
                        result.weight_versions, finish)
            if finish != "abort":
                matched = result.finish_matched
                return sampled(finish, matched if isinstance(matched, str) else None)
            abort_count += 1
            turn.note_aborted(protect=limit is not None and abort_count >= limit)
            empty_aborts = empty_aborts + 1 if not result.output_ids else 0
            if empty_aborts >= MAX_EMPTY_ABORTS:
                raise BackendError(
                    f"engine aborted request {request_id} {empty_aborts} times without progress",
                    session_id=turn.session_id,
                )
            log.debug("request %s aborted after %d tokens; parked", request_id, len(token_ids))

    def _commit(
        self,
        turn: TurnContext,
        request: TurnRequest,
        conv: Conversation,
        parent: _Node,
        prompt_ids: Sequence[int],
        sampled: SampledTurn,
        wall_start: float,
    ) -> TurnResult:
        """Parses the assistant message and commits it as a response node under ``parent``.

        Raises:
            BackendError: no output ids, or the parsers leave nothing to return.
        """
        forest = turn.forest
        decoded = decode_assistant(
            sampled.token_ids,
            sampled.finish,
            compiler=self.compiler,
            reasoning_parser=self.config.reasoning_parser,
            tool_call_parser=self.config.tool_call_parser if conv.tools else None,
            tools=conv.tools,
            parent_state_hash=parent.state_hash,
            stop_token_ids=self._stop_ids(),
            matched_stop=sampled.matched_stop,
            # Only a reasoning parser reads it; decoding the prompt's tail cost ~3% of a turn.
            prompt_opened_think=(self.config.reasoning_parser is not None
                                 and self.compiler.prompt_opens_think(prompt_ids)),
        )
        node = forest.add_response(
            parent,
            dict(decoded.message),
            token_ids=list(sampled.token_ids),
            rollout_logprobs=list(sampled.rollout_logprobs),
            finish_reason=decoded.finish_reason,
            weight_versions=list(sampled.weight_versions),
            abort_count=sampled.abort_count,
            request_id=sampled.request_id,
            rollout_id=turn.rollout_id,
            wall_s=trio.current_time() - wall_start,
            generation_s=sampled.generation_s,
        )
        # A reply that recreates a state a client sent (a request ending in this assistant
        # message) is that observation node; its last message is the canonical reply.
        message = node.message if isinstance(node, ResponseNode) else node.messages[-1]
        token_logprobs = None
        if request.logprobs:
            token_logprobs = content_logprobs(self.compiler, list(sampled.token_ids),
                                              list(sampled.rollout_logprobs),
                                              message.get("content") or "")
        return TurnResult(
            message=message,
            finish_reason=decoded.finish_reason,
            prompt_tokens=forest.train_token_count(parent),
            completion_tokens=len(sampled.token_ids),
            request_id=sampled.request_id,
            state_hash=node.state_hash,
            logprobs=token_logprobs,
            stop_sequence=(sampled.matched_stop if decoded.finish_reason == "stop"
                           and sampled.matched_stop in request.stop else None),
        )

    async def count_tokens(self, forest: SessionForest, request: TurnRequest) -> int:
        """Tokens of the prompt :meth:`complete` would generate from: the training ids of the
        matched lineage plus those of the rendered new observation (so equal to the
        ``prompt_tokens`` that turn would report). Nothing is generated, nothing is committed.

        Raises:
            InvalidRequestError: no messages, a message the template cannot render, or an image
                the model cannot take.

        Cancellation:
            A checkpoint only with images (processed in a worker thread); nothing is committed.
        """
        conv = self._merge_kwargs(request.conversation)
        if not conv.messages:
            raise InvalidRequestError("messages projected to zero supported messages", param="messages")
        match = forest.match(conv)
        count = forest.train_token_count(match.parent)
        if match.delta:
            count += len((await self._render_observation(conv, match)).token_ids)
        return count

    async def _render_observation(self, conv: Conversation, match: Match) -> RenderedObservation:
        """Both id views of the unmatched suffix: a full render at a subtree root, else a delta.

        The template render (tokenizer) runs here on the trio thread; images, if any, are
        decoded and processed in a worker thread (CPU work that never touches the tokenizer).

        Raises:
            InvalidRequestError: as :meth:`ChatCompiler.observation_ids` and
                :meth:`ChatCompiler.attach_images`.

        Cancellation:
            A checkpoint only with images; a cancel waits for the worker thread, and nothing
            is committed either way.
        """
        parent = match.parent
        delta = not isinstance(parent, RootNode)
        messages = match.delta if delta else conv.messages
        previous = (parent.message if isinstance(parent, ResponseNode)
                    else parent.messages[-1] if isinstance(parent, ObservationNode) else None)
        ids, images = self.compiler.observation_ids(
            messages, conv.tools, conv.template_kwargs,
            delta=delta, message_offset=len(conv.messages) - len(messages),
            previous=previous if previous is not None and previous.get("role") == "assistant" else None,
            sampled_stop_id=self._sampled_stop_id(parent),
        )
        if not images:
            return RenderedObservation(ids, ids, None)
        return await trio.to_thread.run_sync(self.compiler.attach_images, ids, images)

    def _sampled_stop_id(self, parent: _Node) -> int | None:
        """The stop id a response ends with (left out of its message), or None: a next delta that
        starts with it (the model sampled the next message's header to stop) does not repeat it."""
        if not isinstance(parent, ResponseNode) or not parent.token_ids:
            return None
        last = parent.token_ids[-1]
        return last if last in self._stop_ids() else None

    async def _generate(self, input_ids: Sequence[int], sampling: SamplingParams, rid: str,
                        images: Sequence[str] = (), *, routing_key: str | None = None,
                        prefix_key: str | None = None):
        finished = False
        extra = {"image_data": list(images)} if images else {}
        try:
            # The Session id is the routing key: every turn of a Session goes to one worker.
            result = await self.client.generate(input_ids, sampling, rid=rid, return_logprob=True,
                                                routing_key=routing_key, prefix_key=prefix_key,
                                                **extra)
            finished = True
            return result
        except EngineUnavailableError as exc:
            if self.fatal_error is None:
                self.fatal_error = exc
            raise
        finally:
            if not finished:
                # Cancelled or failed mid-flight: make sure the engine stops working on it.
                with trio.CancelScope(shield=True), trio.move_on_after(ABORT_GRACE_S):
                    try:
                        await self.client.abort(rid)
                    except BackendError as exc:
                        log.warning("abort of %s failed: %s", rid, exc)
