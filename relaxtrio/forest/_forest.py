"""SessionForest: every committed conversation state of one Session.

Matching is linear in the request: the state hash of the prefix ``messages[:k]`` is
``sha256(b'{"messages":[' + m1 + b"," + ... + mk + SUFFIX)`` with
``SUFFIX = b'],"template_kwargs":' + K + b',"tools":' + T + b'}'`` (sorted keys put ``messages``
before ``template_kwargs`` before ``tools``), so one running SHA-256 fed message by message,
copied and closed with the constant suffix, yields every prefix hash exactly as the naive
re-hashing loop of docs/canonical-contract.md#prefix-matching defines it, in one pass over the
request's bytes. The :class:`Conversation` keeps those running states (one per prefix length,
computed once; a Session's :class:`~relaxtrio.forest._memo.ConversationMemo` extends the
previous request's states by the new messages only), so matching closes states only at prefix lengths where this subtree
family has committed nodes, longest first, and stops at the first hit: the answer that loop
returns. A Session's next request hits at its previous response, so matching costs a couple of
hash closes however long the history is.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, Final

from .._errors import ContextLengthExceededError, InternalError
from ._canonical import Conversation, canonical_message, finish_hash
from ._ids import LineageIds
from ._json import dumps
from ._nodes import AnyNode, FinishReason, Match, Node, ObservationNode, ResponseNode, RootNode, _Subtree


_LINEAGE_CACHE_SIZE: Final = 16  # lineages kept per forest (the turns in flight of one Session)
# Rollout id sequences kept per forest: a Session's next prompt extends its last one, so a few
# suffice (views of shared buffers: a branch's buffer costs 8 bytes per id of its lineage).
_ROLLOUT_IDS_CACHE_SIZE: Final = 4


def context_length_message(max_context_tokens: int, prompt_tokens: int) -> str:
    """The context-length message for a prompt of ``prompt_tokens`` tokens.

    See docs/canonical-contract.md#context-limits.
    """
    return (
        f"This model's maximum context length is {max_context_tokens} tokens. "
        f"However, your messages resulted in {prompt_tokens} tokens. "
        "Please reduce the length of the messages."
    )


def _extended_hash(parent: ObservationNode | ResponseNode, message: dict[str, Any]) -> tuple[Any, str]:
    """The running SHA-256 state of ``parent``'s messages plus ``message`` (canonical), and the
    state hash it closes to with the subtree's tools and template kwargs: one message of work, not
    a re-hash of the lineage (docs/canonical-contract.md#prefix-matching)."""
    hasher = parent._hasher.copy()
    hasher.update(b",")
    hasher.update(dumps(message).encode("utf-8"))
    return hasher, finish_hash(hasher, parent._subtree.suffix)


class SessionForest:
    """The tree of committed conversation states of one Session (pure, synchronous).

    Subtrees under the technical root differ by initial history, tools or template kwargs;
    branches inside a subtree differ by history. Registering a state that already exists returns
    the existing node (its tokens and metadata win), whichever its kind: a sampled reply that
    recreates a state a client sent as an observation (a request ending in that same assistant
    message) collapses into that observation node, like a duplicated response.

    Args:
        session_id: the Session's id.
        max_context_tokens: rollout (or eval) context limit in training tokens; None disables
            the observation check.

    Attributes:
        session_id: the Session's id.
        max_context_tokens: the context limit, or None.
        root: the technical root.

    Nodes keep running SHA-256 states (hashlib objects), so a forest is not picklable; its
    TrainingSamples are.
    """

    def __init__(self, session_id: str, *, max_context_tokens: int | None = None) -> None:
        self.session_id = session_id
        self.max_context_tokens = max_context_tokens
        self.root = RootNode(session_id)
        self._nodes: dict[str, Node] = {}
        self._leaves: dict[str, None] = {}  # insertion-ordered set of leaf hashes
        # Message counts at which committed states exist, per tools+kwargs serialization.
        self._lengths: dict[bytes, set[int]] = {}
        self._lineages: dict[str, tuple[Node, ...]] = {}  # recent lineages, oldest first
        self._rollout_ids: dict[str, LineageIds] = {}  # recent rollout id sequences, oldest first
        self.num_multimodal_observations = 0
        """Committed observation nodes with a media payload (none: no lineage has images)."""
        self.num_responses_into_observations = 0
        """Sampled replies that recreated a committed observation state (see :meth:`add_response`)."""
        self._response_order: dict[str, int] = {}  # response hash → when it was last answered
        self._answers = 0

    def __len__(self) -> int:
        """Number of committed (non-root) nodes."""
        return len(self._nodes)

    # -- matching ------------------------------------------------------------------------------

    def match(self, conv: Conversation) -> Match:
        """Finds the longest committed message prefix of ``conv`` with the same tools and kwargs.

        Returns exactly what the naive loop (``for k in range(n, 0, -1): hash(messages[:k],
        tools, kwargs) in nodes``) returns; hashing costs O(bytes of ``conv``) once per
        conversation (the prefix states), then one close per candidate length tried.

        Args:
            conv: the request's canonical conversation (``n`` messages).

        Returns:
            The match: ``parent`` is the committed node (or the root) and ``delta`` the unmatched
            suffix; ``delta == ()`` is a full match.
        """
        states = conv._prefix_states()
        n = len(conv.messages)
        suffix = conv._suffix
        hasher = states[n]
        full_hash = finish_hash(hasher, suffix)
        candidates = self._lengths.get(suffix)
        if candidates:
            # Longest first; a Session's next request usually hits at once (its previous
            # response is committed one or two messages before the end).
            for k in range(n, 0, -1):
                if k in candidates:
                    node = self._nodes.get(finish_hash(states[k], suffix))
                    if node is not None:
                        return Match(node, conv.messages[k:], conv, full_hash, hasher)
        return Match(self.root, conv.messages[:], conv, full_hash, hasher)  # a tuple (not a view)

    # -- commits -------------------------------------------------------------------------------

    def add_observation(
        self,
        match: Match,
        *,
        token_ids: Any,
        rollout_token_ids: Any = None,
        multimodal: Any = None,
    ) -> ObservationNode | ResponseNode:
        """Commits the unmatched suffix of a match as an observation node.

        The context limit is checked on training ids before anything is committed. An identical
        state that is already committed since the match (by a concurrent request: an observation,
        or a response that ended in this same assistant message) is returned unchanged; the
        request generates from it.

        Args:
            match: a non-full match from :meth:`match` on this forest.
            token_ids: ``[t]`` training ids of the delta render.
            rollout_token_ids: ``[r]`` generation-input ids, or None for ``token_ids``.
            multimodal: the delta's media payload (opaque), or None.

        Returns:
            The committed observation node, or the already committed node of that state.

        Raises:
            ContextLengthExceededError: ``train_token_count(parent) + t >= max_context_tokens``;
                nothing is committed. ``param`` is ``messages``.
            InternalError: the parent's subtree has other tools or template kwargs than the
                request.
            ValueError: an empty delta or a match from another forest.
        """
        if not match.delta:
            raise ValueError(
                "add_observation needs a non-empty delta; a full match generates from match.parent"
            )
        parent = self._own(match.parent)
        conv = match.conversation
        existing = self._nodes.get(match.state_hash)
        if existing is not None:
            return existing
        tools: tuple[dict[str, Any], ...] | None = None
        template_kwargs: dict[str, Any] | None = None
        if isinstance(parent, RootNode):
            subtree = _Subtree(match.state_hash, conv._suffix)
            tools, template_kwargs = conv.tools, conv.template_kwargs
        else:
            subtree = parent._subtree
            if subtree.suffix != conv._suffix:
                raise InternalError(
                    f"tools or chat template kwargs changed inside session subtree {subtree.root_hash}",
                    session_id=self.session_id,
                )
        token_ids = tuple(token_ids)
        total = parent.num_train_tokens + len(token_ids)
        if self.max_context_tokens is not None and total >= self.max_context_tokens:
            raise ContextLengthExceededError(
                context_length_message(self.max_context_tokens, total), param="messages",
                session_id=self.session_id, prompt_tokens=total, max_context_tokens=self.max_context_tokens,
            )
        node = ObservationNode(
            state_hash=match.state_hash,
            parent_hash=parent.state_hash,
            messages=match.delta,
            token_ids=token_ids,
            rollout_token_ids=token_ids if rollout_token_ids is None else rollout_token_ids,
            multimodal=multimodal,
            tools=tools,
            template_kwargs=template_kwargs,
            abort_count=parent.abort_count,
            num_messages=len(conv.messages),
            num_train_tokens=total,
            num_responses=parent.num_responses,
            depth=parent.depth + 1,
            subtree=subtree,
            hasher=match._hasher.copy(),
        )
        self._register(node)
        return node

    def add_response(
        self,
        parent: Node,
        message: dict[str, Any],
        *,
        token_ids: Any,
        rollout_logprobs: Any,
        finish_reason: FinishReason,
        weight_versions: Any = (),
        abort_count: int = 0,
        request_id: str | None = None,
        rollout_id: int | None = None,
        wall_s: float = 0.0,
        generation_s: float = 0.0,
    ) -> ResponseNode | ObservationNode:
        """Commits a sampled assistant message as a response node under ``parent``.

        An identical committed state is returned unchanged (the sampled tokens are not kept): a
        duplicated response, or an observation a client sent ending in this same assistant
        message (counted in :attr:`num_responses_into_observations`).

        Args:
            parent: the observation or response node the generation continued.
            message: the assistant message (canonicalized here; tool-call arguments included).
            token_ids: ``[t]`` sampled ids, ``t >= 1``.
            rollout_logprobs: ``[t]`` engine logprobs, ``len(rollout_logprobs) == len(token_ids)``.
            finish_reason: ``stop``, ``length`` or ``tool_calls``.
            weight_versions: :class:`WeightSpan` s relative to ``token_ids``.
            abort_count: aborts survived by the request.
            request_id: the turn's request id.
            rollout_id: the rollout step that finished the turn.
            wall_s: seconds from request arrival to commit.
            generation_s: seconds inside engine calls.

        Returns:
            The committed response node, or the already committed node of that state.

        Raises:
            InvalidRequestError: ``message`` is not a valid assistant message (``param``
                starts with ``message``).
            ValueError: a broken invariant (lengths, finish reason, spans, foreign parent).
        """
        owned = self._own(parent)
        if isinstance(owned, RootNode):
            raise ValueError("a response needs an observation or response parent, not the technical root")
        parent = owned
        canonical = canonical_message(message, param="message")
        if canonical["role"] != "assistant":
            raise ValueError(f"a response message must have role assistant, got {canonical['role']!r}")
        hasher, state_hash = _extended_hash(parent, canonical)
        existing = self._nodes.get(state_hash)
        if existing is not None:
            return self._collapse(existing)
        token_ids = tuple(token_ids)
        node = ResponseNode(
            state_hash=state_hash,
            parent_hash=parent.state_hash,
            message=canonical,
            token_ids=token_ids,
            rollout_logprobs=rollout_logprobs,
            finish_reason=finish_reason,
            weight_versions=tuple(weight_versions),
            abort_count=abort_count,
            request_id=request_id,
            rollout_id=rollout_id,
            wall_s=float(wall_s),
            generation_s=float(generation_s),
            num_messages=parent.num_messages + 1,
            num_train_tokens=parent.num_train_tokens + len(token_ids),
            num_responses=parent.num_responses + 1,
            depth=parent.depth + 1,
            subtree=parent._subtree,
            hasher=hasher,
        )
        self._register(node)
        self._note_answer(node)
        return node

    def _collapse(self, existing: Node) -> ResponseNode | ObservationNode:
        """A sampled reply whose state is already committed: that node (see :meth:`add_response`)."""
        if isinstance(existing, ObservationNode):
            self.num_responses_into_observations += 1
        else:
            self._note_answer(existing)
        return existing

    def _note_answer(self, node: ResponseNode) -> None:
        self._answers += 1
        self._response_order.pop(node.state_hash, None)
        self._response_order[node.state_hash] = self._answers

    def responses_in_answer_order(self) -> tuple[ResponseNode, ...]:
        """Every response node, ordered by when it was last answered (the last answer last).

        A duplicated identical response collapses into the committed node; answering it again
        moves it to the end.
        """
        nodes = (self._nodes[h] for h in self._response_order)
        return tuple(n for n in nodes if isinstance(n, ResponseNode))

    def _own(self, node: AnyNode) -> AnyNode:
        if node is self.root:
            return node
        if isinstance(node, (ObservationNode, ResponseNode)) and self._nodes.get(node.state_hash) is node:
            return node
        raise ValueError(
            f"node {getattr(node, 'state_hash', node)!r} does not belong to session {self.session_id}"
        )

    def _register(self, node: Node) -> None:
        self._nodes[node.state_hash] = node
        self._leaves[node.state_hash] = None
        if node.parent_hash is not None:
            self._leaves.pop(node.parent_hash, None)
        self._lengths.setdefault(node._subtree.suffix, set()).add(node.num_messages)
        if isinstance(node, ObservationNode) and node.multimodal is not None:
            self.num_multimodal_observations += 1

    # -- queries -------------------------------------------------------------------------------

    def get(self, state_hash: str) -> Node | None:
        """The committed node with this state hash, or None (the root is never returned)."""
        return self._nodes.get(state_hash)

    def nodes(self) -> tuple[Node, ...]:
        """Every committed node in commit order (a parent always before its children)."""
        return tuple(self._nodes.values())

    def leaves(self) -> tuple[Node, ...]:
        """Committed nodes without children, in commit order."""
        return tuple(self._nodes[h] for h in self._leaves)

    def lineage(self, node: AnyNode) -> tuple[Node, ...]:
        """The nodes from the subtree root down to ``node`` (root excluded).

        O(depth) Python steps, except when the lineage of an ancestor a few steps up was asked
        for recently (a Session's next turn continues its last one): then one tuple copy.
        """
        tail: list[Node] = []
        current: Node | None = None if isinstance(node, RootNode) else node
        while current is not None:
            cached = self._lineages.get(current.state_hash)
            if cached is not None:
                tail.reverse()
                result = cached + tuple(tail)
                break
            tail.append(current)
            current = None if current.parent_hash is None else self._nodes[current.parent_hash]
        else:
            tail.reverse()
            result = tuple(tail)
        if result:
            if len(self._lineages) >= _LINEAGE_CACHE_SIZE:
                self._lineages.pop(next(iter(self._lineages)))
            self._lineages[result[-1].state_hash] = result
        return result

    def messages(self, node: AnyNode) -> tuple[dict[str, Any], ...]:
        """The full canonical message list of ``node``'s state (shared dicts: do not mutate)."""
        return tuple(chain.from_iterable(n.messages for n in self.lineage(node)))

    def conversation(self, node: Node) -> Conversation:
        """``node``'s state as a Conversation (messages plus its subtree's tools and kwargs)."""
        root = self.subtree_root(node)
        return Conversation(self.messages(node), root.tools or (), root.template_kwargs or {})

    def rollout_token_ids(self, node: AnyNode) -> LineageIds:
        """``[r]`` generation-input ids of the lineage (the concatenated rollout deltas).

        Python steps only for the nodes below the nearest ancestor whose ids were asked for
        recently (a Session's next turn continues its last prompt); their ids are appended to
        that ancestor's :class:`~relaxtrio.forest._ids.LineageIds` buffer, so the history is not
        copied, and the result is known to extend the ancestor's ids (the engine client reuses
        the JSON text of a prompt it extends).
        """
        tail: list[Node] = []
        current: Node | None = None if isinstance(node, RootNode) else node
        head: LineageIds | None = None
        while current is not None:
            cached = self._rollout_ids.get(current.state_hash)
            if cached is not None:
                head = cached
                break
            tail.append(current)
            current = None if current.parent_hash is None else self._nodes[current.parent_hash]
        if not tail:
            return LineageIds.of(()) if head is None else head
        tail.reverse()
        new_ids = chain.from_iterable(n.rollout_token_ids for n in tail)
        ids = LineageIds.of(new_ids) if head is None else head.extended(new_ids)
        if len(self._rollout_ids) >= _ROLLOUT_IDS_CACHE_SIZE:
            self._rollout_ids.pop(next(iter(self._rollout_ids)))
        self._rollout_ids[tail[-1].state_hash] = ids
        return ids

    def train_token_count(self, node: AnyNode) -> int:
        """Training ids in the lineage of ``node``; O(1)."""
        return node.num_train_tokens

    def subtree_roots(self) -> tuple[ObservationNode, ...]:
        """The first observation of every subtree, in commit order; O(nodes)."""
        return tuple(n for n in self._nodes.values()
                     if isinstance(n, ObservationNode) and n._subtree.root_hash == n.state_hash)

    def subtree_root(self, node: Node) -> ObservationNode:
        """The first observation of ``node``'s subtree; it holds the subtree's tools and kwargs.

        Raises:
            ValueError: ``node`` is the technical root.
        """
        if isinstance(node, RootNode):
            raise ValueError("the technical root belongs to no subtree")
        root = self._nodes[node._subtree.root_hash]
        assert isinstance(root, ObservationNode)
        return root
