"""Where parity plugs into workers: the encoder in the feeding node's workers, the decoder beside the parity model.

- :class:`EncoderHooks` runs in the workers of the node that feeds a protected node (``pre`` feeds
  ``model`` in the digits topology). After each batch it adds the rows bound for the protected node to
  the :class:`~flowserve.parity.groups.Encoder` and queues each completed group's parity query on
  ``<base>.<node>.parity`` (same partition, in the batch's outbox: acknowledged before its offsets commit).
  The requests themselves go on at once, untouched: parity never delays the normal path.
- :class:`DecoderHooks` runs in the parity model node's workers (independent of the protected node's:
  that is the point). Each parity output the worker computes goes straight to its :class:`DecoderLoop`
  (no hop through the parity output topic: a rebuild is on the clock), which also reads every partition
  of the protected node's outputs. A rebuilt output is written to the protected node's output topic,
  marked with ``fs-reconstructed`` (the group id), plus a lineage record naming the group: through the
  worker's outbox when the parity output completes the group (acknowledged before the parity query's
  offset commits), through the loop's producer when a real output does. The readers of that topic keep
  the first record of a request and drop a later one (``Node.first_wins``), so downstream sees one
  ordinary output.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiokafka import TopicPartition

from flowserve.component import Component
from flowserve.errors import WireError
from flowserve.kafka.clients import make_consumer, make_producer
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.kafka.shutdown import stop_client
from flowserve.parity.first_wins import first_wins_hooks
from flowserve.parity.groups import Decoder, Encoder, Member, Reconstructed
from flowserve.runtime.emit import Item
from flowserve.runtime.hooks import BatchOutcome, HookFactory, StageContext, StageHooks
from flowserve.topology import names
from flowserve.topology.graph import Node, Topology
from flowserve.topology.parity import ParitySpec
from flowserve.wire.envelope import H_ERROR, H_ID, H_PARITY_MEMBERS, H_RECONSTRUCTED, now_ms
from flowserve.wire.tensors import decode_tensors, encode_tensors

log = logging.getLogger("flowserve.parity")


@dataclass(frozen=True, slots=True)
class Target:
    """A protected node fed by this worker's node: which output port feeds which input port."""

    node: str
    out_port: str
    in_port: str
    topic: str
    spec: ParitySpec


def targets_of(topology: Topology, node: Node) -> list[Target]:
    """The parity-protected nodes that ``node`` feeds."""
    out: list[Target] = []
    for nid, spec in topology.spec.nodes.items():
        if spec.parity is None or nid not in topology.nodes:
            continue
        for in_port, sources in topology.nodes[nid].bindings.items():
            for src in sources:
                if src.node == node.id:
                    out.append(Target(nid, src.tensor, in_port, names.parity_query_topic(topology.base, nid),
                                      spec.parity))
    return out


def encode_members(members: Sequence[Member]) -> bytes:
    """The ``fs-parity-members`` header: ``[[request id, partition, {header: latin-1 value}], ...]``."""
    return json.dumps([[m.request_id, m.partition, {k: v.decode("latin-1") for k, v in m.headers.items()}]
                       for m in members], separators=(",", ":")).encode()


def decode_members(raw: bytes) -> list[Member]:
    return [Member(rid, int(partition), {k: v.encode("latin-1") for k, v in headers.items()})
            for rid, partition, headers in json.loads(raw)]


