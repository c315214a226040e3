"""The worker side of capture: stage hooks that trace, record lineage, write captured ports and side reports.

:func:`capture_hooks` gives a stage worker a :class:`StageCapture` only when its node captures something
or its component files side reports (drift detectors); otherwise the worker pays nothing. As a
:class:`~flowserve.runtime.hooks.StageHooks`, it sees each batch before ``process`` (``begin``) and after
its outputs are queued (``end``), and writes through the worker's outbox, so everything it writes is
acknowledged before the batch commits.

Per batch, the cost is one lineage entry list (all its sampled requests, see :data:`LINEAGE_FIELDS`), the
batch's spans handed to its :class:`~flowserve.capture.tracing.StageSpans` in one call, and one record
per sampled request and captured port that no node reads (serialised once per batch and sliced, like
the worker's outputs). Lineage is written as one record per commit, not per batch (``after_step``):
a record per batch costs more than everything else capture does, and the worker commits only offsets
whose lineage is acknowledged.

Per sampled request the hot path does a hash (sampling, below 100%), a check and slice of its incoming
``traceparent``, one header write and one f-string each for its lineage entry and its span line. Trace
and span ids stay lowercase hex text from the incoming header to the outgoing one, the lineage entry and
the span line (they are never used as numbers there), and a batch's new span ids come from one
``getrandbits`` call. The sampled requests are kept as parallel lists of strings, not objects, so the
garbage collector has nothing new to track.
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
from json.encoder import encode_basestring_ascii as _jstr
from typing import TYPE_CHECKING, Any

import numpy as np

from flowserve.capture.capabilities import FilesReports
from flowserve.capture.redact import node_redactors
from flowserve.capture.tracing import StageSpans, new_span_ids, new_trace_id, parse_traceparent
from flowserve.capture.tracing import flush as flush_spans
from flowserve.component import Component, require
from flowserve.runtime.hooks import BatchOutcome, StageContext, StageHooks
from flowserve.topology.capture import node_policy
from flowserve.topology.graph import Node, Topology
from flowserve.wire.envelope import H_NODE, H_REPLY_TO, H_TRACEPARENT, inherit
from flowserve.wire.tensors import encode_split, encode_tensors

if TYPE_CHECKING:
    from flowserve.runtime.emit import Item
    from flowserve.runtime.hooks import Emit
    from flowserve.runtime.join import Ready

log = logging.getLogger("flowserve.capture")


#: what each entry of a lineage record's ``requests`` holds; topic numbers index its ``topics``.
LINEAGE_FIELDS = ["request_id", "index", "rows", "partition", "inputs:[topic,partition,offset]",
                  "outputs:[topic,port]", "trace_id", "span_id", "error"]


_FIELDS = json.dumps(LINEAGE_FIELDS, separators=(",", ":"))

#: a gathered lineage record is written once it is this large, even between commits (a message must fit
#: the broker's limit, 1 MB by default).
LINEAGE_RECORD_BYTES = 256 * 1024


def params_hash(component: Component) -> str:
    """sha256 (16 hex digits) of a component's parameters as canonical JSON."""
    body = component.params.model_dump(mode="json")
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(slots=True)
class Tap:
    """What :meth:`StageCapture.begin` opened for one batch: its sampled requests as parallel lists."""

    batch_id: str
    group: Sequence[Item]
    started_ms: int
    t0: float
    start_ns: int = 0
    #: per sampled request: its position in the group, its incoming traceparent (restored if the batch is
    #: retried), and as lowercase hex: its trace id ("": unknown), this stage's span id (tracing on) or the
    #: incoming parent's, and the incoming parent span id ("" when the request started a new trace here).
    #: Hex text, not ints: the ids are only ever copied into headers, lineage and span lines.
    index: list[int] = field(default_factory=list)
    original: list[bytes | None] = field(default_factory=list)
    trace_id: list[str] = field(default_factory=list)
    span_id: list[str] = field(default_factory=list)
    parent_id: list[str] = field(default_factory=list)


