"""The run's tracing handle: the span tree run → step → Group → Session → request → engine call.

Stdlib only. The OpenTelemetry SDK is imported by :func:`open_tracing` only when a flag asks for
spans (:mod:`relaxtrio.tracing._otel`); without one, :data:`NO_TRACING` is in effect and every
call here is a cheap no-op.

How the tree is linked: the run's :class:`Tracing` is set in a context variable
(:func:`use_tracing`) before the run starts any task, so every trio task and worker thread of the
run sees it. Parents are explicit where tasks outlive their spawner: a step span parents the
Groups started while it is open (:meth:`Tracing.group_span`), a Group's span parents its
Sessions', and a request finds its Session's span by the Session id's hash. The request span
and a step are *active* (a context variable, per task): an engine call made inside one of them
is its child, and carries a W3C ``traceparent`` header naming it (:meth:`Tracing.engine_call`).
Calls outside any active span (health polls, background control) are not traced.

The Session id is the agent's bearer credential: spans never carry it, only
:func:`session_hash` of it (``relaxtrio.session.hash``). Nor do they carry engine request ids,
which embed it.
"""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final

__all__ = ["NO_TRACING", "Tracing", "current_tracing", "session_hash", "use_tracing"]

SESSION_HASH_CHARS: Final = 16
"""Hex characters of SHA-256 kept in ``relaxtrio.session.hash`` (64 bits: unique within a run,
useless as a credential)."""


def session_hash(session_id: str) -> str:
    """The span attribute standing for a Session id: SHA-256 hex, first 16 characters."""
    return hashlib.sha256(session_id.encode("utf-8")).hexdigest()[:SESSION_HASH_CHARS]


_ACTIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("relaxtrio_active_span", default=None)