class EncoderHooks(StageHooks):
    """Groups the rows this node sends to parity-protected nodes into parity queries."""

    def __init__(self, targets: Sequence[Target], partitions: int) -> None:
        self.targets = list(targets)
        self.encoders = {t.node: Encoder(t.spec.k, t.spec.wait_ms, partitions, t.spec.encoder, t.spec.image)
                         for t in self.targets}
        self.queries = 0
        self._emit: Any = None

    def start(self, stage: StageContext) -> None:
        self._emit = stage.emit

    def begin(self, items: Sequence[Item]) -> Any:
        return [(it.ready.request_id, it.ready.partition, it.ready.headers) for it in items]

    def end(self, token: Any, outcome: BatchOutcome) -> None:
        now = now_ms()
        for target in self.targets:
            array = outcome.outputs.get(target.out_port)
            if array is None or target.out_port in outcome.mask:
                continue  # a masked (routed) port: which requests go where is not known per group
            encoder = self.encoders[target.node]
            for (rid, partition, headers), (rows, failed) in zip(token, outcome.requests(), strict=True):
                if failed:
                    continue
                member = Member(rid, partition, {k: v for k, v in headers.items() if k != H_ID})
                group = encoder.add(partition, member, {target.in_port: array[rows]}, now)
                if group is not None:
                    self.queries += 1
                    self._emit(target.topic, group.partition, group.group_id.encode(), encode_tensors(group.query),
                               [(H_ID, group.group_id.encode()), (H_PARITY_MEMBERS, encode_members(group.members))])

    def after_step(self, *, force: bool) -> bool:
        now = now_ms()
        for encoder in self.encoders.values():
            encoder.expire(now)
        return True

    def counters(self) -> Mapping[str, int]:
        groups = sum(e.counters.groups for e in self.encoders.values())
        abandoned = sum(e.counters.abandoned for e in self.encoders.values())
        return {"parity_groups": groups, "parity_queries": self.queries, "parity_abandoned": abandoned}


#: a record to write: (topic, key, value, partition, headers)
Record = tuple[str, bytes, bytes, int, list[tuple[str, bytes]]]


class DecoderLoop:
    """Reads a protected node's outputs; takes the parity outputs from its worker; rebuilds what is late."""

    def __init__(self, topology: Topology, protected: str, kafka: KafkaSettings,
                 settings: WorkerSettings | None = None) -> None:
        spec = topology.spec.nodes[protected].parity
        assert spec is not None
        self.topology = topology
        self.protected = protected
        self.outputs = dict(topology.nodes[protected].output_topics)  # port -> topic
        self.decoder = Decoder(spec.hold_ms)
        self.kafka = kafka
        self.settings = settings or WorkerSettings()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        # A group's members live on several partitions, so every decoder reads every partition of the real
        # outputs (no group, from the end: outputs from before it started belong to nobody's group).
        max_bytes = self.topology.spec.max_message_bytes
        client = f"fs-{self.protected}-decoder"
        real = make_consumer(self.kafka, self.settings.model_copy(update={"auto_offset_reset": "latest"}),
                             max_message_bytes=max_bytes, client_id=client, group_id=None)
        producer = make_producer(self.kafka, self.settings, max_message_bytes=max_bytes, client_id=client)
        await producer.start()
        await real.start()
        real.assign([TopicPartition(t, p) for t in self.outputs.values() for p in range(self.topology.spec.partitions)])
        wait = self.settings.poll_timeout_ms
        try:
            while not self._stop.is_set():
                fetched = await real.getmany(timeout_ms=wait, max_records=5000)
                futures = [await producer.send(topic, value, key=key, partition=partition, headers=headers)
                           for topic, key, value, partition, headers in self.step(fetched)]
                if futures:
                    await asyncio.gather(*futures)
        finally:
            await stop_client(real, f"{client}: output consumer stop")
            await stop_client(producer, f"{client}: producer stop")

    def step(self, fetched: Mapping[Any, list[Any]]) -> list[Record]:
        """Feed the protected node's outputs to the decoder; the records to write.
        Records that cannot be used (errors, undecodable) are skipped: the real path carries them."""
        now = now_ms()
        out: list[Record] = []
        for records in fetched.values():
            for rec in records:
                headers = dict(rec.headers or ())
                # error results carry nothing to decode with; rebuilt outputs are this decoder's own echo
                if H_ERROR in headers or H_RECONSTRUCTED in headers or rec.key is None:
                    continue
                try:
                    tensors = decode_tensors(rec.value)
                except WireError as exc:  # the real path dead-letters it; the decoder just cannot use it
                    log.debug("parity decoder: skipping %s:%s:%s: %s", rec.topic, rec.partition, rec.offset, exc)
                    continue
                out += self._records(self.decoder.real(rec.key.decode("utf-8", "replace"), tensors, now), now)
        self.decoder.expire(now)
        return out

    def parity(self, group_id: str, members: Sequence[Member], outputs: dict[str, np.ndarray]) -> list[Record]:
        """The parity model computed a group's parity output; the records to write."""
        now = now_ms()
        return self._records(self.decoder.parity(group_id, members, outputs, now), now)

    def _records(self, rebuilt: Sequence[Reconstructed], now: float) -> list[Record]:
        out: list[Record] = []
        for r in rebuilt:
            hdrs = [*r.member.headers.items(), (H_ID, r.member.request_id.encode()),
                    (H_RECONSTRUCTED, r.group_id.encode())]
            key = r.member.request_id.encode()
            for port, rows in r.outputs.items():
                out.append((self.outputs[port], key, encode_tensors({port: rows}), r.member.partition, hdrs))
            lineage = self._lineage(r.member.request_id, r.group_id, list(r.members))
            out.append((self.topology.lineage_topic, key, json.dumps(lineage).encode(), r.member.partition, []))
            action = {"ts_ms": now, "source": "parity", "node": self.protected,
                      "action": {"reconstructed": r.member.request_id, "group": r.group_id,
                                 "members": list(r.members)}}
            out.append((self.topology.actions_topic, key, json.dumps(action).encode(), r.member.partition, []))
        return out

    def _lineage(self, rid: str, gid: str, members: list[str]) -> dict[str, Any]:
        return {"request_id": rid, "topology": self.topology.name, "version": self.topology.version,
                "node": self.protected, "component": "parity-decoder",
                "reconstructed": {"group": gid, "members": members}}


