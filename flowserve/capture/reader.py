"""Read records back from a topology's topics: a key's records, the last N, or given offsets.

Reads with a group-less consumer (nothing is committed) from each partition's start (or N before its
end) up to the end offsets seen when the read began, so a read always finishes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer, TopicPartition

from flowserve.errors import BrokerError, WireError
from flowserve.kafka.admin import describe_partitions
from flowserve.kafka.settings import KafkaSettings
from flowserve.wire.tensors import datatype_of, decode_tensors
from flowserve.wire.v2 import parse_request

_FETCH_BYTES = 64 * 1_048_576


@dataclass
class Decoded:
    """One record, decoded for people and for programs."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: str | None
    headers: dict[str, str]
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    body: Any = None  # a JSON value (V2 request, lineage or drift record), when the value is JSON
    error: str | None = None  # why the value could not be decoded
    size: int = 0

    def to_dict(self, *, full: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"topic": self.topic, "partition": self.partition, "offset": self.offset,
                               "timestamp_ms": self.timestamp_ms, "key": self.key, "headers": self.headers,
                               "size": self.size}
        if self.tensors:
            out["tensors"] = {n: tensor_json(a, full=full) for n, a in self.tensors.items()}
        if self.body is not None:
            out["json"] = self.body
        if self.error is not None:
            out["error"] = self.error
        return out


def tensor_json(array: np.ndarray, *, full: bool = True) -> dict[str, Any]:
    """A tensor as JSON: datatype, shape, min/max/mean of numbers, and (``full``) its values."""
    out: dict[str, Any] = {"datatype": datatype_of(array), "shape": list(array.shape)}
    out.update(_stats(array))
    if full:
        if array.dtype.kind in "OSU":
            out["data"] = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.ravel()]
        else:
            out["data"] = array.ravel().tolist()
    return out


def _stats(array: np.ndarray) -> dict[str, Any]:
    if array.size == 0 or array.dtype.kind not in "biuf":
        return {}
    values = array.astype(np.float64, copy=False)
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return {"nan": int(np.isnan(values).sum())}
    out: dict[str, Any] = {"min": float(finite.min()), "max": float(finite.max()), "mean": float(finite.mean())}
    if finite.size != values.size:
        out["nonfinite"] = int(values.size - finite.size)
    return out


def decode(rec: Any) -> Decoded:
    value: bytes = rec.value or b""
    headers = {k: v.decode("utf-8", "replace") for k, v in rec.headers or ()}
    out = Decoded(rec.topic, rec.partition, rec.offset, rec.timestamp,
                  rec.key.decode("utf-8", "replace") if rec.key is not None else None, headers, size=len(value))
    if not value:
        return out
    if value[:1] == b"{":
        try:
            out.body = json.loads(value)
        except ValueError as exc:
            out.error = f"not JSON: {exc}"
            return out
        if rec.topic.endswith(".inputs") and isinstance(out.body, dict):
            try:
                _, out.tensors, _ = parse_request(value)
            except WireError as exc:
                out.error = str(exc)
        return out
    try:
        out.tensors = decode_tensors(value)
    except WireError as exc:
        out.error = str(exc)
    return out


