"""Export: committed forest states to TrainingSamples.

See docs/export-and-credit.md#from-a-lineage-to-a-trainingsample.

A context is the lineage from a subtree root to the exported state. Its ids are the concatenated
deltas; the prompt is everything before the first response node; loss mask 1 marks exactly the
sampled ids of response nodes, 0 the observations (also the ones after the first response);
rollout logprobs are aligned with the ids (0.0 where the mask is 0).
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import attrs

from .._errors import ExportError, InvalidRequestError
from ._canonical import Conversation, canonical_template_kwargs, state_hash
from ._forest import SessionForest
from ._json import copy_json
from ._nodes import Node, ObservationNode, ResponseNode, SampleStatus, WeightSpan, _float_tuple, _int_tuple, span_tuple
from ._output import ExportRecord, Reward, SessionOutput
from ._policy import ExportPolicy, select_leaves

TRACE_KEY = "agentic_trace"


def _any_tuple(items: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(items)


@attrs.frozen
class TrainingSample:
    """One exported context, ready for reward, advantage and the trainer.

    Attributes:
        name: the explicit record's name; None for implicit export.
        session_id: the Session it came from.
        token_ids: ``[T]`` training ids of the whole lineage (prompt + continuation).
        prompt_length: ids before the first response node, ``0 <= prompt_length <= T``.
        loss_mask: ``[T]``; 1 exactly on sampled response ids, else 0.
        rollout_logprobs: ``[T]``; the engine logprob of ``token_ids[t]`` where
            ``loss_mask[t] == 1``, else 0.0.
        reward: a finite number, an object with a primary key, or None (to be scored).
        status: ``truncated`` when the exported state is an observation or its last response
            hit the length limit, else ``completed``.
        weight_versions: spans in ``token_ids`` coordinates, one per engine attempt.
        metadata: dataset metadata, overlaid by export metadata, plus ``tools``,
            ``chat_template_kwargs``, ``start_rollout_id``, ``agentic_trace`` (per-turn trace)
            and ``rollout_turns``.
        rollout_token_ids: ``[R]`` generation-input ids of the lineage (differ from
            ``token_ids`` only through multimodal processor expansion).
        multimodal_inputs: the observations' media payloads in lineage order (observations
            without media are skipped); empty for text-only contexts.
        export_metadata: the export's own metadata alone: the Session output's ``metadata``
            overlaid by the record's (implicit export: the output's). This, not ``metadata``, is
            what custom advantage receives (docs/export-and-credit.md#custom-advantage) and what the
            ``<field>/mean|median|max|min`` metrics read.
    """

    name: str | None
    session_id: str
    token_ids: tuple[int, ...] = attrs.field(converter=_int_tuple, hash=False)
    prompt_length: int
    loss_mask: tuple[int, ...] = attrs.field(converter=_int_tuple, hash=False)
    rollout_logprobs: tuple[float, ...] = attrs.field(converter=_float_tuple, hash=False)
    reward: Reward = attrs.field(hash=False)
    status: SampleStatus
    weight_versions: tuple[WeightSpan, ...] = attrs.field(converter=span_tuple, hash=False)
    metadata: dict[str, Any] = attrs.field(hash=False)
    rollout_token_ids: tuple[int, ...] = attrs.field(
        default=attrs.Factory(lambda self: self.token_ids, takes_self=True), converter=_int_tuple, hash=False
    )
    multimodal_inputs: tuple[Any, ...] = attrs.field(default=(), converter=_any_tuple, hash=False)
    export_metadata: dict[str, Any] = attrs.field(factory=dict, hash=False)

    def __attrs_post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n:
            raise ValueError(f"TrainingSample.loss_mask has {len(self.loss_mask)} entries for {n} token_ids")
        if len(self.rollout_logprobs) != n:
            raise ValueError(
                f"TrainingSample.rollout_logprobs has {len(self.rollout_logprobs)} entries for {n} token_ids"
            )
        if not 0 <= self.prompt_length <= n:
            raise ValueError(f"TrainingSample.prompt_length {self.prompt_length} is outside [0, {n}]")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("TrainingSample.loss_mask must hold only 0 and 1")
        if self.status not in ("completed", "truncated"):
            raise ValueError(f"TrainingSample.status must be completed or truncated, got {self.status!r}")
        for span in self.weight_versions:
            if span.end > n:
                raise ValueError(f"TrainingSample.weight_versions span {span!r} is outside [0, {n})")

    @property
    def response_length(self) -> int:
        """Ids after the prompt (responses plus later observations)."""
        return len(self.token_ids) - self.prompt_length


def export_samples(
    forest: SessionForest,
    output: SessionOutput | None,
    *,
    dataset_metadata: dict[str, Any] | None = None,
    server_template_kwargs: Mapping[str, Any] | None = None,
    policy: ExportPolicy = "strict",
    undelivered: Collection[str] = frozenset(),
) -> list[TrainingSample]:
    """Turns a finished Session's output into training samples.

    Implicit export (no records) trains the states :func:`select_leaves` picks under
    ``policy``: with ``strict``, a strictly linear history (exactly one leaf, and its lineage
    holds a response; any nonlinear history fails, even with one exportable leaf), with
    ``name=None`` (docs/export-and-credit.md#export-policies); every implicit sample gets the
    output's metadata and reward. Explicit export builds one
    sample per record, in record order: the record's state (its messages, tools and
    ``{**server_template_kwargs, **record kwargs}``) must be a committed node with a response in
    its lineage; the sample metadata is the output metadata overlaid by the record's.

    Args:
        forest: the Session's forest.
        output: the parsed agent output; None means implicit export.
        dataset_metadata: the dataset row's metadata (copied, never mutated).
        server_template_kwargs: server-wide chat-template kwargs under the records'.
        policy: the implicit-export policy (``strict``, ``final`` or ``all-leaves``); explicit
            records are exported as written under every policy.
        undelivered: state hashes of responses no client received: side leaves that implicit
            export leaves out (:func:`select_leaves`).

    Returns:
        The samples, one per exported context.

    Raises:
        ExportError: ``implicit export requires one committed leaf, found N`` (with
            ``num_leaves == N``; under ``final`` and ``all-leaves`` only for N == 0);
            ``implicit export requires a linear history`` (``strict``: a branch or a second
            subtree, even without a response);
            ``explicit export does not match a committed Forest state``; ``export leaf has no
            committed response``; invalid server template kwargs.
    """
    output = output if output is not None else SessionOutput()
    if output.is_implicit:
        selection = select_leaves(forest, policy, undelivered)
        return [
            build_sample(
                forest,
                node,
                name=name,
                reward=output.reward,
                export_metadata=output.metadata,
                dataset_metadata=dataset_metadata,
            )
            for name, node in selection.contexts
        ]
    samples = []
    for record in output.records:
        node = _record_node(forest, record, server_template_kwargs)
        samples.append(
            build_sample(
                forest,
                node,
                name=record.name,
                reward=record.reward,
                export_metadata={**output.metadata, **record.metadata},
                dataset_metadata=dataset_metadata,
            )
        )
    return samples


def _record_node(forest: SessionForest, record: ExportRecord,
                 server_template_kwargs: Mapping[str, Any] | None) -> Node:
    try:
        kwargs = canonical_template_kwargs(record.template_kwargs, base=server_template_kwargs)
    except InvalidRequestError as exc:
        raise ExportError(f"record {record.name!r}: {exc.message}", param=exc.param) from exc
    node = forest.get(state_hash(Conversation(record.messages, record.tools, kwargs)))
    if node is None:
        raise ExportError(
            f"explicit export does not match a committed Forest state (record {record.name!r})",
            session_id=forest.session_id,
        )
    return node


def build_sample(
    forest: SessionForest,
    leaf: Node,
    *,
    name: str | None,
    reward: Reward,
    export_metadata: dict[str, Any],
    dataset_metadata: dict[str, Any] | None,
) -> TrainingSample:
    """Builds the TrainingSample of the lineage ending at ``leaf``; O(depth + T).

    Raises:
        ExportError: no response node in the lineage.
    """
    lineage = forest.lineage(leaf)
    token_ids: list[int] = []
    rollout_ids: list[int] = []
    loss_mask: list[int] = []
    logprobs: list[float] = []
    spans: list[WeightSpan] = []
    multimodal: list[Any] = []
    turns: list[dict[str, Any]] = []
    prompt_length: int | None = None
    first_response: ResponseNode | None = None
    for node in lineage:
        offset = len(token_ids)
        n = len(node.token_ids)
        token_ids.extend(node.token_ids)
        rollout_ids.extend(node.rollout_token_ids)
        if isinstance(node, ResponseNode):
            if first_response is None:
                first_response, prompt_length = node, offset
            loss_mask.extend([1] * n)
            logprobs.extend(node.rollout_logprobs)
            spans.extend(span.shifted(offset) for span in node.weight_versions)
            turns.append(_turn(node, len(turns)))
        else:
            loss_mask.extend([0] * n)
            logprobs.extend([0.0] * n)
            if node.multimodal is not None:
                multimodal.append(node.multimodal)
    if first_response is None or prompt_length is None:
        suffix = "" if name is None else f" (record {name!r})"
        raise ExportError(f"export leaf has no committed response{suffix}", session_id=forest.session_id)
    status: SampleStatus = "truncated" if isinstance(leaf, ObservationNode) else leaf.status
    root = forest.subtree_root(leaf)
    metadata = copy.deepcopy(dataset_metadata) if dataset_metadata else {}
    metadata.update(copy.deepcopy(export_metadata))
    metadata.setdefault("start_rollout_id", first_response.rollout_id)
    metadata["tools"] = copy_json(list(root.tools or ()), "tools")
    metadata["chat_template_kwargs"] = copy_json(root.template_kwargs or {}, "chat_template_kwargs")
    wall_s = sum(t["wall_s"] for t in turns)
    generation_s = sum(t["generation_s"] for t in turns)
    metadata[TRACE_KEY] = {
        "session_id": forest.session_id,
        "leaf_state_hash": leaf.state_hash,
        "terminal_status": status,
        "turn_count": len(turns),
        "wall_s": wall_s,
        "generation_s": generation_s,
        "non_generation_s": wall_s - generation_s,
        "turns": turns,
    }
    metadata["rollout_turns"] = len(turns)
    return TrainingSample(
        name=name,
        session_id=forest.session_id,
        token_ids=token_ids,
        prompt_length=prompt_length,
        loss_mask=loss_mask,
        rollout_logprobs=logprobs,
        reward=copy.deepcopy(reward),
        status=status,
        weight_versions=spans,
        metadata=metadata,
        rollout_token_ids=rollout_ids,
        multimodal_inputs=multimodal,
        export_metadata=copy.deepcopy(export_metadata),
    )


def _turn(node: ResponseNode, index: int) -> dict[str, Any]:
    return {
        "turn_idx": index,
        "resp_state_hash": node.state_hash,
        "parent_state_hash": node.parent_hash,
        "request_id": node.request_id,
        "rollout_id": node.rollout_id,
        "abort_count": node.abort_count,
        "status": node.status,
        "finish_reason": node.finish_reason,
        "response_length": len(node.token_ids),
        "wall_s": node.wall_s,
        "generation_s": node.generation_s,
        "weight_versions": [span.version for span in node.weight_versions],
    }
