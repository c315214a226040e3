"""The worker side of capture: per-batch hooks that trace, record lineage and write captured ports.

A :class:`StageCapture` is attached to a stage worker only when its node captures something or its
component files side reports (drift detectors); otherwise the worker pays nothing. The worker calls
:meth:`StageCapture.begin` before ``process`` and :meth:`StageCapture.end` after the batch's outputs
are queued in its Outbox, so everything written here is acknowledged before the batch commits.

Per batch, the cost is one lineage record (all its sampled requests, see :data:`LINEAGE_FIELDS`), one
span per sampled request plus one batch span handed to the span processor in one call, and one record
per sampled request and captured port that no node reads. Per sampled request the hot path does a
hash (sampling), two ``getrandbits`` and one header write; no OTel context objects are built.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from flowserve.capture.policy import lineage_topic, node_policy, side_topic
from flowserve.capture.tracing import new_span_id, new_trace_id, parse_traceparent
from flowserve.wire.envelope import H_NODE, H_TRACEPARENT, inherit
from flowserve.wire.tensors import encode_tensors

if TYPE_CHECKING:
    from flowserve.runtime.settings import WorkerSettings
    from flowserve.runtime.worker import StageWorker

log = logging.getLogger("flowserve.capture")


#: what each entry of a lineage record's ``requests`` holds; topic numbers index its ``topics``.
LINEAGE_FIELDS = ["request_id", "index", "rows", "partition", "inputs:[topic,partition,offset]",
                  "outputs:[topic,port]", "trace_id", "span_id", "error"]


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
    trace_id: int  # 0: unknown (tracing off and no incoming traceparent)
    span_id: int  # this stage's span for the request (tracing on) or the incoming parent's
    parent_id: int  # the incoming traceparent's span id, 0 when the request started a new trace here


@dataclass(slots=True)
class Tap:
    """What :meth:`StageCapture.begin` opened for one batch."""

    batch_id: str
    group: Sequence[Any]
    started_ms: int
    t0: float
    start_ns: int = 0
    sampled: list[_Sampled] = field(default_factory=list)


def _incoming(raw: bytes | None) -> tuple[int, int]:
    """(trace id, span id) of an incoming W3C traceparent, (0, 0) when absent or malformed."""
    if raw is not None and len(raw) == 55 and raw[2:3] == b"-" and raw[35:36] == b"-":
        try:  # the common, well-formed case without the general parser
            trace_id, span_id = int(raw[3:35], 16), int(raw[36:52], 16)
        except ValueError:
            return 0, 0
        if trace_id and span_id and raw[:2] != b"ff":
            return trace_id, span_id
        return 0, 0
    parsed = parse_traceparent(raw)
    return (parsed[0], parsed[1]) if parsed else (0, 0)


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
        self._spans: Any = None  # a tracing.SpanFactory when tracing is on
        self._identity: dict[str, Any] | None = None
        self._open: Tap | None = None
        self._seq = 0
        self._instance = f"{os.getpid():x}{zlib.crc32(os.urandom(4)):08x}"[-10:]
        self._attrs: dict[str, Any] = {}
        self.batches = 0
        self.lineage_records = 0
        self.spans = 0
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
            from flowserve.capture.tracing import SpanFactory

            self._spans = SpanFactory()
            self._attrs = {"fs.node": self.node.id, "fs.topology": self.topology.name}

    def close(self) -> None:
        if self._spans is not None:
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
        """Before ``process``: choose the sampled requests, give each a span id and point its traceparent at it."""
        if self._open is not None:  # the previous batch failed and is being retried item by item
            self._abort(self._open)
        self._seq += 1
        tap = Tap(f"{self.node.id}-{self._instance}-{self._seq}", group, int(time.time() * 1000),
                  time.perf_counter())
        if self._context_header is not None:
            setattr(self.component, "contexts", [it.ready.headers.get(self._context_header) for it in group])  # noqa: B010
        if self.policy.active:
            tracing = self._spans is not None
            if tracing:
                tap.start_ns = time.time_ns()
            sampled = self.policy.sampled
            everything = self.policy.sample >= 1.0
            for index, item in enumerate(group):
                r = item.ready
                if not (everything or sampled(r.request_id)):
                    continue
                headers = r.headers
                original = headers.get(H_TRACEPARENT)
                trace_id, parent_id = _incoming(original)
                if not tracing:
                    tap.sampled.append(_Sampled(index, headers, original, trace_id, parent_id, 0))
                    continue
                if not trace_id:
                    trace_id, parent_id = new_trace_id(), 0
                span_id = new_span_id()
                headers[H_TRACEPARENT] = b"00-%032x-%016x-01" % (trace_id, span_id)
                tap.sampled.append(_Sampled(index, headers, original, trace_id, span_id, parent_id))
        self._open = tap
        return tap

    def _abort(self, tap: Tap) -> None:
        for s in tap.sampled:
            if s.original is None:
                s.headers.pop(H_TRACEPARENT, None)
            else:
                s.headers[H_TRACEPARENT] = s.original
        if self._spans is not None and tap.sampled:
            why = "batch failed; retried request by request"
            self._export_spans(tap, {s.index: why for s in tap.sampled}, batch_error=why)
        self._open = None

    def _export_spans(self, tap: Tap, errors: Mapping[int, str], batch_error: str | None = None) -> None:
        """One span per sampled request (child of its incoming traceparent) and one per batch, linked to them."""
        f = self._spans
        end_ns = time.time_ns()
        start_ns = tap.start_ns or end_ns
        node = self.node.id
        spans = []
        links = []
        for s in tap.sampled:
            ctx = f.context(s.trace_id, s.span_id)
            parent = f.context(s.trace_id, s.parent_id, remote=True) if s.parent_id else None
            rid = tap.group[s.index].ready.request_id
            spans.append(f.span(node, ctx, parent, start_ns, end_ns, {"fs.request_id": rid},
                                error=errors.get(s.index)))
            links.append(f.link(ctx))
        attrs = {**self._attrs, "fs.batch.id": tap.batch_id, "fs.batch.size": len(tap.group)}
        spans.append(f.span(f"{node}.batch", f.context(new_trace_id(), new_span_id()), None, start_ns, end_ns,
                            attrs, links=links, error=batch_error))
        f.export(spans)
        self.spans += len(spans)

    def end(self, tap: Tap, sizes: Sequence[int], outputs: Mapping[str, np.ndarray],
            mask: Mapping[str, np.ndarray], errors: Mapping[int, str]) -> None:
        """After the batch's outputs are queued: captured ports, one lineage record, spans, side reports."""
        self._open = None
        self.batches += 1
        if tap.sampled:
            outbox = self.worker.outbox
            batch_ms = round((time.perf_counter() - tap.t0) * 1000, 3)
            starts = np.cumsum([0, *sizes]).tolist() if len(set(sizes)) > 1 else None
            n0 = sizes[0] if sizes else 0
            topics: dict[str, int] = {}  # interned topic names of the lineage record
            entries: list[list[Any]] = []
            failed: dict[int, str] = {}
            lineage = self.lineage_topic is not None
            emits = bool(self.node.emits_outputs) and any(p in outputs for p in self.node.emits_outputs.values())
            for s in tap.sampled:
                item = tap.group[s.index]
                r = item.ready
                lo, hi = (starts[s.index], starts[s.index + 1]) if starts is not None else \
                    (s.index * n0, (s.index + 1) * n0)
                error = next((errors[i] for i in range(lo, hi) if i in errors), None) if errors else None
                written: list[list[Any]] = []
                if error is None:
                    for port, array in outputs.items():
                        m = mask.get(port)
                        if m is not None and not m[lo:hi].any():
                            continue
                        topic = self.node.output_topics.get(port)
                        if topic is None and port in self.capture_topics:
                            topic = self.capture_topics[port]
                            rows = array[lo:hi] if m is None else array[lo:hi][m[lo:hi]]
                            outbox.add(topic, r.partition, r.request_id.encode(), encode_tensors({port: rows}),
                                       inherit(r.headers))
                        if topic is not None and lineage:
                            written.append([topics.setdefault(topic, len(topics)), port])
                    if emits and lineage:
                        written.append([topics.setdefault(self.worker._reply_topic(r), len(topics)), "outputs"])
                else:
                    failed[s.index] = error
                if lineage:
                    entries.append([r.request_id, s.index, hi - lo, r.partition, self._inputs(item, topics),
                                    written, f"{s.trace_id:032x}" if s.trace_id else "",
                                    f"{s.span_id:016x}" if s.span_id else "", error])
            if self._spans is not None:
                self._export_spans(tap, failed)
            if lineage:
                self._lineage(tap, entries, topics, batch_ms)
        if self.side_topic is not None:
            self._drain_reports()

    @staticmethod
    def _inputs(item: Any, topics: dict[str, int]) -> list[list[int]]:
        r = item.ready
        if getattr(r, "offsets", None):
            return [[topics.setdefault(t, len(topics)), p, o] for (t, p), o in r.offsets]
        if item.source:
            topic, partition, offset = item.source.rsplit(":", 2)
            return [[topics.setdefault(topic, len(topics)), int(partition), int(offset)]]
        return []

    def _lineage(self, tap: Tap, entries: list[list[Any]], topics: dict[str, int], batch_ms: float) -> None:
        """One compact record for the batch (key: batch id); ``flowserve lineage`` expands it per request."""
        body = {
            "v": 2, "topology": self.topology.name, "version": self.topology.version, "node": self.node.id,
            **self._ident(), "batch": {"id": tap.batch_id, "size": len(tap.group)},
            "timing": {"start_ms": tap.started_ms, "batch_ms": batch_ms},
            "topics": list(topics), "fields": LINEAGE_FIELDS, "requests": entries,
        }
        value = json.dumps(body, separators=(",", ":"), default=str).encode()
        assert self.lineage_topic is not None
        partition = entries[0][3] if entries else 0
        self.worker.outbox.add(self.lineage_topic, partition, tap.batch_id.encode(), value,
                               [(H_NODE, self.node.id.encode())])
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


