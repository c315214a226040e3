"""The worker side of capture: per-batch hooks that trace, record lineage and write captured ports.

A :class:`StageCapture` is attached to a stage worker only when its node captures something or its
component files side reports (drift detectors); otherwise the worker pays nothing. The worker calls
:meth:`StageCapture.begin` before ``process`` and :meth:`StageCapture.end` after the batch's outputs
are queued in its Outbox, so everything written here is acknowledged before the batch commits.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from flowserve.capture.policy import lineage_topic, node_policy, side_topic
from flowserve.capture.tracing import format_traceparent, parse_traceparent
from flowserve.wire.envelope import H_FORMAT, H_NODE, H_TRACEPARENT, inherit
from flowserve.wire.tensors import encode_tensors

if TYPE_CHECKING:
    from flowserve.runtime.worker import StageWorker

log = logging.getLogger("flowserve.capture")


def params_hash(component: Any) -> str:
    """sha256 (16 hex digits) of a component's parameters as canonical JSON."""
    params: Any = getattr(component, "params", None)
    body = params.model_dump(mode="json") if hasattr(params, "model_dump") else {}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(slots=True)
class _Sampled:
    index: int  # position in the group
    headers: dict[str, bytes]
    original: bytes | None  # the incoming traceparent, restored if the batch is retried
    trace_id: str
    span_id: str
    span: Any = None


@dataclass(slots=True)
class Tap:
    """What :meth:`StageCapture.begin` opened for one batch."""

    batch_id: str
    group: Sequence[Any]
    started_ms: int
    t0: float
    sampled: list[_Sampled] = field(default_factory=list)
    batch_span: Any = None


