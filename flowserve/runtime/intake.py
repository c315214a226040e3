"""The input side of a stage worker: fetched records become requests ready for ``process``.

One queue in arrival order (partitions merged by record timestamp, each partition's order kept), what the
hooks admit (:meth:`~flowserve.runtime.hooks.StageHooks.admit`), decoded a whole fetch at once where every
record shares one frame layout (one ``frombuffer`` for all: each request's tensor a row-slice view of it),
else record by record; joins assembled. A record that cannot be used is dead-lettered with its reason.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from aiokafka import TopicPartition

from flowserve.errors import ErrorKind, Failure, WireError
from flowserve.runtime.emit import Emitter, Item, _visits
from flowserve.runtime.hooks import StageHooks
from flowserve.runtime.join import TP, JoinBuffer, Ready
from flowserve.runtime.metrics import NodeMetrics
from flowserve.wire.envelope import H_ERROR, H_ID, H_VISITS, decode_record, now_ms
from flowserve.wire.tensors import decode_tensors


class Intake(Emitter):
    """Mixin of :class:`~flowserve.runtime.worker.StageWorker`: everything that reads records."""

    hooks: tuple[StageHooks, ...]
    join: JoinBuffer | None
    metrics: NodeMetrics | None
    #: a plain node's one input port and the tensor feeding it: the whole fetch is decoded at once
    _columnar: tuple[str, str] | None
    _inputs_topic: str

    async def _read(self, fetched: Mapping[TopicPartition, list[Any]], now: int) -> list[Item]:
        """The requests of one fetch (and of joins that fire now), in arrival order."""
        items: list[Item] = []
        ordered = next(iter(fetched.values())) if len(fetched) == 1 else heapq.merge(
            *fetched.values(), key=_timestamp)
        waits: list[float] = []
        records = list(ordered)
        for hook in self.hooks:
            records = hook.admit(records)
        if self._columnar is not None and records and self._intake_columnar(records, items):
            self.counters.records_in += len(records)
            waits = [now - r.timestamp for r in records if r.timestamp and r.timestamp > 0]
            records = []
        for rec in records:
            self.counters.records_in += 1
            if rec.timestamp and rec.timestamp > 0:
                waits.append(now - rec.timestamp)
            await self._intake(rec, (rec.topic, rec.partition), now, items)
        if waits and self.metrics is not None:
            self.metrics.queue_wait(waits)
        if self.join is not None:
            items.extend(Item(r) for r in self.join.expire(now_ms() if self.join.kind == "deadline" else now))
            self.counters.join_late, self.counters.join_partial = self.join.late, self.join.partial
        return items

    def _intake_columnar(self, records: list[Any], items: list[Item]) -> bool:
        """Decode a whole fetch at once when every record shares one frame layout (the common case).

        Returns False, having added nothing, whenever anything is unusual (an error result, a missing key,
        another layout, a value over the size limit, a port mismatch or NaN): the per-record path then
        finds and dead-letters exactly the records at fault.
        """
        assert self._columnar is not None
        port, tensor = self._columnar
        column = decode_column([r.value for r in records])
        if column is None:
            return False
        name, stacked, rows = column
        if name != tensor or len(records[0].value) > self.max_bytes:
            return False
        try:
            self.component.inputs[port].check(port, stacked)
        except WireError:
            return False
        headers = [dict(r.headers) if r.headers else {} for r in records]
        if any(r.key is None or H_ERROR in h for r, h in zip(records, headers, strict=True)):
            return False
        signature = ((port, stacked.dtype.str, stacked.shape[1:]),)
        for i, (rec, hdrs) in enumerate(zip(records, headers, strict=True)):
            rid = rec.key.decode("utf-8", "replace")
            hdrs.setdefault(H_ID, rec.key)
            ready = Ready(rid, {port: stacked[i * rows : (i + 1) * rows]}, hdrs, rec.partition)
            items.append(Item(ready, rec.value, f"{rec.topic}:{rec.partition}:{rec.offset}", signature))
        return True

    async def _intake(self, rec: Any, tp: TP, now: int, items: list[Item]) -> None:
        source = f"{rec.topic}:{rec.partition}:{rec.offset}"
        value = rec.value
        if value is not None and len(value) > self.max_bytes:
            await self._dead_letter(rec.key, value, rec.headers, tp[1], source, Failure(
                ErrorKind.OVERSIZE, f"record of {len(value)} bytes exceeds max_message_bytes {self.max_bytes}"))
            return
        try:
            env = decode_record(rec.key, value, rec.headers, accept_json=rec.topic == self._inputs_topic)
        except WireError as exc:
            await self._dead_letter(rec.key, value, rec.headers, tp[1], source, Failure(exc.kind, str(exc)))
            return
        join_key = None
        if self._cycles:
            seen = _visits(env.headers.get(H_VISITS)).get(self.node.id, 0)
            if seen >= self.topology.spec.max_revisits:
                # An error result that has gone round as often as a request may is dropped, not re-sent:
                # that is what ends a cycle's error path.
                if env.error is None:
                    await self._emit_error(Ready(env.request_id, {}, env.headers, tp[1]), Failure(
                        ErrorKind.REVISIT_LIMIT,
                        f"node '{self.node.id}' revisited more than {self.topology.spec.max_revisits} times"))
                return
            join_key = f"{env.request_id}#{seen}"
        if self.join is not None:
            ready = self.join.add(env, rec.topic, tp, rec.offset, now, key=join_key)
            if ready is not None:
                items.append(Item(ready))
            return
        if env.error is not None:
            items.append(Item(Ready(env.request_id, {}, env.headers, tp[1], env.error)))
            return
        tensors: dict[str, np.ndarray] = {}
        for port, sources in self.node.bindings.items():
            array = env.tensors.get(sources[0].tensor)
            if array is None:
                await self._dead_letter(rec.key, value, rec.headers, tp[1], source, Failure(
                    ErrorKind.INVALID_INPUT, f"record has no tensor '{sources[0].tensor}' for input port '{port}' "
                                             f"(it has: {', '.join(env.tensors) or 'none'})"))
                return
            tensors[port] = array
        items.append(Item(Ready(env.request_id, tensors, env.headers, tp[1]), value, source))


def _timestamp(rec: Any) -> int:
    return rec.timestamp or 0


def decode_column(values: Sequence[bytes]) -> tuple[str, np.ndarray, int] | None:
    """``(tensor name, stacked array, rows per record)`` when every value is a single-tensor frame of one
    fixed-width layout; None otherwise (the caller then decodes record by record)."""
    if not values:
        return None
    first = values[0]
    if type(first) is not bytes:
        return None
    try:
        decoded = decode_tensors(first)
    except WireError:
        return None
    if len(decoded) != 1:
        return None
    ((name, array),) = decoded.items()
    # BOOL payloads are value-checked per frame; BYTES are variable length.
    if array.dtype.kind in "Ob" or array.ndim == 0:
        return None
    size = len(first)
    hlen = size - array.nbytes
    head = first[:hlen]
    for v in values:
        if type(v) is not bytes or len(v) != size or not v.startswith(head):
            return None
    rows = array.shape[0]
    payload = b"".join([v[hlen:] for v in values])
    stacked = np.frombuffer(payload, dtype=array.dtype).reshape((len(values) * rows, *array.shape[1:]))
    return name, stacked, rows