def _traceparent(span: Any) -> str:
    """The W3C trace-context header value naming ``span`` (version 00)."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


class Tracing:
    """A run's spans, or none (:data:`NO_TRACING`).

    Args:
        tracer: an OpenTelemetry ``Tracer`` (SDK), or None for no tracing.
        provider: its ``TracerProvider``; :meth:`close` shuts it down (flushing the exporter).

    Spans are started and ended with the SDK's synchronous API on the trio thread; the batch
    exporter (:func:`relaxtrio.tracing.open_tracing`) exports from its own thread.
    """

    def __init__(self, tracer: Any = None, provider: Any = None) -> None:
        self._tracer = tracer
        self._provider = provider
        self._run: Any = None
        self._step: Any = None
        self._groups: dict[str, Any] = {}
        self._sessions: dict[str, Any] = {}

    @property
    def enabled(self) -> bool:
        """Whether spans are recorded."""
        return self._tracer is not None

    def _start(self, name: str, parent: Any, attributes: Mapping[str, Any]) -> Any:
        from opentelemetry import trace  # loaded already: the SDK tracer imported it

        context = None if parent is None else trace.set_span_in_context(parent)
        return self._tracer.start_span(name, context=context, attributes=dict(attributes))

    @contextmanager
    def _span(self, name: str, parent: Any, attributes: Mapping[str, Any], *,
              active: bool = False) -> Iterator[Any]:
        """A span around the block; an exception leaving it marks the span as an error."""
        span = self._start(name, parent, attributes)
        token = _ACTIVE.set(span) if active else None
        try:
            yield span
        except Exception as exc:  # recorded, then re-raised (a cancel just ends the span)
            _record_error(span, exc)
            raise
        finally:
            if token is not None:
                _ACTIVE.reset(token)
            span.end()

    @contextmanager
    def run_span(self, kind: str) -> Iterator[None]:
        """The root span ``relaxtrio.run`` (``kind``: train, rollout or serve)."""
        if not self.enabled:
            yield
            return
        with self._span("relaxtrio.run", None, {"relaxtrio.run.kind": kind}) as span:
            self._run = span
            try:
                yield
            finally:
                self._run = None

    @contextmanager
    def step_span(self, rollout_id: int) -> Iterator[None]:
        """``relaxtrio.step`` under the run span; Groups started meanwhile are its children, and
        engine calls of the step's own task (the weight push) too."""
        if not self.enabled:
            yield
            return
        with self._span("relaxtrio.step", self._run, {"relaxtrio.rollout_id": rollout_id},
                        active=True) as span:
            self._step = span
            try:
                yield
            finally:
                self._step = None

    @contextmanager
    def group_span(self, group_id: str, *, mode: str, num_sessions: int) -> Iterator[None]:
        """``relaxtrio.group`` under the open step (else the run), for the block's duration."""
        if not self.enabled:
            yield
            return
        parent = self._step if self._step is not None else self._run
        attributes = {"relaxtrio.group.id": group_id, "relaxtrio.group.mode": mode,
                      "relaxtrio.group.num_sessions": num_sessions}
        with self._span("relaxtrio.group", parent, attributes) as span:
            self._groups[group_id] = span
            try:
                yield
            finally:
                del self._groups[group_id]

    def start_session(self, session_id: str, *, group_id: str, index: int) -> None:
        """Starts ``relaxtrio.session`` under its Group's span; :meth:`end_session` ends it."""
        if not self.enabled:
            return
        key = session_hash(session_id)
        self._sessions[key] = self._start(
            "relaxtrio.session", self._groups.get(group_id, self._run),
            {"relaxtrio.session.hash": key, "relaxtrio.session.index": index, "relaxtrio.group.id": group_id})

    def end_session(self, session_id: str, *, status: str) -> None:
        """Ends the Session's span with its final ``status`` (completed, failed, cancelled...)."""
        if not self.enabled:
            return
        span = self._sessions.pop(session_hash(session_id), None)
        if span is not None:
            span.set_attribute("relaxtrio.session.status", status)
            span.end()

    @contextmanager
    def request_span(self, session_id: str, attributes: Mapping[str, Any]) -> Iterator[Any]:
        """``relaxtrio.request``: one model request of a Session (its span's child), active for
        the block so the engine calls it makes are its children. Yields the span (None when off)
        for attributes known at the end (:func:`set_attributes`)."""
        if not self.enabled:
            yield None
            return
        key = session_hash(session_id)
        with self._span("relaxtrio.request", self._sessions.get(key, self._run),
                        {"relaxtrio.session.hash": key, **attributes}, active=True) as span:
            yield span

    @contextmanager
    def engine_call(self, method: str, url: str, path: str) -> Iterator[dict[str, str] | None]:
        """``relaxtrio.engine_call`` under the active span; yields the ``traceparent`` header to
        send, or None (tracing off, or no active span: the call is not traced)."""
        parent = _ACTIVE.get() if self._tracer is not None else None
        if parent is None:
            yield None
            return
        attributes = {"http.request.method": method, "server.address": url, "url.path": path}
        with self._span("relaxtrio.engine_call", parent, attributes) as span:
            yield {"traceparent": _traceparent(span)}

    def close(self) -> None:
        """Ends spans still open (Sessions of Groups cut short) and flushes the exporter
        (blocking: call it from a worker thread)."""
        for span in self._sessions.values():
            span.end()
        self._sessions.clear()
        if self._provider is not None:
            self._provider.shutdown()


def _record_error(span: Any, exc: BaseException) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
    span.set_attribute("error.type", type(exc).__name__)


def set_attributes(span: Any, attributes: Mapping[str, Any]) -> None:
    """Adds attributes to a span from :meth:`Tracing.request_span` (nothing when it is None)."""
    if span is not None:
        span.set_attributes(dict(attributes))


NO_TRACING: Final = Tracing()
"""What :func:`current_tracing` returns outside :func:`use_tracing`: records nothing."""

_CURRENT: contextvars.ContextVar[Tracing] = contextvars.ContextVar("relaxtrio_tracing", default=NO_TRACING)


def current_tracing() -> Tracing:
    """The run's :class:`Tracing` (:data:`NO_TRACING` when none was set)."""
    return _CURRENT.get()


@contextmanager
def use_tracing(tracing: Tracing) -> Iterator[Tracing]:
    """Makes ``tracing`` the current one for the block and every task and thread started in it."""
    token = _CURRENT.set(tracing)
    try:
        yield tracing
    finally:
        _CURRENT.reset(token)
