"""The OpenTelemetry SDK side of tracing: the provider, the OTLP/HTTP and JSON-lines exporters.

Imported only by :func:`relaxtrio.tracing.open_tracing` when ``--otel-endpoint`` or
``--otel-file`` is given (the ``otel`` extra: ``opentelemetry-sdk`` and
``opentelemetry-exporter-otlp-proto-http``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

__all__ = ["JsonLinesSpanExporter", "make_provider"]


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """One span as a JSON object: names, ids (hex), parent id, times (ns), attributes, status."""
    ctx = span.get_span_context()
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_span_id": None if span.parent is None else f"{span.parent.span_id:016x}",
        "start_time_ns": span.start_time,
        "end_time_ns": span.end_time,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
    }


class JsonLinesSpanExporter(SpanExporter):
    """Appends each finished span to a file as one JSON line (:func:`span_record`).

    Runs in the batch processor's thread, never on the trio thread.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Writes ``spans`` and flushes."""
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.writelines(json.dumps(span_record(s), sort_keys=True) + "\n" for s in spans)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Closes the file."""
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """The file is flushed after every export already."""
        return True


def make_provider(*, service_name: str, endpoint: str | None = None, file: Path | None = None,
                  exporter: SpanExporter | None = None) -> TracerProvider:
    """A tracer provider exporting to the OTLP/HTTP ``endpoint`` and/or the JSON-lines ``file``
    through batch processors (their own threads), plus ``exporter`` synchronously (tests: the
    SDK's in-memory exporter)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if endpoint is not None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    if file is not None:
        provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(file)))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider
