"""Forest nodes: the technical root, observation nodes and response nodes, plus Match.

Nodes are frozen attrs values that store only their own delta (messages and token ids) and a few
cumulative counters (message count, training-token count, response count, depth), so a node costs
O(delta) memory and lineage walks are O(depth). Each node also keeps the unfinished SHA-256 of its
message prefix, so the hash of a child state costs O(size of the child's delta).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, Literal

import attrs

from ._canonical import Conversation

FinishReason = Literal["stop", "length", "tool_calls"]
SampleStatus = Literal["completed", "truncated"]
FINISH_REASONS: frozenset[str] = frozenset({"stop", "length", "tool_calls"})


def _non_negative(instance: Any, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{type(instance).__name__}.{attribute.name} must be >= 0, got {value}")


def _int_tuple(value: Any) -> tuple[int, ...]:
    values = tuple(value)
    if all(type(v) is int for v in values):  # the common case: already plain ints
        return values
    return tuple(int(v) for v in values)


def _float_tuple(value: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in value)


def span_tuple(spans: Iterable[WeightSpan]) -> tuple[WeightSpan, ...]:
    """``tuple(spans)`` (a converter with a concrete type: attrs' plugin cannot infer ``tuple``'s)."""
    return tuple(spans)


@attrs.frozen
class WeightSpan:
    """The policy weight version that sampled token positions ``[start, end)``.

    Attributes:
        version: the engine's weight version label.
        start: first token index (inclusive), relative to the enclosing token list.
        end: one past the last token index; ``start <= end``.
    """

    version: str
    start: int = attrs.field(validator=_non_negative)
    end: int = attrs.field()

    @end.validator
    def _check_end(self, attribute: attrs.Attribute[int], value: int) -> None:
        if value < self.start:
            raise ValueError(f"WeightSpan.end must be >= start, got [{self.start}, {value})")

    def shifted(self, offset: int) -> WeightSpan:
        """The same span ``offset`` tokens later."""
        return WeightSpan(self.version, self.start + offset, self.end + offset)


@attrs.frozen(eq=False)
class _Subtree:
    """What every node of one subtree shares by reference (never copied per node)."""

    root_hash: str
    suffix: bytes  # ``],"template_kwargs":K,"tools":T}``: closes every prefix hash of the subtree


@attrs.frozen
class RootNode:
    """The technical root of a SessionForest: no messages, no tokens, never matched by hash.

    Attributes:
        session_id: the Session the forest belongs to.
    """

    kind: ClassVar[str] = "root"
    state_hash: ClassVar[None] = None
    parent_hash: ClassVar[None] = None
    num_messages: ClassVar[int] = 0
    num_train_tokens: ClassVar[int] = 0
    num_responses: ClassVar[int] = 0
    depth: ClassVar[int] = 0
    abort_count: ClassVar[int] = 0

    session_id: str


@attrs.frozen
class ObservationNode:
    """New system/user/tool (or replayed) messages and their rendered token ids (loss mask 0).

    A node directly under the root is a subtree root: it stores the subtree's ``tools`` and
    ``template_kwargs`` and its ids are the full template render; below it those two are None
    (inherited) and the ids are the dummy-prefix delta render.

    Attributes:
        state_hash: hash of the full state this node ends (:func:`~relaxtrio.forest.state_hash`).
        parent_hash: the parent's state hash; None when the parent is the technical root.
        messages: the delta messages, length ``>= 1``.
        token_ids: ``[t]`` training ids of the delta (processor-expanded for multimodal input).
        rollout_token_ids: ``[r]`` generation-input ids of the delta (equal to ``token_ids`` for
            text).
        multimodal: the observation's media payload (opaque to the forest), or None.
        tools: subtree tools on a subtree root, else None.
        template_kwargs: subtree template kwargs on a subtree root, else None.
        abort_count: inherited from the parent (0 at a subtree root).
        num_messages: messages of the whole state (cumulative).
        num_train_tokens: training ids of the whole lineage, this node included.
        num_responses: response nodes in the lineage.
        depth: 1 for a subtree root, parent depth + 1 below.
    """

    kind: ClassVar[str] = "observation"

    state_hash: str
    parent_hash: str | None
    messages: tuple[dict[str, Any], ...] = attrs.field(hash=False)
    token_ids: tuple[int, ...] = attrs.field(converter=_int_tuple, hash=False)
    rollout_token_ids: tuple[int, ...] = attrs.field(converter=_int_tuple, hash=False)
    multimodal: Any = attrs.field(hash=False)
    tools: tuple[dict[str, Any], ...] | None = attrs.field(hash=False)
    template_kwargs: dict[str, Any] | None = attrs.field(hash=False)
    abort_count: int
    num_messages: int
    num_train_tokens: int
    num_responses: int
    depth: int
    _subtree: _Subtree = attrs.field(eq=False, repr=False)
    _hasher: Any = attrs.field(eq=False, repr=False)

    @property
    def is_subtree_root(self) -> bool:
        """True for the first observation of a subtree (its parent is the technical root)."""
        return self.parent_hash is None


@attrs.frozen
class ResponseNode:
    """One sampled assistant message with its ids and rollout logprobs (loss mask 1).

    Attributes:
        state_hash: hash of the full state ending with this message.
        parent_hash: the state the generation continued.
        message: the committed canonical assistant message (exactly what the agent received).
        token_ids: ``[t]`` sampled ids, ``t >= 1``; training and rollout ids are the same.
        rollout_logprobs: ``[t]`` engine logprob of each sampled id.
        finish_reason: ``stop``, ``length`` or ``tool_calls``.
        weight_versions: spans relative to ``token_ids`` (one per engine attempt).
        abort_count: how many times the request was aborted and resumed before finishing.
        request_id: the turn's request id, or None.
        rollout_id: the rollout step that finished the turn, or None.
        wall_s: seconds from request arrival to commit.
        generation_s: seconds spent inside engine calls.
        num_messages, num_train_tokens, num_responses, depth: cumulative, as on observations.
    """

    kind: ClassVar[str] = "response"

    state_hash: str
    parent_hash: str
    message: dict[str, Any] = attrs.field(hash=False)
    token_ids: tuple[int, ...] = attrs.field(converter=_int_tuple, hash=False)
    rollout_logprobs: tuple[float, ...] = attrs.field(converter=_float_tuple, hash=False)
    finish_reason: FinishReason
    weight_versions: tuple[WeightSpan, ...] = attrs.field(converter=span_tuple, hash=False)
    abort_count: int = attrs.field(validator=_non_negative)
    request_id: str | None
    rollout_id: int | None
    wall_s: float
    generation_s: float
    num_messages: int
    num_train_tokens: int
    num_responses: int
    depth: int
    _subtree: _Subtree = attrs.field(eq=False, repr=False)
    _hasher: Any = attrs.field(eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        n = len(self.token_ids)
        if n == 0:
            raise ValueError("ResponseNode.token_ids must not be empty")
        if len(self.rollout_logprobs) != n:
            raise ValueError(
                f"ResponseNode.rollout_logprobs has {len(self.rollout_logprobs)} entries for {n} token_ids"
            )
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"ResponseNode.finish_reason must be stop, length or tool_calls, got {self.finish_reason!r}"
            )
        for span in self.weight_versions:
            if not isinstance(span, WeightSpan) or span.end > n:
                raise ValueError(f"ResponseNode.weight_versions span {span!r} is outside [0, {n})")

    @property
    def messages(self) -> tuple[dict[str, Any], ...]:
        """The delta messages: ``(message,)``."""
        return (self.message,)

    @property
    def rollout_token_ids(self) -> tuple[int, ...]:
        """Same as ``token_ids`` (sampled ids are never re-rendered)."""
        return self.token_ids

    @property
    def status(self) -> SampleStatus:
        """``truncated`` when the turn stopped at the length limit, else ``completed``."""
        return "truncated" if self.finish_reason == "length" else "completed"


Node = ObservationNode | ResponseNode
AnyNode = RootNode | ObservationNode | ResponseNode


@attrs.frozen
class Match:
    """Where a request's conversation attaches to the forest.

    Attributes:
        parent: the committed state with the longest message prefix of the conversation (same
            tools and template kwargs), or the technical root.
        delta: ``conversation.messages[parent.num_messages:]``, the unmatched suffix; empty on a
            full match (generation branches from ``parent``).
        conversation: the request's canonical conversation.
        state_hash: the hash of the whole conversation.
    """

    parent: AnyNode
    delta: tuple[dict[str, Any], ...] = attrs.field(hash=False)
    conversation: Conversation
    state_hash: str
    _hasher: Any = attrs.field(eq=False, repr=False)

    @property
    def is_full_match(self) -> bool:
        """True when every message is already committed (empty delta)."""
        return not self.delta
