"""Which leaves implicit export trains: the ``--agentic-export-policy`` rules.

See docs/export-and-credit.md#export-policies. Harnesses that branch by design (mini-swe-agent
drops an unparsable reply and resends the history with a format-error message; opencode sends a
title request with its own system prompt) leave several leaves in a Session's forest. The policy
decides what implicit export (no JSONL records) makes of them:

* ``strict`` (the default, the contract's rule): a strictly linear history, exactly one leaf and
  its lineage holds a response, else the Session fails its export (and its Group is dropped);
  one exportable leaf next to any other leaf is still nonlinear;
* ``final``: the lineage ending in the Session's last response of its *main* subtree; every other
  leaf is reported, not trained. The main subtree is the one with the most response nodes (ties:
  the most generated tokens, then the latest answer), so a side conversation in a subtree of its
  own (another system prompt, e.g. a title request) never becomes the trained context, however
  late it is answered;
* ``all-leaves``: every leaf with a response is a context (named ``leaf-<i>`` in leaf order); more
  than one context per Session needs a custom advantage function, like any multi-context export.

Under every policy, a response leaf whose answer never reached the agent (its client timed out or
went away, and no retry took the answer; the caller passes their state hashes as ``undelivered``,
from :meth:`~relaxtrio.nursery.retries.RetryLedger.undelivered_states`) is not part of the agent's
history: it is a side leaf, reported in :attr:`LeafSelection.undelivered` and never a context, so an
agent that timed out and asked again with a changed request keeps its linear history
(docs/agent-contract.md#undelivered-answers).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Final, Literal

import attrs

from .._errors import ExportError
from ._forest import SessionForest
from ._nodes import Node, ResponseNode

ExportPolicy = Literal["strict", "final", "all-leaves"]
EXPORT_POLICIES: Final[tuple[ExportPolicy, ...]] = ("strict", "final", "all-leaves")


@attrs.frozen(kw_only=True)
class LeafSelection:
    """The states implicit export trains, and the leaves it leaves out.

    Attributes:
        contexts: ``(name, node)`` per exported context; the name is None except under
            ``all-leaves``.
        dropped_branches: leaves with a response in the trained subtree that are not trained
            (``final`` only).
        side_leaves: leaves with a response in other subtrees (``final`` only).
        undelivered: response leaves whose answer never reached the agent (any policy).
    """

    contexts: tuple[tuple[str | None, Node], ...]
    dropped_branches: tuple[Node, ...] = ()
    side_leaves: tuple[Node, ...] = ()
    undelivered: tuple[Node, ...] = ()

    @property
    def num_unexported_leaves(self) -> int:
        """Leaves with a response that are not trained."""
        return len(self.dropped_branches) + len(self.side_leaves) + len(self.undelivered)


def select_leaves(forest: SessionForest, policy: ExportPolicy = "strict",
                  undelivered: Collection[str] = frozenset()) -> LeafSelection:
    """The contexts implicit export builds under ``policy``.

    Args:
        forest: the finished Session's forest.
        policy: ``strict``, ``final`` or ``all-leaves``.
        undelivered: state hashes of response nodes whose answer no client received; such a
            leaf is left out of the history the policy reads (module docstring).

    Returns:
        The selection; ``contexts`` is never empty.

    Raises:
        ExportError: no leaf holds a response (``num_leaves == 0``), or ``strict`` found
            several (``num_leaves == N``) or a nonlinear history (``implicit export requires a
            linear history``); an unknown policy.
    """
    leaves: list[Node] = []
    unseen: list[Node] = []
    for leaf in forest.leaves():
        (unseen if leaf.state_hash in undelivered and isinstance(leaf, ResponseNode) else leaves).append(leaf)
    candidates = [leaf for leaf in leaves if leaf.num_responses > 0]
    if policy not in EXPORT_POLICIES:
        raise ExportError(f"unknown export policy {policy!r}", param="agentic_export_policy")
    if policy == "strict" or not candidates:
        if len(candidates) != 1:
            raise ExportError(_one_leaf_message(len(candidates)), num_leaves=len(candidates),
                              session_id=forest.session_id)
        if policy == "strict" and len(leaves) > 1:
            raise ExportError(
                f"implicit export requires a linear history, but the Forest has {len(leaves)} "
                "leaves (branches or subtrees); any nonlinear history requires explicit export "
                "(or --agentic-export-policy final), even with one exportable leaf: write a "
                "named record for each context to train",
                session_id=forest.session_id,
            )
        return LeafSelection(contexts=((None, candidates[0]),), undelivered=tuple(unseen))
    if policy == "all-leaves":
        return LeafSelection(contexts=tuple((f"leaf-{i}", leaf) for i, leaf in enumerate(candidates)),
                             undelivered=tuple(unseen))
    final = _final_response(forest, {leaf.state_hash for leaf in unseen})
    main_root = forest.subtree_root(final).state_hash
    dropped: list[Node] = []
    side: list[Node] = []
    for leaf in candidates:
        if any(node.state_hash == final.state_hash for node in forest.lineage(leaf)):
            continue  # the final response itself, or an observation that only follows it
        in_main = forest.subtree_root(leaf).state_hash == main_root
        (dropped if in_main else side).append(leaf)
    return LeafSelection(contexts=((None, final),), dropped_branches=tuple(dropped), side_leaves=tuple(side),
                         undelivered=tuple(unseen))


def _one_leaf_message(num_leaves: int) -> str:
    """``implicit export requires one committed leaf, found N``; for N >= 2 also what happened
    (the requests branched) and the ways out: explicit records, or another export policy."""
    message = f"implicit export requires one committed leaf, found {num_leaves}"
    if num_leaves < 2:
        return message
    return (f"{message}: the Session's requests branched into {num_leaves} separate conversations "
            "(a request that does not continue an earlier answered history starts a new one). "
            "Export explicitly (one named JSONL record per context to train, written to "
            "RELAX_OUTPUT_JSON), or pass --agentic-export-policy final (train only the last "
            "answered conversation) or all-leaves (each conversation a context); training several "
            "contexts per Session needs --agentic-custom-advantage-path")


def _final_response(forest: SessionForest, unseen: Collection[str]) -> ResponseNode:
    """The last answered response of the main subtree (see the module docstring), among the
    responses the agent received (``unseen``: the undelivered leaves' hashes)."""
    answered = [node for node in forest.responses_in_answer_order() if node.state_hash not in unseen]
    count: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    last: dict[str, int] = {}
    for order, node in enumerate(answered):
        root = forest.subtree_root(node).state_hash
        count[root] += 1
        tokens[root] += len(node.token_ids)
        last[root] = order
    main = max(count, key=lambda root: (count[root], tokens[root], last[root]))
    return answered[last[main]]
