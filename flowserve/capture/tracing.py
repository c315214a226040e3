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

Stages do not go through ``Tracer.start_span`` per request (about 40 us each with context handling,
sampler and attribute validation): capture already chose the requests, so a stage draws span ids from a
fast generator (:func:`new_span_id`), writes the outgoing ``traceparent`` itself, and at the end of the
batch hands finished SDK spans (``ReadableSpan``) straight to the process's span processor
(:func:`export_spans`): a ``BatchSpanProcessor`` with a bounded queue (spans beyond it are dropped and
counted by the SDK, never blocking a stage), or a ``SimpleSpanProcessor`` for ``use_exporter``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("flowserve.tracing")

_lock = threading.Lock()
_provider: Any = None
_processor: Any = None  # the provider's one span processor; stages hand it finished spans
_override: Any = None
_ids = random.Random(int.from_bytes(os.urandom(16), "big"))  # span ids need uniqueness, not secrecy
#: bound of the span queue: beyond it, spans are dropped (counted by the SDK) rather than slowing a stage.
MAX_QUEUE = 16_384


def traces_dir() -> Path:
    root = os.environ.get("FLOWSERVE_TRACES_DIR")
    return Path(root) if root else Path.home() / ".cache" / "flowserve" / "traces"


def use_exporter(exporter: Any) -> None:
    """Send this process's spans to ``exporter`` (synchronously), replacing any earlier choice."""
    global _provider, _processor, _override
    with _lock:
        old, _provider, _processor, _override = _provider, None, None, exporter
    if old is not None:
        old.shutdown()


def _json_exporter() -> Any:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class JsonLinesExporter(SpanExporter):
        """Appends one compact JSON object per span to a file (one file per process)."""

        def __init__(self, path: Path) -> None:
            self.path = path

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            lines = [span_line(s) for s in spans]
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
    global _processor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "flowserve"}), shutdown_on_exit=True)
    _processor = None
    if _override is not None:
        _processor = SimpleSpanProcessor(_override)
        provider.add_span_processor(_processor)
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
    _processor = BatchSpanProcessor(exporter or _json_exporter(), max_queue_size=MAX_QUEUE,
                                    max_export_batch_size=2048, schedule_delay_millis=1000)
    provider.add_span_processor(_processor)
    return provider


def tracer() -> Any:
    """The process's flowserve tracer (created on first use)."""
    global _provider
    with _lock:
        if _provider is None:
            _provider = _make_provider()
        return _provider.get_tracer("flowserve")


def new_span_id() -> int:
    """A random, non-zero 64-bit span id (``random.getrandbits``: ~0.1 us, vs the SDK's ~1 us)."""
    return _ids.getrandbits(64) or 1


def new_trace_id() -> int:
    return _ids.getrandbits(128) or 1


class SpanFactory:
    """Builds finished SDK spans cheaply and hands them to the process's span processor in one call.

    ``span(...)`` returns a ``ReadableSpan`` (what the SDK's exporters take); ``export(spans)`` passes
    them to the processor, which queues them for the exporter thread (or exports at once, in tests).
    """

    def __init__(self) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

        tracer()  # the provider, its resource and processor
        self._span, self._ctx, self._link = ReadableSpan, SpanContext, Link
        self._status, self._error = Status, StatusCode.ERROR
        self._sampled = TraceFlags(TraceFlags.SAMPLED)
        self._resource = _provider.resource
        self._scope = InstrumentationScope("flowserve")

    def context(self, trace_id: int, span_id: int, *, remote: bool = False) -> Any:
        return self._ctx(trace_id, span_id, remote, self._sampled)

    def span(self, name: str, context: Any, parent: Any, start_ns: int, end_ns: int,
             attributes: dict[str, Any], *, links: Sequence[Any] = (), error: str | None = None) -> Any:
        kwargs: dict[str, Any] = {}
        if error is not None:
            kwargs["status"] = self._status(self._error, error[:500])
        return self._span(name, context, parent, self._resource, attributes, (), links,
                          instrumentation_scope=self._scope, start_time=start_ns, end_time=end_ns, **kwargs)

    def link(self, context: Any) -> Any:
        return self._link(context)

    def export(self, spans: Sequence[Any]) -> None:
        processor = _processor
        if processor is None:  # FLOWSERVE_TRACES=off
            return
        for span in spans:
            processor.on_end(span)


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


_dumps = json.JSONEncoder(separators=(",", ":"), default=str).encode


def span_line(span: Any) -> str:
    """:func:`span_dict` as one line of JSON, built directly (the exporter thread's cost, per span)."""
    ctx, parent, links = span.context, span.parent, span.links
    parent_id = f'"{parent.span_id:016x}"' if parent is not None else "null"
    link_text = ",".join(f'{{"trace_id":"{lk.context.trace_id:032x}","span_id":"{lk.context.span_id:016x}"}}'
                         for lk in links) if links else ""
    return (f'{{"name":{_dumps(span.name)},"trace_id":"{ctx.trace_id:032x}","span_id":"{ctx.span_id:016x}",'
            f'"parent_id":{parent_id},"start_ns":{span.start_time},"end_ns":{span.end_time},'
            f'"status":"{span.status.status_code.name}","attributes":{_dumps(dict(span.attributes or {}))},'
            f'"links":[{link_text}]}}')


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
