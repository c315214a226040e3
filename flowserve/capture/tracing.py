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

Stages do not go through ``Tracer.start_span`` per request (context handling, the sampler and attribute
validation cost more per request than the stage's own work): capture already chose the requests, so a
stage draws a batch's span ids in one call (:func:`new_span_ids`, hex text), writes the outgoing
``traceparent`` itself, and at the end of the batch hands the whole batch's spans to its
:class:`StageSpans` in one call. With the local exporter the span lines are formatted right there (one
f-string per span around the batch's common parts, no SDK objects, nothing the garbage collector tracks)
and appended to a buffer written out every second or 256 KB; SDK spans queued for an exporter thread
would churn objects for the collector and add a second thread contending for the GIL.
With ``use_exporter`` or OTLP the same batch becomes SDK ``ReadableSpan`` objects handed to the SDK's span
processor (a ``BatchSpanProcessor`` with a bounded queue for OTLP: spans beyond it are dropped and
counted by the SDK, never blocking a stage; a ``SimpleSpanProcessor`` for ``use_exporter``).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import random
import threading
import time
from collections.abc import Sequence
from json.encoder import encode_basestring_ascii as _jstr
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
    global _provider, _processor, _override, _mode
    _local.flush()
    with _lock:
        old, _provider, _processor, _override, _mode = _provider, None, None, exporter, None
    if old is not None:
        old.shutdown()


#: how stages export, chosen on first use: "sdk" (use_exporter or OTLP), "local" (JSON lines) or "off".
_mode: str | None = None


def _choose_mode() -> str:
    global _mode
    if _override is not None or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        _mode = "sdk"
    elif os.environ.get("FLOWSERVE_TRACES", "").lower() == "off":
        _mode = "off"
    else:
        _mode = "local"
        _local.open(traces_dir() / f"spans-{os.getpid()}.jsonl")
    return _mode


class _LocalSink:
    """Span lines buffered in memory and appended to this process's file every second or 256 KB."""

    FLUSH_BYTES = 256 * 1024
    FLUSH_S = 1.0

    def __init__(self) -> None:
        self.path: Path | None = None
        self._parts: list[str] = []
        self._size = 0
        self._due = 0.0
        self._lock = threading.Lock()

    def open(self, path: Path) -> None:
        self.flush()
        self.path = path

    def write(self, text: str) -> None:
        with self._lock:
            self._parts.append(text)
            self._size += len(text)
            if self._size < self.FLUSH_BYTES and time.monotonic() < self._due:
                return
        self.flush()

    def flush(self) -> None:
        with self._lock:
            parts, self._parts, self._size = self._parts, [], 0
            self._due = time.monotonic() + self.FLUSH_S
            if not parts or self.path is None:
                return
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a") as fh:
                    fh.write("".join(parts))
            except OSError as exc:
                log.warning("cannot write spans to %s: %s", self.path, exc)


_local = _LocalSink()
atexit.register(_local.flush)


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


def new_span_id() -> str:
    """A random, non-zero 64-bit span id as 16 lowercase hex digits (``random.getrandbits``: ~0.1 us, vs the
    SDK's ~1 us)."""
    return "%016x" % (_ids.getrandbits(64) or 1)


def new_trace_id() -> str:
    """A random, non-zero 128-bit trace id as 32 lowercase hex digits."""
    return "%032x" % (_ids.getrandbits(128) or 1)


def new_span_ids(n: int) -> list[str]:
    """``n`` random, non-zero 64-bit span ids as 16 lowercase hex digits: one draw and one format for all."""
    if n <= 0:
        return []
    text = f"{_ids.getrandbits(64 * n):0{16 * n}x}"
    ids = [text[i:i + 16] for i in range(0, 16 * n, 16)]
    return [s if s != _ZERO_SPAN else "0000000000000001" for s in ids] if _ZERO_SPAN in text else ids


_ZERO_SPAN = "0" * 16


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


class StageSpans:
    """A stage's spans, exported one batch at a time: a span per request, one per batch linked to them.

    :meth:`batch` takes parallel lists of plain strings: the request ids as JSON strings and the trace,
    span and parent span ids as lowercase hex ("" for no parent); see the module docstring for the paths.
    """

    def __init__(self, node: str, topology: str) -> None:
        self.node = node
        self.attrs = {"fs.node": node, "fs.topology": topology}
        self._head = f'{{"name":{_jstr(node)},"trace_id":"'
        self._batch_name = _jstr(f"{node}.batch")
        self._attrs_head = _dumps(self.attrs)[:-1]
        self._factory: SpanFactory | None = None

    def batch(self, batch_id: str, size: int, start_ns: int, end_ns: int, rids: Sequence[str],
              trace_ids: Sequence[str], span_ids: Sequence[str], parent_ids: Sequence[str],
              errors: Sequence[str | None] | None = None, batch_error: str | None = None) -> int:
        """Export one batch's spans; returns how many (0 when tracing output is off)."""
        mode = _mode or _choose_mode()
        if mode == "off":
            return 0
        if mode == "sdk":
            return self._sdk(batch_id, size, start_ns, end_ns, rids, trace_ids, span_ids, parent_ids, errors,
                             batch_error)
        # Each request's line is its own ids between parts that are the same for the whole batch.
        head = self._head
        times = f',"start_ns":{start_ns},"end_ns":{end_ns},"status":"'
        ok, bad = times + 'UNSET","attributes":{"fs.request_id":', times + 'ERROR","attributes":{"fs.request_id":'
        parts = []
        for i, rid in enumerate(rids):
            parent = parent_ids[i]
            parent_text = f'"{parent}"' if parent else "null"
            rest = bad if errors is not None and errors[i] is not None else ok
            parts.append(f'{head}{trace_ids[i]}","span_id":"{span_ids[i]}","parent_id":{parent_text}{rest}{rid}}},'
                         f'"links":[]}}\n')
        links = ",".join([f'{{"trace_id":"{t}","span_id":"{s}"}}' for t, s in zip(trace_ids, span_ids, strict=True)])
        parts.append(f'{{"name":{self._batch_name},"trace_id":"{new_trace_id()}","span_id":"{new_span_id()}",'
                     f'"parent_id":null,"start_ns":{start_ns},"end_ns":{end_ns},'
                     f'"status":"{"ERROR" if batch_error is not None else "UNSET"}",'
                     f'"attributes":{self._attrs_head},"fs.batch.id":{_jstr(batch_id)},"fs.batch.size":{size}}},'
                     f'"links":[{links}]}}\n')
        _local.write("".join(parts))
        return len(rids) + 1

    def _sdk(self, batch_id: str, size: int, start_ns: int, end_ns: int, rids: Sequence[str],
             trace_ids: Sequence[str], span_ids: Sequence[str], parent_ids: Sequence[str],
             errors: Sequence[str | None] | None, batch_error: str | None) -> int:
        f = self._factory
        if f is None or _processor is None:
            f = self._factory = SpanFactory()
        spans, links = [], []
        for i, rid in enumerate(rids):
            trace_id = int(trace_ids[i], 16)
            ctx = f.context(trace_id, int(span_ids[i], 16))
            parent = f.context(trace_id, int(parent_ids[i], 16), remote=True) if parent_ids[i] else None
            spans.append(f.span(self.node, ctx, parent, start_ns, end_ns, {"fs.request_id": json.loads(rid)},
                                error=errors[i] if errors is not None else None))
            links.append(f.link(ctx))
        attrs = {**self.attrs, "fs.batch.id": batch_id, "fs.batch.size": size}
        spans.append(f.span(f"{self.node}.batch", f.context(int(new_trace_id(), 16), int(new_span_id(), 16)), None,
                            start_ns, end_ns, attrs, links=links, error=batch_error))
        f.export(spans)
        return len(spans)


def flush() -> None:
    _local.flush()
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


_LINK = '{"trace_id":"%032x","span_id":"%016x"}'


def span_line(span: Any) -> str:
    """:func:`span_dict` as one line of JSON, built directly (the exporter thread's cost, per span)."""
    ctx, parent, links = span.context, span.parent, span.links
    parent_id = f'"{parent.span_id:016x}"' if parent is not None else "null"
    link_text = ",".join(_LINK % (lk.context.trace_id, lk.context.span_id) for lk in links) if links else ""
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
