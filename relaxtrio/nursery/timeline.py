"""A Session's timeline: a bounded ring buffer of what happened to it, on the trio clock.

The runtime already knows when an agent started, when its Group got the Runtime lease, when the
first-request barrier passed, when a model request arrived, waited at the generation gate, ran
on the engine, was aborted by a pause and resumed, and when the Session exported and was scored.
:class:`Timeline` keeps those moments so the operator dashboard can draw them
(docs/dashboard.md#session-timeline); :mod:`relaxtrio.rollout.timeline_view` turns them into rows.

Recording is meant to cost nothing measurable on the request path: one small tuple appended to a
``collections.deque`` of fixed length (the oldest event falls out), no formatting, no lookups;
everything else happens when the operator reads the view. :func:`set_default_capacity` bounds
the buffer of Sessions created afterwards (0 turns recording off; the benchmark compares both).

Each event is ``(t, kind, *fields)`` with ``t`` the trio clock (seconds) when it was recorded:

* ``agent_start`` (pgid): the agent process started;
* ``agent_exit`` (return_code);
* ``lease`` (rollout_id): the Group got the Runtime lease for that step;
* ``barrier`` (): every Session of the Group sent its first request (Runtime starts);
* ``pause`` (rollout_id) / ``resume`` (rollout_id): partial rollout paused the Group at a step's
  close / resumed it in that step;
* ``attempt`` (request_id, gate_t, start_t, output_tokens, weight_spans, finish): one engine
  call of a request ends: waited at the generation gate from ``gate_t``, ran on the engine from
  ``start_t`` to ``t``; ``weight_spans`` are the engine's weight-version spans, ``finish`` the
  engine's finish type (``abort`` when a pause cut it). A call that raised instead of answering
  ends with an ``attempt`` too: no tokens, no weight spans, and finish ``error`` (the engine
  call failed: every worker refused or died) or ``cancelled`` (the request was cancelled, e.g.
  its agent disconnected or its Group was dropped) (:func:`call_end`);
* ``turn`` (request_id, arrival_t, parent_hash, state_hash, prompt_tokens, completion_tokens,
  finish_reason): a request's answer was committed;
* ``export`` (num_contexts): the Session exported its training contexts;
* ``scored`` (reward, advantage): one exported context was scored (its step accepted the Group).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final

import trio

from .turns import call_end

__all__ = ["CALL_ENDS", "DEFAULT_CAPACITY", "Timeline", "call_end", "default_capacity", "set_default_capacity"]

DEFAULT_CAPACITY: Final = 512
"""Events a Session keeps by default (a few per request: about 150 requests' worth)."""

_capacity = DEFAULT_CAPACITY

CALL_ENDS: Final = ("error", "cancelled")
"""The ``finish`` of an ``attempt`` whose engine call raised instead of answering."""


def set_default_capacity(events: int) -> None:
    """Bounds the timeline of every Session created from now on to ``events`` (0: none kept).

    Raises:
        ValueError: ``events`` is negative.
    """
    global _capacity
    if events < 0:
        raise ValueError(f"timeline capacity must be >= 0, got {events}")
    _capacity = events


def default_capacity() -> int:
    """The bound new Sessions get (see :func:`set_default_capacity`)."""
    return _capacity


class Timeline:
    """One Session's recent events (see the module docstring); bounded, oldest dropped first."""

    __slots__ = ("_events", "dropped")

    def __init__(self, capacity: int | None = None) -> None:
        """Args:
            capacity: events kept; None: :func:`default_capacity`; 0: recording is off.
        """
        size = _capacity if capacity is None else capacity
        self._events: deque[tuple[Any, ...]] | None = deque(maxlen=size) if size > 0 else None
        self.dropped = 0

    @property
    def capacity(self) -> int:
        """Events kept at most (0: recording is off)."""
        return 0 if self._events is None else self._events.maxlen or 0

    def add(self, kind: str, *fields: Any) -> None:
        """Records ``(now, kind, *fields)``; a full buffer forgets its oldest event. Outside a
        trio run (a synchronous caller, e.g. a test scoring Groups) there is no trio clock and
        nothing is recorded."""
        events = self._events
        if events is None:
            return
        try:
            now = trio.current_time()
        except RuntimeError:
            return
        if len(events) == events.maxlen:
            self.dropped += 1
        events.append((now, kind, *fields))

    def events(self) -> tuple[tuple[Any, ...], ...]:
        """The kept events, oldest first."""
        return () if self._events is None else tuple(self._events)
