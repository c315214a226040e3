"""The output side of a stage worker: results, error results and dead letters.

Every record a worker writes goes through here, batch-native: outputs are serialised once per batch and
sliced per request (``encode_split``); a request that fails becomes a dead letter (the reason, the
original bytes, where they came from) plus an error result downstream, so callers learn of it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from flowserve.component import Component
from flowserve.errors import ErrorKind, Failure
from flowserve.kafka.outbox import Outbox
from flowserve.runtime.join import Ready
from flowserve.topology.graph import Node, Topology
from flowserve.wire.envelope import H_FORMAT, H_REPLY_TO, H_VISITS, error_headers, inherit
from flowserve.wire.tensors import encode_split, encode_tensors
from flowserve.wire.v2 import make_response

log = logging.getLogger("flowserve.worker")
_EMPTY = encode_tensors({})


@dataclass
class Counters:
    records_in: int = 0
    requests_ok: int = 0
    dead_lettered: int = 0
    error_results: int = 0
    expired: int = 0
    batches: int = 0
    records_out: int = 0
    commits: int = 0
    last_batch: int = 0
    #: refused at once: could not have finished before their deadline (SLO admission).
    refused: int = 0
    #: processed here but finished after their deadline.
    late: int = 0
    #: answered at once with a deadline error: could make it alone, not behind the queue ahead (Clockwork).
    doomed: int = 0
    #: records dropped on a first-wins input: a request's output already read (``Node.first_wins``)
    duplicates: int = 0
    #: deadline join: inputs dropped because their request was already answered (or past its deadline)
    join_late: int = 0
    #: deadline join: requests answered at their fire time with inputs absent
    join_partial: int = 0
    #: produces that failed for a while (a broker fault): the worker re-read from its last acknowledged offsets
    rewinds: int = 0
    #: dead letters per error kind (``flowserve.errors.ErrorKind``)
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)

    def snapshot(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class Item:
    """A request ready for ``process`` plus what is needed to dead-letter it."""

    ready: Ready
    raw: bytes | None = None
    source: str = ""
    #: set by the columnar intake, which already checked the whole batch against the port
    signature: tuple | None = None


class Emitter:
    """Mixin of :class:`~flowserve.runtime.worker.StageWorker`: everything that produces records."""

    node: Node
    topology: Topology
    component: Component
    outbox: Outbox
    counters: Counters
    max_bytes: int
    _cycles: bool
    _replies_prefix: str
    _outputs_topic: str

    async def _emit(self, group: list[Item], sizes: list[int], outputs: dict[str, np.ndarray],
                    mask: dict[str, np.ndarray], errors: dict[int, str], failed: Collection[int] = ()) -> None:
        """Queue each request's outputs, but those of ``failed`` (indexes of ``group``: a hook answered
        them with an error, :meth:`_hook_failure`)."""
        node = self.node
        # Batch-native encoding: when every request has the same row count and nothing is masked or failed,
        # each port is serialised once for the whole batch and sliced per request.
        frames: dict[str, list[bytes]] = {}
        out_frames: list[bytes] | None = None
        if not errors and not failed and len(set(sizes)) == 1:
            for port, array in outputs.items():
                if port not in mask and port in node.output_topics:
                    split = encode_split(port, array, len(group))
                    if split is not None:
                        frames[port] = split
            if len(node.emits_outputs) == 1:
                (name, port), = node.emits_outputs.items()
                if port in outputs and port not in mask:
                    out_frames = encode_split(name, outputs[port], len(group))
        if not errors and (out_frames is not None or not node.emits_outputs):
            ports = [p for p in outputs if p in node.output_topics]
            if all(p in frames for p in ports):
                self._emit_framed(group, sizes[0], outputs, [(node.output_topics[p], frames[p]) for p in ports],
                                  out_frames)
                return
        start = 0
        for index, (item, n) in enumerate(zip(group, sizes, strict=True)):
            stop = start + n
            if index in failed:
                start = stop
                continue
            r = item.ready
            bad = next((errors[i] for i in range(start, stop) if i in errors), None) if errors else None
            if bad is not None:
                await self._dead_letter_item(item, Failure(ErrorKind.INVALID_INPUT,
                                                           f"{type(self.component).__name__}: {bad}"))
                start = stop
                continue
            emitted: dict[str, np.ndarray] = {}
            for port, array in outputs.items():
                rows = array[start:stop]
                m = mask.get(port)
                if m is not None:
                    sel = m[start:stop]
                    if not sel.any():
                        continue
                    if not sel.all():
                        rows = rows[sel]
                emitted[port] = rows
            headers = inherit(r.headers, **self._visit_header(r.headers))
            key = r.request_id.encode()
            for port, rows in emitted.items():
                topic = node.output_topics.get(port)
                if topic is not None:
                    value = frames[port][index] if port in frames else encode_tensors({port: rows})
                    self.outbox.add(topic, r.partition, key, value, headers)
            if out_frames is not None and r.headers.get(H_FORMAT) != b"json":
                self.outbox.add(self._reply_topic(r), r.partition, key, out_frames[index], headers)
            elif node.emits_outputs:
                out = {name: emitted[port] for name, port in node.emits_outputs.items() if port in emitted}
                if out:
                    self.outbox.add(self._reply_topic(r), r.partition, key,
                                          self._encode_outputs(r, out), headers)
            self.counters.requests_ok += 1
            start = stop

    def _emit_framed(self, group: list[Item], rows: int, outputs: dict[str, np.ndarray],
                     routes: list[tuple[str, list[bytes]]], out_frames: list[bytes] | None) -> None:
        """The common case of :meth:`_emit`: every request ``rows`` rows, nothing masked or failed, each
        output already serialised once and cut per request, so a request costs its headers and its adds."""
        add = self.outbox.add
        emits = self.node.emits_outputs
        for index, item in enumerate(group):
            r = item.ready
            headers = inherit(r.headers, **self._visit_header(r.headers)) if self._cycles else inherit(r.headers)
            key = r.request_id.encode()
            for topic, split in routes:
                add(topic, r.partition, key, split[index], headers)
            if out_frames is None:
                continue
            if r.headers.get(H_FORMAT) != b"json":
                add(self._reply_topic(r), r.partition, key, out_frames[index], headers)
            else:
                out = {name: outputs[port][index * rows:(index + 1) * rows] for name, port in emits.items()}
                add(self._reply_topic(r), r.partition, key, self._encode_outputs(r, out), headers)
        self.counters.requests_ok += len(group)

    def _reply_topic(self, r: Ready) -> str:
        """Where a request's outputs go: its ``fs-reply-to`` topic (a gateway's own route) or the outputs topic.

        Only the topology's own reply topics are honoured, so a header cannot make a worker write anywhere.
        """
        route = r.headers.get(H_REPLY_TO)
        if route is not None:
            topic = route.decode("utf-8", "replace")
            if topic.startswith(self._replies_prefix):
                return topic
        return self._outputs_topic

    def _encode_outputs(self, r: Ready, out: dict[str, np.ndarray]) -> bytes:
        if r.headers.get(H_FORMAT) == b"json":
            body = make_response(self.topology.name, r.request_id, out, self.topology.version)
            return json.dumps(body).encode()
        return encode_tensors(out)

    def _visit_header(self, headers: Mapping[str, bytes]) -> dict[str, bytes]:
        if not self._cycles:
            return {}
        visits = _visits(headers.get(H_VISITS))
        visits[self.node.id] = visits.get(self.node.id, 0) + 1
        return {H_VISITS: ",".join(f"{k}={v}" for k, v in visits.items()).encode()}

    # -- failures ----------------------------------------------------------------------------------

    async def _emit_error(self, r: Ready, failure: Failure, *, count: bool = True) -> None:
        """Send an error result downstream (every output port, and the outputs topic) so callers learn."""
        if count:
            self.counters.error_results += 1
        headers = inherit(r.headers, **error_headers(failure, self.node.id), **self._visit_header(r.headers))
        key = r.request_id.encode()
        for topic in self.node.output_topics.values():
            self.outbox.add(topic, r.partition, key, _EMPTY, headers)
        if self.node.emits_outputs:
            value = _EMPTY
            if r.headers.get(H_FORMAT) == b"json":
                value = json.dumps({"id": r.request_id, "error": failure.reason, "kind": failure.kind}).encode()
            self.outbox.add(self._reply_topic(r), r.partition, key, value, headers)

    async def _hook_failure(self, item: Item, failure: Failure) -> None:
        """A request a hook answered with an error (``Answered.failures``), counted as the worker's own: one
        that cannot make its deadline is refused (an error result); anything else is a dead letter."""
        if failure.kind in (ErrorKind.REFUSED, ErrorKind.DEADLINE):
            self.counters.refused += 1
            await self._emit_error(item.ready, failure)
        else:
            await self._dead_letter_item(item, failure)

    async def _dead_letter(self, key: bytes | None, value: bytes | None, raw_headers: Any, partition: int,
                           source: str, failure: Failure) -> None:
        self.counters.dead_lettered += 1
        kind = failure.kind.value
        self.counters.dead_letter_reasons[kind] = self.counters.dead_letter_reasons.get(kind, 0) + 1
        log.warning("node %s dead-lettered %s (%s): %s", self.node.id, source, kind, failure.reason)
        headers = {k: v for k, v in raw_headers or ()}
        body = value or b""
        extra = {**error_headers(failure, self.node.id), "fs-source": source.encode()}
        if len(body) > self.max_bytes:
            extra["fs-truncated"] = str(len(body)).encode()
            body = body[: self.max_bytes // 2]
        self.outbox.add(self.topology.deadletter_topic, partition, key,
                              body, inherit(headers, **extra))
        request_id = key.decode("utf-8", "replace") if key else headers.get("fs-id", b"").decode("utf-8", "replace")
        if request_id:
            await self._emit_error(Ready(request_id, {}, headers, partition), failure, count=False)

    async def _dead_letter_item(self, item: Item, failure: Failure) -> None:
        r = item.ready
        value = item.raw if item.raw is not None else encode_tensors(r.tensors)
        await self._dead_letter(r.request_id.encode(), value, list(r.headers.items()), r.partition,
                                item.source or f"join:{self.node.id}", failure)



def _visits(raw: bytes | None) -> dict[str, int]:
    if not raw:
        return {}
    out: dict[str, int] = {}
    for part in raw.decode("ascii", "replace").split(","):
        name, _, count = part.partition("=")
        if count.isdigit():
            out[name] = int(count)
    return out


