"""OpenTelemetry spans of a run (``--otel-endpoint`` / ``--otel-file``): run → step → Group →
Session → request → engine call, with the W3C ``traceparent`` sent to the engines and the gateway.

Stdlib only at import; the SDK (the ``otel`` extra) is imported by :func:`open_tracing` when a
flag asks for spans. Every package that opens a span imports this one; it imports no relaxtrio
package. See :mod:`relaxtrio.tracing._spans` for how the tree is linked and docs/observability.md.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from .._errors import ConfigError
from ._spans import NO_TRACING as NO_TRACING
from ._spans import Tracing as Tracing
from ._spans import current_tracing as current_tracing
from ._spans import session_hash as session_hash
from ._spans import set_attributes as set_attributes
from ._spans import use_tracing as use_tracing

__all__ = ["NO_TRACING", "Tracing", "current_tracing", "open_tracing", "session_hash",
           "set_attributes", "trace_run", "use_tracing"]


def open_tracing(*, endpoint: str | None = None, file: Path | None = None, exporter: Any = None,
                 service_name: str = "relaxtrio") -> Tracing:
    """The run's :class:`Tracing`: :data:`NO_TRACING` (nothing imported) when no destination is
    given, else spans exported to the OTLP/HTTP ``endpoint`` (e.g.
    ``http://collector:4318/v1/traces``) and/or appended to ``file`` as JSON lines, and to
    ``exporter`` (an SDK ``SpanExporter``, exported synchronously: tests).

    Raises:
        ConfigError: the SDK is not installed (``pip install 'relaxtrio[otel]'``).
    """
    if endpoint is None and file is None and exporter is None:
        return NO_TRACING
    try:
        from ._otel import make_provider
    except ImportError as exc:
        raise ConfigError("--otel-endpoint / --otel-file need the OpenTelemetry SDK: "
                          "pip install 'relaxtrio[otel]'", param="--otel-endpoint") from exc
    provider = make_provider(service_name=service_name, endpoint=endpoint, file=file, exporter=exporter)
    return Tracing(provider.get_tracer("relaxtrio"), provider)


@asynccontextmanager
async def trace_run(kind: str, *, endpoint: str | None = None, file: Path | None = None,
                    exporter: Any = None) -> AsyncIterator[Tracing]:
    """The run's tracing for the block: :func:`open_tracing`, made current (:func:`use_tracing`)
    under a ``relaxtrio.run`` span of ``kind`` (train, rollout or serve), flushed on exit.

    Raises:
        ConfigError: as :func:`open_tracing`.

    Cancellation:
        On exit the exporter is flushed in a worker thread, shielded.
    """
    tracing = open_tracing(endpoint=endpoint, file=file, exporter=exporter)
    try:
        with use_tracing(tracing), tracing.run_span(kind):
            yield tracing
    finally:
        if tracing.enabled:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(tracing.close)
