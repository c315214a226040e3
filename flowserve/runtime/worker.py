"""The stage worker: one topology node, one consumer group member, a batch-native loop.

Each step takes what is queued (up to what the batch policy allows), decodes it
(:mod:`flowserve.runtime.intake`), runs one ``process`` call per batch (:mod:`flowserve.runtime.processing`),
produces every output (:mod:`flowserve.runtime.emit`), waits for the broker's acknowledgements, and only then
commits (:mod:`flowserve.runtime.delivery`). Input that cannot be used goes to the dead-letter topic with the
reason; the request's downstream gets an error result so callers learn of it; the rest of the batch proceeds.
Features (capture, parity, the prediction cache, learning, ...) attach only through the hooks a
:data:`~flowserve.runtime.hooks.HookFactory` gives (:mod:`flowserve.runtime.hooks`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from flowserve.component import Component
from flowserve.errors import ErrorKind, Failure, FlowserveError
from flowserve.kafka.clients import make_data_plane, start_client
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.kafka.shutdown import bounded, stop_client
from flowserve.runtime.batching import BatchPolicy, describe, make_policy
from flowserve.runtime.delivery import Commits, Delivery
from flowserve.runtime.emit import Counters
from flowserve.runtime.execute import Executor
from flowserve.runtime.heap import settle
from flowserve.runtime.hooks import HookFactory, StageContext, no_hooks
from flowserve.runtime.intake import Intake
from flowserve.runtime.join import TP, JoinBuffer
from flowserve.runtime.metrics import NodeMetrics
from flowserve.runtime.processing import Processing
from flowserve.runtime.profiles import ExecProfile, load_node_profiles
from flowserve.runtime.rewind import Backoff, ResumePoints, transient
from flowserve.topology.graph import Node, Topology
from flowserve.wire.envelope import now_ms

log = logging.getLogger("flowserve.worker")
#: how stale the batch policy's execution-time predictions may get (see ExecProfile.refresh_s)
PROFILE_REFRESH_S = 0.05


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, worker: StageWorker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.worker.release(revoked)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        if self.worker.paused:  # an operator's pause holds across rebalances
            self.worker.consumer.pause(*assigned)
        log.info("node %s assigned %s", self.worker.node.id, sorted((tp.topic, tp.partition) for tp in assigned))
        if not assigned:
            # Consumers of one node share its partitions: past one consumer per partition the rest idle,
            # whoever started them (replicas:, by hand, the tuner).
            log.warning("node %s: this consumer got no partitions: its group has more consumers than the %d "
                        "partitions of its inputs, so it idles until one leaves (raise the topology's "
                        "partitions to scale further)", self.worker.node.id, self.worker.topology.spec.partitions)


class StageWorker(Intake, Processing, Delivery):
    """Runs one node of a topology. ``await worker.run()`` until ``worker.stop()``."""

    def __init__(
        self,
        topology: Topology,
        node_id: str,
        kafka: KafkaSettings,
        settings: WorkerSettings | None = None,
        policy: BatchPolicy | None = None,
        component: Component | None = None,
        hooks: HookFactory = no_hooks,
    ) -> None:
        self.topology = topology
        self.node: Node = topology.nodes[node_id]
        self.kafka = kafka
        self.settings = settings or WorkerSettings()
        self.component = component or self.node.component
        profiles: dict[str, ExecProfile | None] = {}
        if policy is None:
            try:
                profiles = load_node_profiles(topology)
            except FlowserveError as exc:
                log.warning("node %s: ignoring the topology's profile: %s", node_id, exc)
        self.policy = policy or make_policy(topology, node_id, profiles.get(node_id), profiles)
        #: execution time per batch size, seeded from the profile file and kept live by every batch.
        self.profile = self.policy.profile or profiles.get(node_id) or ExecProfile()
        self.profile.refresh_s = PROFILE_REFRESH_S
        self.metrics = None
        self._last_lag = 0
        self.executor = Executor(self.component, self.settings.inline_below_ms / 1000)
        self._early = []
        self._publishing: asyncio.Task[None] | None = None
        self.join = JoinBuffer(self.node) if self.node.needs_join or self.node.triggers else None
        self.counters = Counters()
        self.max_bytes = topology.spec.max_message_bytes
        self._inputs_topic = topology.inputs_topic
        self._replies_prefix = topology.replies_prefix
        self._outputs_topic = topology.outputs_topic
        self._cycles = topology.spec.allow_cycles
        # Columnar intake applies to plain nodes: one input port fed by one topic, no join, no cycles.
        self._columnar = None
        if self.join is None and not self._cycles and len(self.node.bindings) == 1:
            ((port, sources),) = self.node.bindings.items()
            if len(sources) == 1:
                self._columnar = (port, sources[0].tensor)
        self._expired = Failure(ErrorKind.DEADLINE, f"deadline exceeded before node '{node_id}'")
        self._deadlines = self.settings.honour_deadlines
        self._step_lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._started = False
        self.paused = False
        self._seen = {}
        self._inflight = None
        #: where to re-read from when a produce fails (flowserve.runtime.rewind)
        self._resume = ResumePoints()
        self._backoff = Backoff()
        # librdkafka or aiokafka (WorkerSettings.client): the same interface, aiokafka's error classes
        self.consumer, self.producer, self.outbox = make_data_plane(
            kafka, self.settings, group_id=topology.group_id(node_id), max_message_bytes=self.max_bytes,
            client_id=f"fs-{node_id}")
        self.commits = Commits(self.consumer, self.settings.commit_interval_ms, node_id, self.counters)
        #: features attached to this node's batches (capture, the cache, ...): see flowserve.runtime.hooks
        self.hooks = tuple(hooks(topology, self.node, self.component))
        self._holding = tuple(h for h in self.hooks if h.holds_offsets)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        await asyncio.to_thread(self.component.setup)
        settle()
        self.metrics = NodeMetrics(self.topology.name, self.node.id, counters=self._counts,
                                   lag=lambda: self._last_lag)
        stage = StageContext(self.topology, self.node, self.component, self.outbox.add, self._reply_topic)
        for hook in self.hooks:
            hook.start(stage)
        await start_client(self.producer, self.kafka)
        await start_client(self.consumer, self.kafka)
        self.consumer.subscribe(list(self.node.input_topics), listener=_Rebalance(self))
        self._started = True

    def pause(self) -> None:
        """Stop fetching (operator command); what is in flight still completes and commits."""
        self.consumer.pause(*self.consumer.assignment())
        self.paused = True

    def resume(self) -> None:
        self.consumer.resume(*self.consumer.assignment())
        self.paused = False

    def stop(self) -> None:
        """Ask the loop to finish its current batch, commit, and return."""
        self._stopping.set()

    async def release(self, partitions: Any) -> None:
        """Partitions (``TopicPartition``s) move to another worker: let the batch in flight finish and
        commit, then forget what was read of them (their new owner reads them again)."""
        async with self._step_lock:
            await self.drain()
            self._forget_read(partitions)
            self._resume.forget(partitions)

    async def run(self) -> None:
        await self.start()
        last_stats = last_publish = time.monotonic()
        try:
            while not self._stopping.is_set():
                await self.step()
                every = self.settings.metrics_interval_s
                if every and time.monotonic() - last_publish >= every:
                    last_publish = time.monotonic()
                    self._publish()
                interval = self.settings.stats_interval_s
                if interval and time.monotonic() - last_stats > interval:
                    last_stats = time.monotonic()
                    log.info("node %s counters %s", self.node.id, json.dumps(self._counts()))
        finally:
            await self.close()

    async def close(self) -> None:
        if not self._started:
            return
        self._started = False
        label = f"node {self.node.id}"
        # Each step is bounded (flowserve.kafka.shutdown): a stop must not hang on the broker. A drain cut
        # short leaves its inputs uncommitted, to be read again.
        await bounded(self.drain(), f"{label}: drain", 2 * self.settings.request_timeout_ms / 1000)
        await stop_client(self.consumer, f"{label}: consumer stop")
        if self.metrics is not None and self.settings.metrics_interval_s:
            # a last snapshot, so stats show the final counts
            await bounded(self._send_snapshot(self._snapshot()), f"{label}: last metrics snapshot", 2.0)
        await stop_client(self.producer, f"{label}: producer stop")
        if self.metrics is not None:
            self.metrics.close()
        self.component.close()
        for hook in self.hooks:
            hook.close()
        log.info("node %s stopped: %s", self.node.id, json.dumps(self._counts()))

    # -- metrics -------------------------------------------------------------------------------------

    def _counts(self) -> dict[str, Any]:
        """The worker's counters and its hooks' (parity, the cache, ...)."""
        counts = self.counters.snapshot()
        for hook in self.hooks:
            counts.update(hook.counters())
        return counts

    def _snapshot(self) -> dict[str, Any]:
        assert self.metrics is not None
        known = self.profile.known()
        return self.metrics.snapshot({"policy": describe(self.policy),
                                      "profile_p99_ms": {str(k): round(v * 1000, 3) for k, v in sorted(known.items())}})

    def _publish(self) -> None:
        """Send a metrics snapshot in the background (never blocks the loop; skipped while one is in flight)."""
        if self.metrics is None or (self._publishing is not None and not self._publishing.done()):
            return
        self._publishing = asyncio.create_task(self._send_snapshot(self._snapshot()))

    async def _send_snapshot(self, snap: dict[str, Any]) -> None:
        assert self.metrics is not None
        try:
            await asyncio.wait_for(self.producer.send_and_wait(
                self.topology.metrics_topic, json.dumps(snap).encode(),
                key=f"{self.node.id}/{self.metrics.worker}".encode()), 10.0)
        except Exception as exc:  # noqa: BLE001 - metrics must never stop the worker
            log.debug("node %s: metrics snapshot not published: %r", self.node.id, exc)

    # -- the loop ----------------------------------------------------------------------------------

    def _lag(self) -> int:
        lag = 0
        for tp in self.consumer.assignment():
            high = self.consumer.highwater(tp)
            if high is not None:
                lag += max(0, high - self._seen.get((tp.topic, tp.partition), high))
        return lag

    async def step(self) -> None:
        """One fetch → process → produce → acknowledge → commit cycle."""
        timeout = self.settings.poll_timeout_ms
        if self.join is not None and len(self.join):
            due = self.join.next_fire()  # a deadline join wakes for its next fire time, others every 20 ms
            timeout = min(timeout, 20 if due is None else max(1, due - now_ms()))
        self._last_lag = self._lag()
        size = self.policy.next_size(self._last_lag)
        try:
            fetched = await self.consumer.getmany(timeout_ms=timeout, max_records=size)
            wait_ms = self.policy.max_wait_ms
            if wait_ms and fetched:
                fetched = await self._fill(dict(fetched), size, wait_ms)
        except IllegalStateError:  # not subscribed yet / shutting down
            await asyncio.sleep(timeout / 1000)
            return
        async with self._step_lock:
            try:
                await self._handle(fetched)
            except KafkaError as exc:
                if not transient(exc) or self._holding:  # re-reading would feed a hook's held state twice
                    raise
                await self._rewind(exc)
                return
        self._backoff.reset()

    async def _fill(self, fetched: dict[TopicPartition, list[Any]], size: int,
                    wait_ms: float) -> dict[TopicPartition, list[Any]]:
        """Timeout batching: once records are here, keep fetching up to ``wait_ms`` until ``size`` are."""
        got = sum(len(r) for r in fetched.values())
        end = time.monotonic() + wait_ms / 1000
        while got < size and (left := end - time.monotonic()) > 0:
            more = await self.consumer.getmany(timeout_ms=max(1, int(left * 1000)), max_records=size - got)
            for tp, records in more.items():
                fetched[tp] = [*fetched.get(tp, ()), *records]
                got += len(records)
        return fetched

    async def _handle(self, fetched: Mapping[TopicPartition, list[Any]]) -> None:
        now = now_ms()
        handled: dict[TP, int] = {}
        self._resume.fetched(fetched)
        for tp, records in fetched.items():
            if records:
                key = (tp.topic, tp.partition)
                handled[key] = self._seen[key] = records[-1].offset + 1
        items = await self._read(fetched, now)
        if items:
            await self._process(items, now)
        await self._deliver(bool(fetched), handled)


__all__ = ["Counters", "StageWorker"]