class StageCapture:
    """Capture, lineage, tracing and side reports for one stage worker."""

    def __init__(self, worker: StageWorker) -> None:
        self.worker = worker
        self.topology = worker.topology
        self.node = worker.node
        self.component = worker.component
        self.policy = node_policy(self.topology.spec, self.node.id)
        self.capture_topics = dict(self.node.capture_topics)
        self.lineage_topic = lineage_topic(self.topology) if self.policy.lineage and self.policy.active else None
        self._side = getattr(self.component, "side_output", None)
        self.side_topic = side_topic(self.topology, self._side) if self._side else None
        self._context_header: str | None = getattr(self.component, "context_header", None)
        self._tracer: Any = None
        self._link: Any = None
        self._parent_context: Any = None
        self._identity: dict[str, Any] | None = None
        self._open: Tap | None = None
        self._seq = 0
        self._instance = f"{os.getpid():x}{zlib.crc32(os.urandom(4)):08x}"[-10:]
        self.batches = 0
        self.lineage_records = 0
        self.reports = 0

    @classmethod
    def attach(cls, worker: StageWorker) -> StageCapture | None:
        """A capture for ``worker`` when its node captures or reports anything, else None (zero cost)."""
        policy = node_policy(worker.topology.spec, worker.node.id)
        if not policy.active and not getattr(worker.component, "side_output", None):
            return None
        return cls(worker)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        if self.policy.active and self.policy.tracing:
            from opentelemetry.trace import Link

            from flowserve.capture.tracing import parent_context, tracer

            self._tracer = tracer()
            self._link, self._parent_context = Link, parent_context  # resolved once, used per request

    def close(self) -> None:
        if self._tracer is not None:
            from flowserve.capture.tracing import flush

            flush()

    def _ident(self) -> dict[str, Any]:
        # Built on first use: weights hashes are known only after setup().
        if self._identity is None:
            describe = getattr(self.component, "describe", None)
            self._identity = {
                "component": describe() if callable(describe) else type(self.component).__name__,
                "params_hash": params_hash(self.component),
                "weights_hash": getattr(self.component, "weights_hash", None),
            }
        return self._identity

    # -- per batch -------------------------------------------------------------------------------

    def begin(self, group: Sequence[Any]) -> Tap:
        """Before ``process``: open spans for sampled requests and point their traceparent at them."""
        if self._open is not None:  # the previous batch failed and is being retried item by item
            self._abort(self._open)
        self._seq += 1
        tap = Tap(f"{self.node.id}-{self._instance}-{self._seq}", group, int(time.time() * 1000),
                  time.perf_counter())
        if self._context_header is not None:
            setattr(self.component, "contexts", [it.ready.headers.get(self._context_header) for it in group])  # noqa: B010
        if self.policy.active:
            for index, item in enumerate(group):
                r = item.ready
                if self.policy.sampled(r.request_id):
                    tap.sampled.append(self._open_request(tap, index, r.headers))
            if self._tracer is not None and tap.sampled:
                links = [self._link(s.span.get_span_context()) for s in tap.sampled if s.span is not None]
                tap.batch_span = self._tracer.start_span(
                    f"{self.node.id}.batch", links=links,
                    attributes={"fs.node": self.node.id, "fs.topology": self.topology.name,
                                "fs.batch.id": tap.batch_id, "fs.batch.size": len(group)})
        self._open = tap
        return tap

    def _open_request(self, tap: Tap, index: int, headers: dict[str, bytes]) -> _Sampled:
        original = headers.get(H_TRACEPARENT)
        if self._tracer is None:
            parsed = parse_traceparent(original)
            trace_id = f"{parsed[0]:032x}" if parsed else ""
            return _Sampled(index, headers, original, trace_id, f"{parsed[1]:016x}" if parsed else "")
        rid = headers.get("fs-id", b"").decode("utf-8", "replace")
        span = self._tracer.start_span(
            self.node.id, context=self._parent_context(original), record_exception=False,
            attributes={"fs.request_id": rid, "fs.node": self.node.id, "fs.topology": self.topology.name,
                        "fs.batch.id": tap.batch_id})
        ctx = span.get_span_context()
        headers[H_TRACEPARENT] = format_traceparent(ctx.trace_id, ctx.span_id, int(ctx.trace_flags)).encode()
        return _Sampled(index, headers, original, f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", span)

    def _abort(self, tap: Tap) -> None:
        from_status = None
        for s in tap.sampled:
            if s.original is None:
                s.headers.pop(H_TRACEPARENT, None)
            else:
                s.headers[H_TRACEPARENT] = s.original
            if s.span is not None:
                from_status = from_status or _error_status("batch failed; retried request by request")
                s.span.set_status(from_status)
                s.span.end()
        if tap.batch_span is not None:
            tap.batch_span.set_status(_error_status("batch failed; retried request by request"))
            tap.batch_span.end()
        self._open = None

    def end(self, tap: Tap, sizes: Sequence[int], outputs: Mapping[str, np.ndarray],
            mask: Mapping[str, np.ndarray], errors: Mapping[int, str]) -> None:
        """After the batch's outputs are queued: captured ports, lineage records, spans, side reports."""
        self._open = None
        self.batches += 1
        outbox = self.worker.outbox
        if tap.sampled:
            batch_ms = round((time.perf_counter() - tap.t0) * 1000, 3)
            starts = np.cumsum([0, *sizes])
            for s in tap.sampled:
                item = tap.group[s.index]
                r = item.ready
                lo, hi = int(starts[s.index]), int(starts[s.index + 1])
                error = next((errors[i] for i in range(lo, hi) if i in errors), None) if errors else None
                written: list[list[Any]] = []
                if error is None:
                    key = r.request_id.encode()
                    for port, array in outputs.items():
                        rows = array[lo:hi]
                        m = mask.get(port)
                        if m is not None:
                            sel = m[lo:hi]
                            if not sel.any():
                                continue
                            rows = rows[sel]
                        topic = self.node.output_topics.get(port)
                        if topic is None and port in self.capture_topics:
                            topic = self.capture_topics[port]
                            outbox.add(topic, r.partition, key, encode_tensors({port: rows}), inherit(r.headers))
                        if topic is not None:
                            written.append([topic, r.partition, port])
                    if self.node.emits_outputs and any(p in outputs for p in self.node.emits_outputs.values()):
                        written.append([self.worker._reply_topic(r), r.partition, "outputs"])
                if s.span is not None:
                    if error is not None:
                        s.span.set_status(_error_status(error))
                    s.span.end()
                if self.lineage_topic is not None:
                    self._lineage(tap, s, item, error, written, batch_ms, hi - lo)
        if tap.batch_span is not None:
            tap.batch_span.end()
        if self.side_topic is not None:
            self._drain_reports()

    def _lineage(self, tap: Tap, s: _Sampled, item: Any, error: str | None, written: list[list[Any]],
                 batch_ms: float, rows: int) -> None:
        r = item.ready
        if getattr(r, "offsets", None):
            inputs = [[t, p, o] for (t, p), o in r.offsets]
        elif item.source:
            topic, partition, offset = item.source.rsplit(":", 2)
            inputs = [[topic, int(partition), int(offset)]]
        else:
            inputs = []
        body = {
            "v": 1, "request_id": r.request_id, "topology": self.topology.name,
            "version": self.topology.version, "node": self.node.id, **self._ident(),
            "inputs": inputs, "outputs": written,
            "batch": {"id": tap.batch_id, "size": len(tap.group), "index": s.index, "rows": rows},
            "timing": {"start_ms": tap.started_ms, "batch_ms": batch_ms},
            "trace_id": s.trace_id, "span_id": s.span_id, "error": error,
        }
        value = json.dumps(body, separators=(",", ":"), default=str).encode()
        headers = [(k, v) for k, v in inherit(r.headers, **{H_NODE: self.node.id.encode()}) if k != H_FORMAT]
        assert self.lineage_topic is not None
        self.worker.outbox.add(self.lineage_topic, r.partition, r.request_id.encode(), value, headers)
        self.lineage_records += 1

    def _drain_reports(self) -> None:
        drain = getattr(self.component, "drain_reports", None)
        if drain is None:
            return
        partitions = self.topology.spec.partitions
        for report in drain():
            key = str(report.get("key", self.node.id))
            body = {"topology": self.topology.name, "node": self.node.id, **report}
            value = json.dumps(body, separators=(",", ":"), default=_jsonable).encode()
            assert self.side_topic is not None
            self.worker.outbox.add(self.side_topic, zlib.crc32(key.encode()) % partitions, key.encode(), value,
                                   [(H_NODE, self.node.id.encode())])
            self.reports += 1


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def _error_status(reason: str) -> Any:
    from opentelemetry.trace import Status, StatusCode

    return Status(StatusCode.ERROR, reason[:500])
