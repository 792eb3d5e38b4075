"""What the operator listener shows of a running job: Groups, Sessions, requests, agents, steps.

:class:`RunView` is the source behind ``/debug_state`` and ``/dashboard``
(:mod:`relaxtrio.api.operator`, docs/dashboard.md). It reads live state only (nothing here
changes a Group or a Session) and returns JSON-ready dicts:

* :meth:`RunView.debug_state`: totals, the pipeline's snapshot keys (:func:`pipeline_snapshot`),
  every Group the job holds now or accounted for in its last step, each with its Sessions (id,
  state, turn, request and abort counts, in-flight engine requests, agent process), the in-flight
  requests and the live agent processes;
* :meth:`RunView.session_detail`: one Session's dump record (:func:`~relaxtrio.rollout.dumps.session_record`:
  metadata and the whole forest, exported leaves and weight versions included) and its
  timeline (:func:`~relaxtrio.rollout.timeline_view.session_timeline`);
* :meth:`RunView.group_detail`: one Group's Sessions side by side
  (:func:`~relaxtrio.rollout.group_view.group_comparison`);
* :meth:`RunView.steps`: per finished step, the reward mean, step seconds and generated tokens
  per second, the series the dashboard plots; :meth:`RunView.metrics`: the steps'
  ``metrics.jsonl`` rows as written (the step view reads them, never recomputes).

The view lists Session ids: it is served only on the operator listener, behind the operator
token, never where agents can reach it (docs/dashboard.md#access).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from ..nursery.group import Group
from ..nursery.session import Session
from .accounting import GroupStages
from .dumps import jsonable, session_record
from .group_view import group_comparison
from .pipeline import RolloutPipeline
from .step import ScoredGroup, StepResult
from .timeline_view import session_timeline

SNAPSHOT_KEYS: Final = (
    "active_rollout_id",
    "warming_prepare_group_count",
    "ready_prepare_group_count",
    "prepare_group_count",
    "runtime_reward_group_count",
    "finalized_group_count",
    "resident_group_count",
    "interrupted_runtime_group_count",
)
"""The pipeline snapshot keys, in the order ``/debug_state`` lists them."""

MAX_STEPS_KEPT: Final = 10_000
"""Step rows the view keeps for the plots (older ones are dropped first)."""


def pipeline_snapshot(pipeline: RolloutPipeline, *, finalized: int) -> dict[str, int]:
    """The pipeline's Group counts by stage.

    Prepare Groups hold a permit but no lease (prelaunched): *warming* while some Session has
    not sent its first request, *ready* once all have. Runtime/reward Groups are leased and
    resident, or ended and waiting to be scored. Interrupted Groups are resident and paused
    (partial rollout between steps). The counts are :meth:`RolloutPipeline.group_stages`, the
    ones the heartbeat's snapshot logs (:mod:`relaxtrio.rollout.accounting`).

    Args:
        pipeline: the rollout pipeline.
        finalized: Groups scored in the steps finished so far.

    Returns:
        One int per :data:`SNAPSHOT_KEYS` entry.
    """
    return snapshot_fields(pipeline.group_stages(), active_rollout_id=pipeline.rollout_id, finalized=finalized)


def snapshot_fields(stages: GroupStages, *, active_rollout_id: int, finalized: int) -> dict[str, int]:
    """The :data:`SNAPSHOT_KEYS` of ``stages`` (see :func:`pipeline_snapshot`)."""
    return {
        "active_rollout_id": active_rollout_id,
        "warming_prepare_group_count": stages.prepare - stages.prepare_ready,
        "ready_prepare_group_count": stages.prepare_ready,
        "prepare_group_count": stages.prepare,
        "runtime_reward_group_count": stages.leased + stages.finished,
        "finalized_group_count": finalized,
        "resident_group_count": stages.resident,
        "interrupted_runtime_group_count": stages.interrupted,
    }


def _agent_alive(session: Session) -> bool:
    return session.agent_pgid is not None and session.agent_return_code is None and not session.ended


def _session_row(session: Session) -> dict[str, Any]:
    partial = session.partial.statistics()
    nodes = list(session.forest.nodes())
    return {
        "session_id": session.session_id,
        "index": session.index,
        "status": session.status,
        "reason": session.error,
        "num_requests": session.num_requests,
        "turn_count": sum(1 for n in nodes if n.kind == "response"),
        "num_aborted": partial.num_aborted,
        "paused": partial.paused,
        "protected": partial.protected,
        "inflight_rids": list(partial.inflight_rids),
        "forest_nodes": len(nodes),
        "num_samples": len(session.samples),
        "agent_pgid": session.agent_pgid,
        "agent_alive": _agent_alive(session),
        "agent_return_code": session.agent_return_code,
    }


def _group_state(group: Group, accepted: bool) -> str:
    if group.dropped:
        return "dropped"
    if group.finished:
        return "accepted" if accepted else "finished"
    if group.paused:
        return "interrupted"
    return "runtime" if group.leased else "prepare"


def _group_row(group: Group, *, accepted: bool = False) -> dict[str, Any]:
    sessions = [_session_row(s) for s in group.sessions]
    return {
        "group_id": group.group_id,
        "mode": group.mode,
        "prompt_index": group.prompt_index,
        "rollout_id": group.rollout_id,
        "state": _group_state(group, accepted),
        "leased": group.leased,
        "paused": group.paused,
        "barrier_passed": group.barrier_passed,
        "dropped_reason": group.dropped_reason,
        "live_session_count": sum(1 for s in group.sessions if not s.ended),
        "inflight_request_count": sum(len(s["inflight_rids"]) for s in sessions),
        "live_process_count": sum(1 for s in sessions if s["agent_alive"]),
        "sessions": sessions,
    }


@attrs.define(eq=False, kw_only=True)
class RunView:
    """The operator's read-only view of one job (a training run, a rollout-only run or a serve).

    Attributes:
        kind: ``train``, ``rollout`` or ``serve`` (shown on the dashboard).
        pipeline: the rollout pipeline once open (:meth:`attach`), else None.
    """

    kind: str = "train"
    pipeline: RolloutPipeline | None = None
    _watched: list[Group] = attrs.field(factory=list)
    _last_accepted: list[Group] = attrs.field(factory=list)
    _last_scored: dict[int, ScoredGroup] = attrs.field(factory=dict)
    _metrics: list[dict[str, Any]] = attrs.field(factory=list)
    _last_dropped: list[Group] = attrs.field(factory=list)
    _steps: list[dict[str, Any]] = attrs.field(factory=list)
    _finalized: int = 0

    def attach(self, pipeline: RolloutPipeline) -> None:
        """Shows ``pipeline``'s resident Groups and snapshot from now on."""
        self.pipeline = pipeline

    def watch(self, groups: Iterable[Group]) -> None:
        """Shows ``groups`` for as long as the view lives (serve's Groups)."""
        self._watched.extend(groups)

    def note_step(self, result: StepResult, *, step_s: float) -> None:
        """Records a finished step: its Groups stay listed until the next step, and its row is
        added to the plotted series.

        Args:
            result: the step's result.
            step_s: wall seconds of the whole step (rollout, update, weight push).
        """
        self._last_accepted = [g.group for g in result.groups]
        self._last_scored = {id(g.group): g for g in result.groups}
        self._last_dropped = list(result.dropped)
        self._finalized += len(result.groups)
        rewards = [s.reward for s in result.scored if s.reward is not None and math.isfinite(s.reward)]
        response_tokens = sum(sum(s.loss_mask) for s in result.samples)
        self._steps.append({
            "step": result.rollout_id,
            "reward_mean": sum(rewards) / len(rewards) if rewards else None,
            "step_s": step_s,
            "rollout_s": result.rollout_s,
            "response_tokens": response_tokens,
            "tokens_per_s": response_tokens / result.rollout_s if result.rollout_s > 0 else None,
            "num_groups": len(result.groups),
            "dropped_groups": len(result.dropped),
        })
        del self._steps[:-MAX_STEPS_KEPT]

    def note_metrics(self, row: Mapping[str, Any]) -> None:
        """Keeps a step's ``metrics.jsonl`` row exactly as written (the step view shows it)."""
        self._metrics.append(dict(row))
        del self._metrics[:-MAX_STEPS_KEPT]

    def _groups(self) -> list[tuple[Group, bool]]:
        """Every Group to show, once each, with whether its step accepted it."""
        seen: dict[int, tuple[Group, bool]] = {}
        accepted = {id(g) for g in self._last_accepted}
        live = list(self.pipeline.held_groups) if self.pipeline is not None else []
        for group in [*self._watched, *self._last_accepted, *self._last_dropped, *live]:
            seen.setdefault(id(group), (group, id(group) in accepted))
        return list(seen.values())

    def debug_state(self) -> dict[str, Any]:
        """The whole current state (see the module docstring).

        Returns:
            ``kind``, ``totals`` (``group_count``, ``session_count``, ``live_session_count``,
            ``inflight_request_count``, ``live_process_count``), ``pipeline`` (the snapshot
            keys, or None without a pipeline), ``groups``, ``inflight_requests`` (session id
            and engine request id) and ``live_agents`` (session id, group id, process group id).
        """
        groups = [_group_row(g, accepted=a) for g, a in self._groups()]
        sessions = [(g["group_id"], s) for g in groups for s in g["sessions"]]
        return jsonable({
            "kind": self.kind,
            "totals": {
                "group_count": len(groups),
                "session_count": len(sessions),
                "live_session_count": sum(g["live_session_count"] for g in groups),
                "inflight_request_count": sum(len(s["inflight_rids"]) for _, s in sessions),
                "live_process_count": sum(1 for _, s in sessions if s["agent_alive"]),
            },
            "pipeline": (pipeline_snapshot(self.pipeline, finalized=self._finalized)
                         if self.pipeline is not None else None),
            "groups": groups,
            "inflight_requests": [{"session_id": s["session_id"], "request_id": rid}
                                  for _, s in sessions for rid in s["inflight_rids"]],
            "live_agents": [{"session_id": s["session_id"], "group_id": gid, "pgid": s["agent_pgid"]}
                            for gid, s in sessions if s["agent_alive"]],
        })

    def session_detail(self, session_id: str) -> dict[str, Any] | None:
        """One shown Session's dump record (forest included) with its ``timeline``, or None if
        no shown Group has it."""
        for group, _ in self._groups():
            for session in group.sessions:
                if session.session_id == session_id:
                    return jsonable({**session_record(session), "timeline": session_timeline(session)})
        return None

    def group_detail(self, group_id: str) -> dict[str, Any] | None:
        """One shown Group's comparison (:func:`group_comparison`), or None if not shown."""
        for group, _ in self._groups():
            if group.group_id == group_id:
                return jsonable(group_comparison(group, self._last_scored.get(id(group))))
        return None

    def metrics(self) -> list[Mapping[str, Any]]:
        """The steps' ``metrics.jsonl`` rows, oldest first (see :meth:`note_metrics`)."""
        return jsonable(self._metrics)

    def steps(self) -> list[Mapping[str, Any]]:
        """The finished steps' plotted rows, oldest first (see :meth:`note_step`)."""
        return jsonable(self._steps)
