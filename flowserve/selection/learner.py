"""The learner beside a learning node's worker: restores its state, then joins feedback to its decisions.

It runs in its own thread with its own event loop and Kafka consumer (no consumer group: every worker of
the node reads every partition, so each learns from all the feedback and they agree; the updates are
multiplicative, so the order records arrive in does not matter). It never touches the component: it
hands joined records and the feedback watermark to the worker's thread through a queue, and the hook
(:mod:`flowserve.selection.hooks`) calls the component between batches.

At start it reads the node's state topic to its end (the last record per key wins, as compaction keeps
it): ``context/<name>`` records hold a context's learned state, the ``position`` record the feedback
watermark the states reflect. Feedback is then read from that watermark; decisions and answers from
``window_ms`` before now, so feedback that arrived while no worker ran is still joined.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from flowserve.errors import FlowserveError, TopologyError, WireError
from flowserve.kafka.clients import OVERHEAD
from flowserve.kafka.settings import KafkaSettings
from flowserve.selection.capabilities import Joined, LearnsFromFeedback
from flowserve.selection.join import FeedbackJoin
from flowserve.topology import names
from flowserve.topology.graph import Node, Topology
from flowserve.wire.envelope import decode_record, now_ms
from flowserve.wire.feedback import MAX_FEEDBACK_BYTES, decode_feedback

log = logging.getLogger("flowserve.selection")

POSITION_KEY = b"position"
CONTEXT_PREFIX = "context/"


@dataclass(slots=True)
class Restored:
    """What the state topic held: learned state per context, and the feedback watermark it reflects."""

    states: dict[str, dict[str, Any]] = field(default_factory=dict)
    watermark: dict[int, int] = field(default_factory=dict)
    applied_above: dict[int, list[int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Progress:
    """Joined feedback and the watermark after it, from the learner's thread to the worker's."""

    joined: list[Joined]
    watermark: dict[int, int]
    applied_above: dict[int, list[int]]


def read_state_value(key: bytes | None, value: bytes | None, into: Restored) -> None:
    """Fold one state-topic record into ``into`` (a record that cannot be read is skipped)."""
    if key is None or value is None:
        return
    try:
        doc = json.loads(value)
    except ValueError:
        return
    if not isinstance(doc, dict):
        return
    if key == POSITION_KEY:
        into.watermark = {int(p): int(o) for p, o in (doc.get("watermark") or {}).items()}
        into.applied_above = {int(p): [int(o) for o in offs] for p, offs in (doc.get("applied_above") or {}).items()}
        return
    text = key.decode("utf-8", "replace")
    if text.startswith(CONTEXT_PREFIX):
        into.states[text[len(CONTEXT_PREFIX):]] = doc


def answer_topics(topology: Topology, node: Node, component: LearnsFromFeedback) -> dict[str, str]:
    """``node.port`` -> topic of each answer the component's decisions name; each must be a topic."""
    owned = set(topology.topics())
    out: dict[str, str] = {}
    for ref in component.answer_refs():
        other, _, port = ref.partition(".")
        topic = names.edge_topic(topology.base, other, port)
        if topic not in owned:
            raise TopologyError(f"answer '{ref}' of learning node '{node.id}' has no topic: no node reads it; "
                                f"add it to 'capture: {{ports: [{ref}]}}' so the join can read it",
                                node=node.id)
        out[topic] = ref
    return out