#: how a side-branch worker process (a drift detector) yields to the critical path's processes.
SIDE_NICE = 10
SIDE_FETCH_WAIT_MS = 250
SIDE_POLL_MS = 500
SIDE_FETCH_MIN_BYTES = 64 * 1024


def side_branch_process(component: Any, settings: WorkerSettings) -> WorkerSettings:
    """Settings for a worker process of its own; for a side branch (a component with ``side_output``,
    e.g. a drift detector) also lower the process's OS priority and its thread pools.

    A side branch must never delay the critical path: it runs at ``os.nice(SIDE_NICE)`` (the scheduler
    gives the stages of the critical path the CPU first), with one BLAS/OpenMP/torch/numba thread, and
    fetches with a long broker wait so it wakes rarely and takes large batches (its windows are tested
    together, per batch). Call it only in a process that runs this worker alone (``flowserve worker``):
    niceness is per process and cannot be raised back. The broker holds each of its fetches until
    ``SIDE_FETCH_MIN_BYTES`` arrived or the wait passed, so the detector (and the broker serving it)
    wakes a few times a second instead of once per record.
    """
    if not getattr(component, "side_output", None):
        return settings
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    torch = sys.modules.get("torch")  # already imported with the topology's components: too late for the env
    if torch is not None:
        torch.set_num_threads(1)
    try:
        os.nice(int(getattr(component, "nice", SIDE_NICE)))
    except (OSError, AttributeError) as exc:  # not permitted, or no os.nice on this platform
        log.warning("node %s: cannot lower its priority: %s", getattr(component, "node", "?"), exc)
    return settings.model_copy(update={"fetch_max_wait_ms": max(settings.fetch_max_wait_ms, SIDE_FETCH_WAIT_MS),
                                       "poll_timeout_ms": max(settings.poll_timeout_ms, SIDE_POLL_MS),
                                       "fetch_min_bytes": max(settings.fetch_min_bytes, SIDE_FETCH_MIN_BYTES)})


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