class Reader:
    """A group-less consumer for reading topics back. ``async with Reader(kafka) as r: ...``."""

    def __init__(self, kafka: KafkaSettings, *, timeout_s: float = 30.0) -> None:
        self.kafka = kafka
        self.timeout_s = timeout_s
        # A one-off read that learns an empty partition's end from a fetch response: a short broker wait.
        self._consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, fetch_max_wait_ms=5,
                                          auto_offset_reset="earliest", max_partition_fetch_bytes=_FETCH_BYTES,
                                          fetch_max_bytes=_FETCH_BYTES, **kafka.client_kwargs())

    async def __aenter__(self) -> Reader:
        try:
            await asyncio.wait_for(self._consumer.start(), self.timeout_s)
        except Exception as exc:
            raise BrokerError(f"cannot reach Kafka at {self.kafka.bootstrap}: {exc!r}") from None
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def topics(self, prefix: str = "") -> list[str]:
        return sorted(t for t in await self._consumer.topics() if t.startswith(prefix))

    async def _partitions(self, topics: Iterable[str]) -> list[TopicPartition]:
        wanted = list(dict.fromkeys(topics))
        if not wanted:
            return []
        # The consumer's metadata can lag a topic's creation (``partitions_for_topic`` None after
        # ``topics()``); the admin client's answer is authoritative. A topic that exists but has no
        # partition leaders yet is asked again, a bounded number of times.
        known = set(await self._consumer.topics())
        present = [t for t in wanted if t in known]
        counts: dict[str, int] = {}
        for attempt in range(10):
            counts.update(await describe_partitions(self.kafka, [t for t in present if not counts.get(t)]))
            if all(counts.get(t) for t in present):
                break
            await asyncio.sleep(0.05 * (attempt + 1))  # metadata propagation, not synchronisation of results
        return [TopicPartition(t, p) for t in wanted for p in range(counts.get(t, 0))]

    async def read(self, topics: Iterable[str], *, key: str | None = None, last: int | None = None,
                   contains: bytes | None = None) -> list[Decoded]:
        """Records of ``topics`` (with ``key`` only, when given; whose value holds the bytes ``contains``,
        when given; the last ``last`` per topic, when given)."""
        consumer = self._consumer
        tps = await self._partitions(topics)
        if not tps:
            return []
        consumer.assign(tps)
        begins = await consumer.beginning_offsets(tps)
        # Some brokers (the embedded one) under-report the end offset; it is only a lower bound here,
        # and the high watermark of the first fetch response gives the real end.
        ends = await consumer.end_offsets(tps)
        remaining: set[TopicPartition] = set()
        next_offset: dict[TopicPartition, int] = {}
        for tp in tps:
            start = begins[tp] if last is None else max(begins[tp], ends[tp] - last)
            consumer.seek(tp, start)
            next_offset[tp] = start
            remaining.add(tp)
        raw: list[Any] = []
        wanted = key.encode() if key is not None else None
        target: dict[TopicPartition, int] = {}
        idle: dict[TopicPartition, int] = {}
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        while remaining:
            if asyncio.get_running_loop().time() > deadline:
                raise BrokerError(f"timed out reading {', '.join(sorted({tp.topic for tp in remaining}))}")
            fetched = await consumer.getmany(*remaining, timeout_ms=100, max_records=10_000)
            for tp, records in fetched.items():
                stop = target.get(tp)
                for rec in records:
                    if (stop is None or rec.offset < stop) and (wanted is None or rec.key == wanted) and (
                            contains is None or (rec.value is not None and contains in rec.value)):
                        raw.append(rec)
                if records:
                    next_offset[tp] = records[-1].offset + 1
            for tp in list(remaining):
                if tp not in target and (high := consumer.highwater(tp)) is not None:
                    target[tp] = max(high, ends[tp])
                stop = target.get(tp)
                if stop is not None and next_offset[tp] >= stop:
                    remaining.discard(tp)
                elif not fetched.get(tp):
                    idle[tp] = idle.get(tp, 0) + 1
                    if idle[tp] >= 5 and (stop is None or await consumer.position(tp) >= stop):
                        remaining.discard(tp)  # an empty partition, or only markers left
        if last is not None:  # the last N of each topic across its partitions
            by_topic: dict[str, list[Any]] = {}
            for rec in raw:
                by_topic.setdefault(rec.topic, []).append(rec)
            raw = [r for recs in by_topic.values()
                   for r in sorted(recs, key=lambda r: (r.timestamp, r.partition, r.offset))[-last:]]
        raw.sort(key=lambda r: (r.timestamp, r.topic, r.partition, r.offset))
        return [decode(r) for r in raw]

    async def read_at(self, positions: Sequence[tuple[str, int, int]]) -> dict[tuple[str, int, int], Decoded]:
        """The records at exact (topic, partition, offset) positions (absent when gone, e.g. retention)."""
        consumer = self._consumer
        out: dict[tuple[str, int, int], Decoded] = {}
        tps = sorted({TopicPartition(t, p) for t, p, _ in positions})
        if not tps:
            return out
        consumer.assign(tps)
        begins = await consumer.beginning_offsets(tps)
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        for topic, partition, offset in dict.fromkeys(positions):
            tp = TopicPartition(topic, partition)
            if offset < begins[tp]:
                continue
            consumer.seek(tp, offset)
            empty = 0
            while empty < 5 and asyncio.get_running_loop().time() < deadline:
                records = (await consumer.getmany(tp, timeout_ms=100, max_records=100)).get(tp, [])
                hit = next((r for r in records if r.offset >= offset), None)
                if hit is not None:
                    if hit.offset == offset:
                        out[(topic, partition, offset)] = decode(hit)
                    break
                high = consumer.highwater(tp)
                empty += 1 if not records and high is not None and offset >= high else 0
        return out