class Learner:
    """Restores a learning node's state and joins feedback to its decisions, in a thread of its own."""

    def __init__(self, topology: Topology, node: Node, component: LearnsFromFeedback, kafka: KafkaSettings, *,
                 window_ms: int = 600_000, max_pending: int = 100_000, restore_timeout_s: float = 60.0) -> None:
        self.topology = topology
        self.node = node
        self.kafka = kafka
        self.partitions = topology.spec.partitions
        self.answers = answer_topics(topology, node, component)
        self.feedback_topic = topology.feedback_topic
        self.decisions_topic = topology.decisions_topic(node.id)
        self.state_topic = topology.state_topic(node.id)
        self.join = FeedbackJoin(window_ms=window_ms, max_pending=max_pending)
        self.restore_timeout_s = restore_timeout_s
        self.restored = Restored()
        self.bad_feedback = 0
        self.out: queue.SimpleQueue[Progress] = queue.SimpleQueue()
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"learner-{node.id}", daemon=True)

    def start(self) -> Restored:
        """Start the thread; returns once the state topic was read to its end (raises if it cannot be)."""
        self._thread.start()
        if not self._ready.wait(self.restore_timeout_s):
            self.close()
            raise FlowserveError(f"node '{self.node.id}': could not read its learned state from "
                                 f"{self.state_topic} within {self.restore_timeout_s:.0f} s")
        if self._failed is not None:
            raise FlowserveError(f"node '{self.node.id}': cannot read its learned state: {self._failed!r}")
        return self.restored

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10.0)

    def drain(self) -> list[Progress]:
        out: list[Progress] = []
        with contextlib.suppress(queue.Empty):
            while True:
                out.append(self.out.get_nowait())
        return out

    # -- the thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported to start(), or logged when it came later
            self._failed = exc
            if self._ready.is_set():
                log.error("node %s: the feedback learner stopped: %r", self.node.id, exc)
            self._ready.set()

    async def _main(self) -> None:
        consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, client_id=f"fs-{self.node.id}-learner",
                                    fetch_max_wait_ms=self.kafka.fetch_max_wait_ms,
                                    max_partition_fetch_bytes=max(1 << 20, self.topology.spec.max_message_bytes
                                                                  + OVERHEAD),
                                    **self.kafka.client_kwargs())
        await consumer.start()
        try:
            await self._restore(consumer)
            self.join.resume(self.restored.watermark, self.restored.applied_above)
            # positioned before the worker takes its first batch: a decision written meanwhile is not skipped
            await self._position(consumer)
            self._ready.set()
            while not self._stop.is_set():
                fetched = await consumer.getmany(timeout_ms=200, max_records=2000)
                now = now_ms()
                joined: list[Joined] = []
                for tp, records in fetched.items():
                    for rec in records:
                        done = self._take(tp, rec, now)
                        if done is not None:
                            joined.append(done)
                    if tp.topic == self.feedback_topic and records:
                        self.join.read_to(tp.partition, records[-1].offset + 1)
                self.join.expire(now)
                if joined or fetched:
                    marks, applied = self.join.watermark()
                    self.out.put(Progress(joined, marks, applied))
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()

    async def _restore(self, consumer: AIOKafkaConsumer) -> None:
        tps = [TopicPartition(self.state_topic, p) for p in range(self.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        left = {tp for tp in tps if ends[tp] > 0}
        while left and not self._stop.is_set():
            fetched = await consumer.getmany(*left, timeout_ms=500)
            for records in fetched.values():
                for rec in records:
                    read_state_value(rec.key, rec.value, self.restored)
            left = {tp for tp in left if await consumer.position(tp) < ends[tp]}

    async def _position(self, consumer: AIOKafkaConsumer) -> None:
        since = now_ms() - self.join.window_ms
        windowed = [TopicPartition(t, p) for t in (self.decisions_topic, *self.answers) for p in range(self.partitions)]
        feedback = [TopicPartition(self.feedback_topic, p) for p in range(self.partitions)]
        consumer.assign([*windowed, *feedback])
        marks = self.restored.watermark
        from_time = [tp for tp in feedback if tp.partition not in marks] + windowed
        for tp in feedback:
            if tp.partition in marks:
                consumer.seek(tp, marks[tp.partition])
        try:
            found = await consumer.offsets_for_times({tp: since for tp in from_time})
        except Exception as exc:  # noqa: BLE001 - a broker without timestamp lookups: read what it has
            log.info("node %s: offsets by time unavailable (%r); reading the join's topics from the start",
                     self.node.id, exc)
            found = {}
        # explicit offsets, never a lazy reset: it would resolve whenever the first fetch goes out
        starts = await consumer.beginning_offsets(from_time)
        ends = await consumer.end_offsets(from_time)
        for tp in from_time:
            hit = found.get(tp)
            if hit is not None:
                consumer.seek(tp, hit.offset)
            elif found:
                consumer.seek(tp, ends[tp])  # nothing newer than the window
            else:
                consumer.seek(tp, starts[tp])

    def _take(self, tp: TopicPartition, rec: Any, now: int) -> Joined | None:
        topic = tp.topic
        if topic == self.feedback_topic:
            value = rec.value
            if value is not None and len(value) > MAX_FEEDBACK_BYTES:
                self.bad_feedback += 1
                return None
            try:
                fb = decode_feedback(rec.key, value, rec.timestamp)
            except WireError as exc:
                self.bad_feedback += 1
                log.debug("node %s: unreadable feedback at %s:%d: %s", self.node.id, tp, rec.offset, exc)
                return None
            return self.join.feedback(fb, tp.partition, rec.offset, now)
        if topic == self.decisions_topic:
            try:
                doc = json.loads(rec.value)
            except (TypeError, ValueError):
                return None
            return self.join.decision(doc, now) if isinstance(doc, Mapping) else None
        ref = self.answers.get(topic)
        if ref is None:
            return None
        try:
            env = decode_record(rec.key, rec.value, rec.headers)
        except WireError:
            return None
        if env.error is not None or not env.tensors:
            return None
        return self.join.answer(ref, env.request_id, env.tensors, now)

