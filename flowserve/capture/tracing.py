"""OpenTelemetry spans for stage workers, through the OTel SDK (imported only when tracing is on).

Export, chosen once per process:

- ``use_exporter(exporter)`` (tests: the SDK's ``InMemorySpanExporter``) wins;
- else ``OTEL_EXPORTER_OTLP_ENDPOINT`` set: OTLP over HTTP (``pip install opentelemetry-exporter-otlp-proto-http``;
  without it a warning is logged and the local exporter is used);
- else the local exporter: one JSON object per span appended to
  ``$FLOWSERVE_TRACES_DIR/spans-<pid>.jsonl`` (default ``~/.cache/flowserve/traces``).
  ``FLOWSERVE_TRACES=off`` drops spans instead.

Trace context travels in the W3C ``traceparent`` Kafka header: a stage's per-request span is a child of
the incoming record's traceparent and the records it writes carry that span's traceparent.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("flowserve.tracing")

_lock = threading.Lock()
_provider: Any = None
_override: Any = None


def traces_dir() -> Path:
    root = os.environ.get("FLOWSERVE_TRACES_DIR")
    return Path(root) if root else Path.home() / ".cache" / "flowserve" / "traces"


def use_exporter(exporter: Any) -> None:
    """Send this process's spans to ``exporter`` (synchronously), replacing any earlier choice."""
    global _provider, _override
    with _lock:
        old, _provider, _override = _provider, None, exporter
    if old is not None:
        old.shutdown()


def _json_exporter() -> Any:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class JsonLinesExporter(SpanExporter):
        """Appends one compact JSON object per span to a file (one file per process)."""

        def __init__(self, path: Path) -> None:
            self.path = path

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            lines = [json.dumps(span_dict(s), separators=(",", ":")) for s in spans]
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a") as fh:
                    fh.write("\n".join(lines) + "\n")
            except OSError as exc:
                log.warning("cannot write spans to %s: %s", self.path, exc)
                return SpanExportResult.FAILURE
            return SpanExportResult.SUCCESS

    return JsonLinesExporter(traces_dir() / f"spans-{os.getpid()}.jsonl")


def _make_provider() -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "flowserve"}), shutdown_on_exit=True)
    if _override is not None:
        provider.add_span_processor(SimpleSpanProcessor(_override))
        return provider
    if os.environ.get("FLOWSERVE_TRACES", "").lower() == "off":
        return provider
    exporter: Any = None
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but opentelemetry-exporter-otlp-proto-http is not "
                        "installed; writing spans under %s instead", traces_dir())
        else:
            exporter = OTLPSpanExporter()  # reads the OTEL_EXPORTER_OTLP_* variables
    provider.add_span_processor(BatchSpanProcessor(exporter or _json_exporter(), max_queue_size=65_536,
                                                   max_export_batch_size=4096, schedule_delay_millis=1000))
    return provider


def tracer() -> Any:
    """The process's flowserve tracer (created on first use)."""
    global _provider
    with _lock:
        if _provider is None:
            _provider = _make_provider()
        return _provider.get_tracer("flowserve")


def flush() -> None:
    with _lock:
        provider = _provider
    if provider is not None:
        provider.force_flush()


def parse_traceparent(raw: bytes | str | None) -> tuple[int, int, int] | None:
    """(trace id, parent span id, flags) of a W3C traceparent, or None when absent or malformed."""
    if raw is None:
        return None
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    parts = text.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16 or parts[0] == "ff":
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3][:2], 16)
    except ValueError:
        return None
    if trace_id == 0 or span_id == 0:
        return None
    return trace_id, span_id, flags


def format_traceparent(trace_id: int, span_id: int, flags: int = 1) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


def parent_context(raw: bytes | str | None) -> Any:
    """An OTel context whose current span is the remote parent named by ``raw`` (None: a new trace)."""
    parsed = parse_traceparent(raw)
    if parsed is None:
        return None
    api = _api or _load_api()
    trace_id, span_id, flags = parsed
    ctx = api.SpanContext(trace_id=trace_id, span_id=span_id, is_remote=True, trace_flags=api.TraceFlags(flags | 1))
    return api.set_span_in_context(api.NonRecordingSpan(ctx))


_api: Any = None


def _load_api() -> Any:
    global _api
    import opentelemetry.trace

    _api = opentelemetry.trace
    return _api


def span_dict(span: Any) -> dict[str, Any]:
    """A compact, JSON-ready view of a finished SDK span."""
    ctx = span.context
    return {
        "name": span.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "links": [{"trace_id": f"{lk.context.trace_id:032x}", "span_id": f"{lk.context.span_id:016x}"}
                  for lk in span.links],
    }