_HEX = b"0123456789abcdef-"
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


def _incoming(raw: bytes | None) -> tuple[str, str]:
    """(trace id, span id) of an incoming W3C traceparent as lowercase hex, ("", "") when absent or malformed."""
    if (raw is not None and len(raw) == 55 and raw[2:3] == b"-" and raw[35:36] == b"-" and raw[52:53] == b"-"
            and not raw[3:52].strip(_HEX) and raw[:2] != b"ff"):  # the common case, checked without parsing
        text = raw.decode()
        trace_id, span_id = text[3:35], text[36:52]
        if trace_id != _ZERO_TRACE and span_id != _ZERO_SPAN:
            return trace_id, span_id
        return "", ""
    parsed = parse_traceparent(raw)
    return (f"{parsed[0]:032x}", f"{parsed[1]:016x}") if parsed else ("", "")


class StageCapture(StageHooks):
    """Capture, lineage, tracing and side reports for one stage worker."""

    def __init__(self, topology: Topology, node: Node, component: Component) -> None:
        self.topology = topology
        self.node = node
        self.component = component
        self.policy = node_policy(topology.spec, node.id)
        self.capture_topics = dict(node.capture_topics)
        self.redactors = node_redactors(topology.spec, node.id)  # reads the hash key, if any, once
        self.lineage_topic = topology.lineage_topic if self.policy.lineage and self.policy.active else None
        side = component.side_output
        self.side_topic = topology.side_topic(side) if side else None
        #: the component's side reports (checked once: a component naming a side topic must file them)
        self.reports_from = require(component, FilesReports, f"file side reports to '{side}' (side_output)"
                                    ) if side else None
        self._emit: Emit | None = None  # the worker's outbox, from start()
        self._reply_topic: Any = None
        self._spans: Any = None  # a tracing.StageSpans when tracing is on
        self._identity: dict[str, Any] | None = None
        self._open: Tap | None = None
        self._seq = 0
        self._instance = f"{os.getpid():x}{zlib.crc32(os.urandom(4)):08x}"[-10:]
        self._head: str | None = None  # the constant start of this stage's lineage records (JSON)
        # the lineage record being gathered: its batches (JSON text), interned topic names, size, key
        self._batches: list[str] = []
        self._topics: dict[str, int] = {}
        self._pending_bytes = 0
        self._pending_key: tuple[str, int] = ("", 0)
        self.batches = 0
        self.lineage_records = 0
        self.spans = 0
        self.reports = 0

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, stage: StageContext) -> None:
        self._emit = stage.emit
        self._reply_topic = stage.reply_topic
        if self.policy.active and self.policy.tracing:
            self._spans = StageSpans(self.node.id, self.topology.name)

    def close(self) -> None:
        if self._spans is not None:
            flush_spans()

    def _ident(self) -> dict[str, Any]:
        # Built on first use: weights hashes are known only after setup().
        if self._identity is None:
            self._identity = {
                "component": self.component.describe(),
                "params_hash": params_hash(self.component),
                "weights_hash": self.component.weights_hash,
                "model_version": self.component.model_version,
            }
        return self._identity

    def _weights_changed(self) -> bool:
        """Whether the component switched weights (a promoted version) since the identity was taken."""
        ident = self._ident()
        return (ident["weights_hash"] != self.component.weights_hash
                or ident["model_version"] != self.component.model_version)

    # -- per batch -------------------------------------------------------------------------------

    def begin(self, group: Sequence[Item]) -> Tap:
        """Before ``process``: choose the sampled requests, give each a span id and point its traceparent at it."""
        if self._open is not None:  # the previous batch failed and is being retried item by item
            self._abort(self._open)
        self._seq += 1
        tap = Tap(f"{self.node.id}-{self._instance}-{self._seq}", group, int(time.time() * 1000),
                  time.perf_counter())
        if self.policy.active:
            tracing = self._spans is not None
            if tracing:
                tap.start_ns = time.time_ns()
            sampled = self.policy.sampled
            everything = self.policy.sample >= 1.0
            indexes, originals, traces, spans, parents = tap.index, tap.original, tap.trace_id, tap.span_id, \
                tap.parent_id
            fresh = new_span_ids(len(group)) if tracing else None  # one draw for the batch
            for index, item in enumerate(group):
                r = item.ready
                if not (everything or sampled(r.request_id)):
                    continue
                headers = r.headers
                original = headers.get(H_TRACEPARENT)
                trace_id, parent_id = _incoming(original)
                indexes.append(index)
                originals.append(original)
                if fresh is None:
                    traces.append(trace_id)
                    spans.append(parent_id)
                    parents.append("")
                    continue
                if not trace_id:
                    trace_id, parent_id = new_trace_id(), ""
                span_id = fresh[len(spans)]
                headers[H_TRACEPARENT] = f"00-{trace_id}-{span_id}-01".encode()
                traces.append(trace_id)
                spans.append(span_id)
                parents.append(parent_id)
        self._open = tap
        return tap

    def _abort(self, tap: Tap) -> None:
        for index, original in zip(tap.index, tap.original, strict=True):
            headers = tap.group[index].ready.headers
            if original is None:
                headers.pop(H_TRACEPARENT, None)
            else:
                headers[H_TRACEPARENT] = original
        if self._spans is not None and tap.index:
            why = "batch failed; retried request by request"
            self._export_spans(tap, [why] * len(tap.index), batch_error=why)
        self._open = None

    def _export_spans(self, tap: Tap, errors: list[str | None] | None, batch_error: str | None = None,
                      rids: list[str] | None = None) -> None:
        """One span per sampled request (child of its incoming traceparent) and one per batch, linked to them.

        ``rids``: the sampled requests' ids already as JSON strings, when the caller has them.
        """
        end_ns = time.time_ns()
        group = tap.group
        if rids is None:
            rids = [_jstr(group[i].ready.request_id) for i in tap.index]
        self.spans += self._spans.batch(tap.batch_id, len(group), tap.start_ns or end_ns, end_ns, rids,
                                        tap.trace_id, tap.span_id, tap.parent_id, errors, batch_error)

    def end(self, token: Any, outcome: BatchOutcome) -> None:
        """After the batch's outputs are queued: captured ports, one lineage record, spans, side reports.

        The lineage entries are formatted as JSON text directly (one f-string per request): the ports
        written are the same for every request of a batch unless a mask or an error says otherwise.
        """
        tap: Tap = token
        sizes, outputs, mask, errors = outcome.sizes, outcome.outputs, outcome.mask, outcome.errors
        if self._weights_changed():
            # The batches gathered so far ran on the previous weights (a version was promoted since): they
            # leave under that identity, before this batch's entries are numbered against a new record.
            self.flush_lineage(True)
            self._identity = self._head = None
        self._open = None
        self.batches += 1
        if tap.index:
            lineage = self.lineage_topic is not None
            batch_ms = round((time.perf_counter() - tap.t0) * 1000, 3)
            uniform = len(set(sizes)) <= 1
            starts = None if uniform else np.cumsum([0, *sizes]).tolist()
            n0 = sizes[0] if sizes else 0
            group = tap.group
            topics = self._topics  # interned topic names of the lineage record being gathered
            node = self.node
            # ports every request wrote unless masked: their part of the entries is built once per batch
            fixed: list[str] = []
            masked: list[tuple[str, str, np.ndarray]] = []
            for port in outputs:
                topic = node.output_topics.get(port)
                if topic is None:
                    continue
                m = mask.get(port)
                if m is None:
                    fixed.append(f"[{topics.setdefault(topic, len(topics))},{_jstr(port)}]")
                else:
                    masked.append((topic, port, m))
            fixed_text = ",".join(fixed)
            captured = self._captured(tap, sizes, outputs, mask, errors, uniform) if self.capture_topics else {}
            emits = bool(node.emits_outputs) and any(p in outputs for p in node.emits_outputs.values())
            entries: list[str] = []
            rids: list[str] = []  # the sampled requests' ids as JSON strings, for lineage and spans alike
            failed: list[str | None] | None = [None] * len(tap.index) if errors else None
            simple = not masked and not captured and not emits  # every request wrote exactly the fixed ports
            inputs, traces, spans = self._inputs, tap.trace_id, tap.span_id
            for k, index in enumerate(tap.index):
                item = group[index]
                r = item.ready
                rid = _jstr(r.request_id)
                rids.append(rid)
                lo, hi = (starts[index], starts[index + 1]) if starts is not None else (index * n0, (index + 1) * n0)
                error = next((errors[i] for i in range(lo, hi) if i in errors), None) if errors else None
                if error is not None:
                    assert failed is not None
                    failed[k] = error
                if not lineage:
                    continue
                if error is not None:
                    outs = ""
                elif simple:
                    outs = fixed_text
                else:
                    written = [fixed_text] if fixed_text else []
                    for topic, port, m in masked:
                        if m[lo:hi].any():
                            written.append(f"[{topics.setdefault(topic, len(topics))},{_jstr(port)}]")
                    for port in captured.get(k, ()):
                        written.append(f"[{topics.setdefault(self.capture_topics[port], len(topics))},{_jstr(port)}]")
                    if emits:
                        written.append(self._reply_part(r, topics))
                    outs = ",".join(written)
                entries.append(f'[{rid},{index},{hi - lo},{r.partition},[{inputs(item, topics)}],[{outs}],'
                               f'"{traces[k]}","{spans[k]}",{"null" if error is None else _jstr(error)}]')
            if self._spans is not None:
                self._export_spans(tap, failed, rids=rids)
            if lineage:
                self._lineage(tap, entries, batch_ms, group[tap.index[0]].ready.partition)
        if self.side_topic is not None:
            self._drain_reports()

    def _captured(self, tap: Tap, sizes: Sequence[int], outputs: Mapping[str, np.ndarray],
                  mask: Mapping[str, np.ndarray], errors: Mapping[int, str], uniform: bool) -> dict[int, list[str]]:
        """Write the captured ports nobody reads (their own topics) for the sampled requests.

        Unmasked ports of a batch of equal-sized requests are serialised once (``encode_split``) and
        sliced, as the worker does for its output topics; a redacted port (``capture.redact``) is redacted
        per request before it is encoded. Returns, per sampled request, the ports written.
        """
        emit = self._emit
        assert emit is not None
        starts = np.cumsum([0, *sizes]).tolist()
        written: dict[int, list[str]] = {}
        for port, topic in self.capture_topics.items():
            array = outputs.get(port)
            if array is None:
                continue
            m = mask.get(port)
            redactor = self.redactors.get(port)  # redacts before anything reaches the outbox
            split = (encode_split(port, array, len(sizes)) if m is None and uniform and not errors
                     and redactor is None else None)
            for k, index in enumerate(tap.index):
                lo, hi = starts[index], starts[index + 1]
                if errors and any(i in errors for i in range(lo, hi)):
                    continue
                if split is not None:
                    value = split[index]
                else:
                    rows = array[lo:hi] if m is None else array[lo:hi][m[lo:hi]]
                    if m is not None and not len(rows):
                        continue
                    value = encode_tensors({port: rows}) if redactor is None else redactor.encode(port, rows)
                r = tap.group[index].ready
                headers = inherit(r.headers) if redactor is None else [*inherit(r.headers), redactor.header]
                emit(topic, r.partition, r.request_id.encode(), value, headers)
                written.setdefault(k, []).append(port)
        return written

    def _reply_part(self, r: Ready, topics: dict[str, int]) -> str:
        """'[topic number,"outputs"]' for where this request's outputs went (its reply route or the outputs)."""
        if H_REPLY_TO not in r.headers:  # the common case: the topology's outputs topic
            return f'[{topics.setdefault(self.topology.outputs_topic, len(topics))},"outputs"]'
        return f'[{topics.setdefault(self._reply_topic(r), len(topics))},"outputs"]'

    @staticmethod
    def _inputs(item: Item, topics: dict[str, int]) -> str:
        """The input records of a request as JSON text: '[topic number,partition,offset],...'."""
        r = item.ready
        if r.offsets:
            return ",".join(f"[{topics.setdefault(t, len(topics))},{p},{o}]" for (t, p), o in r.offsets)
        if item.source:  # "topic:partition:offset", both numbers written by the worker's intake
            topic, partition, offset = item.source.rsplit(":", 2)
            return f"[{topics.setdefault(topic, len(topics))},{partition},{offset}]"
        return ""

    def _lineage(self, tap: Tap, entries: list[str], batch_ms: float, partition: int) -> None:
        """Add the batch to the lineage record being gathered (written by :meth:`flush_lineage`)."""
        text = (f'{{"id":{_jstr(tap.batch_id)},"size":{len(tap.group)},"start_ms":{tap.started_ms},'
                f'"batch_ms":{batch_ms},"requests":[{",".join(entries)}]}}')
        if not self._batches:
            self._pending_key = (tap.batch_id, partition)
        self._batches.append(text)
        self._pending_bytes += len(text)

    def flush_lineage(self, force: bool) -> bool:
        """Queue the gathered lineage as one record in the worker's Outbox when ``force`` (a commit may
        follow this batch) or when it has grown past :data:`LINEAGE_RECORD_BYTES`. True when nothing is
        left ungathered: then the batch that carries this Outbox may commit once acknowledged.

        The record (``"v": 3``, key: its first batch's id) holds the stage's identity once and per batch
        its id, size, start time, duration and sampled requests; ``flowserve lineage`` expands it.
        """
        if not self._batches:
            return True
        if not force and self._pending_bytes < LINEAGE_RECORD_BYTES:
            return False
        if self._head is None:  # what every record of this stage starts with
            body = {"v": 3, "topology": self.topology.name, "version": self.topology.version,
                    "node": self.node.id, **self._ident()}
            self._head = json.dumps(body, separators=(",", ":"), default=str)[:-1]
        value = (f'{self._head},"topics":{json.dumps(list(self._topics))},"fields":{_FIELDS},'
                 f'"batches":[{",".join(self._batches)}]}}').encode()
        assert self.lineage_topic is not None
        key, partition = self._pending_key
        assert self._emit is not None
        self._emit(self.lineage_topic, partition, key.encode(), value, [(H_NODE, self.node.id.encode())])
        self._batches, self._topics, self._pending_bytes = [], {}, 0
        self.lineage_records += 1
        return True

    def after_step(self, *, force: bool) -> bool:
        """Queue the side reports the component finished since the last step (a detector finishes them in
        its own thread, so this runs also when no batch ran) and the gathered lineage when it is due."""
        if self.side_topic is not None:
            self._drain_reports()
        if self.lineage_topic is None:
            return True
        return self.flush_lineage(force)

    def _drain_reports(self) -> None:
        partitions = self.topology.spec.partitions
        emit = self._emit
        assert emit is not None
        assert self.reports_from is not None
        for report in self.reports_from.drain_reports():
            key = str(report.get("key", self.node.id))
            body = {"topology": self.topology.name, "node": self.node.id, **report}
            value = json.dumps(body, separators=(",", ":"), default=_jsonable).encode()
            assert self.side_topic is not None
            emit(self.side_topic, zlib.crc32(key.encode()) % partitions, key.encode(), value,
                                   [(H_NODE, self.node.id.encode())])
            self.reports += 1


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def capture_hooks(topology: Topology, node: Node, component: Component) -> list[StageHooks]:
    """The :data:`~flowserve.runtime.hooks.HookFactory` of capture: a :class:`StageCapture` for a node that
    captures or files side reports, none for the others (they pay nothing)."""
    if not node_policy(topology.spec, node.id).active and not component.side_output:
        return []
    return [StageCapture(topology, node, component)]
