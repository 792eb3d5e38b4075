"""A Session's timeline as the dashboard draws it: one row per request branch, spans per request.

:func:`session_timeline` reads a Session's recorded events (:mod:`relaxtrio.nursery.timeline`)
and its forest, and returns JSON-ready data (docs/dashboard.md#session-timeline). All the work
happens here, when the operator asks, never on the request path. Times are seconds since the
Session's first kept event.

Each request (one ``turn`` event, or ``attempt`` events of one still generating) becomes a bar
made of spans: ``queued`` (waiting at the generation gate: the Runtime lease, the first-request
barrier, or a partial-rollout pause) and ``engine`` (one engine call, with the weight versions
that sampled its tokens and its finish type; an aborted call and the call that resumed it are
two engine spans). A request whose engine call raised instead of answering (it failed, or it was
cancelled) *ended* there: its last engine span has finish ``error`` or ``cancelled`` and no
answer follows, so it is not drawn as still generating. A request's *gap* is the time from its answer to the agent's next request
(the agent thinking or running tools). A request's row is the first forest leaf whose lineage
holds its answer; a request whose answer lies on the lineage of more than one leaf is
*shared-prefix* (later branches continued from it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import trio

from ..forest import SessionForest
from ..nursery.session import Session
from ..nursery.timeline import CALL_ENDS

__all__ = ["POINT_EVENTS", "session_timeline"]

POINT_EVENTS: Final = {
    "agent_start": ("pgid",),
    "agent_exit": ("return_code",),
    "lease": ("rollout_id",),
    "barrier": (),
    "pause": ("rollout_id",),
    "resume": ("rollout_id",),
    "export": ("num_contexts",),
    "scored": ("reward", "advantage"),
}
"""Events drawn as marks on the Session's own row, with the names of their fields."""

MIN_QUEUED_S: Final = 1e-3
"""A wait at the generation gate shorter than this is not drawn as a ``queued`` span."""


def _versions(spans: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(s.version for s in spans))


def _request(requests: dict[str, dict[str, Any]], request_id: str) -> dict[str, Any]:
    record = requests.get(request_id)
    if record is None:
        record = requests[request_id] = {
            "request_id": request_id, "arrival_s": None, "committed_s": None, "parent_hash": None,
            "state_hash": None, "prompt_tokens": None, "completion_tokens": None,
            "finish_reason": None, "num_aborted": 0, "weight_versions": [], "spans": [],
            "gap_s": None, "row": None, "shared_prefix": False, "ended": None,
        }
    return record


def _add_attempt(record: dict[str, Any], event: tuple[Any, ...], rel: Any) -> None:
    t, _, _, gate_t, start_t, output_tokens, spans, finish = event
    versions = _versions(spans)
    if start_t - gate_t >= MIN_QUEUED_S:
        record["spans"].append({"kind": "queued", "start_s": rel(gate_t), "end_s": rel(start_t)})
    record["spans"].append({"kind": "engine", "start_s": rel(start_t), "end_s": rel(t),
                            "output_tokens": output_tokens, "weight_versions": versions,
                            "finish": finish})
    record["weight_versions"] = list(dict.fromkeys([*record["weight_versions"], *versions]))
    if record["arrival_s"] is None:
        record["arrival_s"] = rel(gate_t)
    if finish == "abort":
        record["num_aborted"] += 1
    record["ended"] = finish if finish in CALL_ENDS else None  # a later call (a retry) reopens it


def _add_turn(record: dict[str, Any], event: tuple[Any, ...], rel: Any) -> None:
    t, _, _, arrival_t, parent_hash, state_hash, prompt_tokens, completion_tokens, finish = event
    record.update(arrival_s=rel(arrival_t), committed_s=rel(t), parent_hash=parent_hash,
                  state_hash=state_hash, prompt_tokens=prompt_tokens,
                  completion_tokens=completion_tokens, finish_reason=finish)


def _branch_rows(forest: SessionForest, requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assigns each request its row (the first leaf whose lineage holds its answer) and marks
    shared-prefix requests; returns the rows (one per leaf that holds a request)."""
    lineages = []
    for leaf in forest.leaves():
        lineages.append((leaf.state_hash, {n.state_hash for n in forest.lineage(leaf)}))
    used: dict[str, int] = {}
    rows: list[dict[str, Any]] = []
    for record in requests:
        key = record["state_hash"] or record["parent_hash"]
        holders = [leaf for leaf, states in lineages if key in states]
        record["shared_prefix"] = record["state_hash"] is not None and len(holders) > 1
        leaf = holders[0] if holders else f"in-flight:{record['request_id']}"
        if leaf not in used:
            used[leaf] = len(rows)
            rows.append({"leaf_hash": None if leaf.startswith("in-flight:") else leaf})
        record["row"] = used[leaf]
    return rows


def _gaps(requests: Sequence[dict[str, Any]]) -> None:
    """Sets each committed request's ``gap_s``: its answer to the agent's next request."""
    arrivals = sorted(r["arrival_s"] for r in requests if r["arrival_s"] is not None)
    for record in requests:
        done = record["committed_s"]
        if done is None:
            continue
        later = [a for a in arrivals if a >= done]
        record["gap_s"] = later[0] - done if later else None


def session_timeline(session: Session) -> dict[str, Any]:
    """The Session's timeline (see the module docstring).

    Returns:
        ``capacity`` (events kept at most; 0: recording off), ``dropped`` (events forgotten),
        ``now_s`` (the clock now, on the same axis), ``events`` (point events: ``t_s``,
        ``kind`` and the fields of :data:`POINT_EVENTS`), ``rows`` (per branch: ``leaf_hash``,
        None for a request still generating off every leaf) and ``requests`` in arrival order:
        ``request_id``, ``row``, ``shared_prefix``, ``arrival_s``, ``committed_s`` (None while
        generating), ``gap_s``, ``parent_hash``, ``state_hash``, ``prompt_tokens``,
        ``completion_tokens``, ``finish_reason``, ``num_aborted``, ``ended`` (``error`` or
        ``cancelled`` when its last engine call raised and no answer came, else None),
        ``weight_versions`` and
        ``spans`` (``kind`` ``queued`` or ``engine``, ``start_s``, ``end_s``; engine spans add
        ``output_tokens``, ``weight_versions`` and ``finish``).
    """
    timeline = session.timeline
    events = timeline.events()
    try:
        now = trio.current_time()
    except RuntimeError:  # read outside a trio run: the last event is "now"
        now = events[-1][0] if events else 0.0
    origin = events[0][0] if events else now

    def rel(t: float) -> float:
        return t - origin

    points: list[dict[str, Any]] = []
    requests: dict[str, dict[str, Any]] = {}
    for event in events:
        kind = event[1]
        if kind == "attempt":
            _add_attempt(_request(requests, event[2]), event, rel)
        elif kind == "turn":
            _add_turn(_request(requests, event[2]), event, rel)
        elif kind in POINT_EVENTS:
            points.append({"t_s": rel(event[0]), "kind": kind,
                           **dict(zip(POINT_EVENTS[kind], event[2:], strict=False))})
    ordered = sorted(requests.values(), key=lambda r: (r["arrival_s"] is None, r["arrival_s"] or 0.0))
    rows = _branch_rows(session.forest, ordered)
    _gaps(ordered)
    return {"capacity": timeline.capacity, "dropped": timeline.dropped,
            "now_s": rel(now), "events": points, "rows": rows, "requests": ordered}
