"""Plain-JSON views of a SessionForest and of TrainingSamples, for debug dumps (docs/dumps.md).

A forest holds running SHA-256 states and cannot be pickled; :func:`forest_to_json` writes what
a person (or a replay) needs instead: every committed node in commit order with its kind, state
hash, parent, delta messages, token ids and counts, response logprobs, weight-version spans,
abort count and timing, plus which nodes are leaves and which were exported. Multimodal payloads
are opaque to the forest: a node only says whether it had one.

:func:`sample_to_json` and :func:`sample_from_json` round-trip a text :class:`TrainingSample`
exactly (token ids, loss mask, logprobs, reward, metadata, weight spans); the media of a
multimodal sample are not written (``num_multimodal_inputs`` says how many there were).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from ._export import TRACE_KEY, TrainingSample
from ._forest import SessionForest
from ._nodes import Node, ObservationNode, ResponseNode, WeightSpan

FOREST_FORMAT: Final = 1
"""Version of the forest and sample JSON layout; bumped on any incompatible change."""


def _spans(spans: Iterable[WeightSpan]) -> list[dict[str, Any]]:
    return [{"version": s.version, "start": s.start, "end": s.end} for s in spans]


def _node_json(node: Node, *, leaf: bool, exported: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "state_hash": node.state_hash,
        "parent_hash": node.parent_hash,
        "kind": node.kind,
        "messages": [dict(m) for m in node.messages],
        "num_tokens": len(node.token_ids),
        "num_train_tokens": node.num_train_tokens,
        "num_messages": node.num_messages,
        "num_responses": node.num_responses,
        "depth": node.depth,
        "abort_count": node.abort_count,
        "token_ids": list(node.token_ids),
        "leaf": leaf,
        "exported": exported,
    }
    if isinstance(node, ObservationNode):
        if tuple(node.rollout_token_ids) != tuple(node.token_ids):
            out["rollout_token_ids"] = list(node.rollout_token_ids)
        out["has_multimodal"] = node.multimodal is not None
        if node.is_subtree_root:
            out["tools"] = [dict(t) for t in node.tools or ()]
            out["template_kwargs"] = dict(node.template_kwargs or {})
    else:
        assert isinstance(node, ResponseNode)
        out.update(
            rollout_logprobs=list(node.rollout_logprobs),
            finish_reason=node.finish_reason,
            weight_versions=_spans(node.weight_versions),
            request_id=node.request_id,
            rollout_id=node.rollout_id,
            wall_s=node.wall_s,
            generation_s=node.generation_s,
        )
    return out


def forest_to_json(forest: SessionForest, *, exported: Iterable[str] = ()) -> dict[str, Any]:
    """A JSON-ready record of every committed state of one Session.

    Args:
        forest: the Session's forest.
        exported: state hashes of the exported contexts' last nodes (the training samples'
            leaves); each must be a committed state.

    Returns:
        ``{"format", "session_id", "max_context_tokens", "num_nodes", "leaves", "exported",
        "nodes"}``; ``nodes`` is in commit order, each with ``state_hash``, ``parent_hash``
        (None under the technical root), ``kind`` (``observation`` or ``response``),
        ``messages`` (the delta), ``token_ids`` and ``num_tokens`` (the delta's training ids),
        cumulative ``num_train_tokens``/``num_messages``/``num_responses``/``depth``,
        ``abort_count``, ``leaf`` and ``exported``; responses add ``rollout_logprobs``,
        ``finish_reason``, ``weight_versions`` (spans relative to the node's ids),
        ``request_id``, ``rollout_id``, ``wall_s`` and ``generation_s``; subtree roots add
        ``tools`` and ``template_kwargs``.

    Raises:
        ValueError: an ``exported`` hash is not a committed state of ``forest``.
    """
    exported_set = dict.fromkeys(exported)
    for state in exported_set:
        if forest.get(state) is None:
            raise ValueError(f"exported state {state!r} is not committed in session {forest.session_id}")
    leaves = [leaf.state_hash for leaf in forest.leaves()]
    leaf_set = set(leaves)
    return {
        "format": FOREST_FORMAT,
        "session_id": forest.session_id,
        "max_context_tokens": forest.max_context_tokens,
        "num_nodes": len(forest),
        "leaves": leaves,
        "exported": list(exported_set),
        "nodes": [
            _node_json(node, leaf=node.state_hash in leaf_set, exported=node.state_hash in exported_set)
            for node in forest.nodes()
        ],
    }


def sample_leaf_hash(sample: TrainingSample) -> str | None:
    """The state hash of the context's last node (recorded in its trace metadata at export)."""
    trace = sample.metadata.get(TRACE_KEY)
    return trace.get("leaf_state_hash") if isinstance(trace, Mapping) else None


def sample_to_json(sample: TrainingSample) -> dict[str, Any]:
    """A JSON-ready record of one sample (media left out, see the module docstring).

    Returns:
        ``name`` (the context name), ``session_id``, ``state_hash`` (the leaf), ``token_ids``,
        ``prompt_length``, ``loss_mask``, ``rollout_logprobs``, ``reward``, ``status``,
        ``weight_versions``, ``metadata``, ``export_metadata``, ``num_multimodal_inputs`` and,
        when they differ from
        ``token_ids``, ``rollout_token_ids``.
    """
    out: dict[str, Any] = {
        "name": sample.name,
        "session_id": sample.session_id,
        "state_hash": sample_leaf_hash(sample),
        "token_ids": list(sample.token_ids),
        "prompt_length": sample.prompt_length,
        "loss_mask": list(sample.loss_mask),
        "rollout_logprobs": list(sample.rollout_logprobs),
        "reward": sample.reward,
        "status": sample.status,
        "weight_versions": _spans(sample.weight_versions),
        "metadata": sample.metadata,
        "export_metadata": sample.export_metadata,
        "num_multimodal_inputs": len(sample.multimodal_inputs),
    }
    if tuple(sample.rollout_token_ids) != tuple(sample.token_ids):
        out["rollout_token_ids"] = list(sample.rollout_token_ids)
    return out


def sample_from_json(record: Mapping[str, Any]) -> TrainingSample:
    """Rebuilds the :class:`TrainingSample` written by :func:`sample_to_json` (without media).

    Raises:
        KeyError: a required field is missing.
        ValueError: the lengths or values break a TrainingSample invariant.
    """
    return TrainingSample(
        name=record["name"],
        session_id=record["session_id"],
        token_ids=record["token_ids"],
        prompt_length=int(record["prompt_length"]),
        loss_mask=record["loss_mask"],
        rollout_logprobs=record["rollout_logprobs"],
        reward=record.get("reward"),
        status=record["status"],
        weight_versions=tuple(
            WeightSpan(str(s["version"]), int(s["start"]), int(s["end"]))
            for s in record.get("weight_versions", ())
        ),
        metadata=dict(record.get("metadata") or {}),
        export_metadata=dict(record.get("export_metadata") or {}),
        rollout_token_ids=record.get("rollout_token_ids", record["token_ids"]),
    )