class DecoderHooks(StageHooks):
    """In a parity model node's worker: hands each parity output it computes to the protected node's
    :class:`DecoderLoop`, which runs beside it, and queues the outputs rebuilt from it in the outbox."""

    def __init__(self, loop: DecoderLoop) -> None:
        self.loop = loop
        self._task: asyncio.Task[None] | None = None
        self._emit: Any = None

    def start(self, stage: StageContext) -> None:
        self._emit = stage.emit
        self._task = asyncio.get_running_loop().create_task(self.loop.run())
        self._task.add_done_callback(_report)

    def begin(self, items: Sequence[Item]) -> Any:
        return [(it.ready.request_id, it.ready.headers.get(H_PARITY_MEMBERS)) for it in items]

    def end(self, token: Any, outcome: BatchOutcome) -> None:
        for (gid, members), (rows, failed) in zip(token, outcome.requests(), strict=True):
            if members is None or failed:
                continue  # not a parity query, or it failed: its members' real outputs still flow
            outputs = {port: array[rows] for port, array in outcome.outputs.items()}
            for topic, key, value, partition, headers in self.loop.parity(gid, decode_members(members), outputs):
                self._emit(topic, partition, key, value, headers)

    def counters(self) -> Mapping[str, int]:
        c = self.loop.decoder.counters
        return {"parity_outputs": c.parity_outputs, "reconstructed": c.reconstructed,
                "parity_late_real": c.late_real, "parity_lost_groups": c.lost_groups}

    def close(self) -> None:
        self.loop.stop()


def _report(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("parity decoder stopped: %r", task.exception())


def parity_hooks(kafka: KafkaSettings, settings: WorkerSettings | None = None) -> HookFactory:
    """The :data:`~flowserve.runtime.hooks.HookFactory` of parity: encoders in the nodes feeding protected
    nodes, decoders in parity model nodes, first-wins inputs in the protected nodes' readers; nothing (and
    no cost) elsewhere."""

    def factory(topology: Topology, node: Node, component: Component) -> list[StageHooks]:
        hooks = first_wins_hooks(topology, node, component)
        targets = targets_of(topology, node)
        if targets:
            hooks.append(EncoderHooks(targets, topology.spec.partitions))
        for nid, spec in topology.spec.nodes.items():
            if spec.parity is not None and node.id == names.parity_node(nid):
                hooks.append(DecoderHooks(DecoderLoop(topology, nid, kafka, settings)))
        return hooks

    return factory
