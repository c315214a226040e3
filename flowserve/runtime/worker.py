"""The stage worker: one topology node, one consumer group member, a batch-native loop.

Each step takes what is queued (up to what the batch policy allows), decodes it, runs one ``process``
call per batch, produces every output, waits for the broker's acknowledgements, and only then commits.
Input that cannot be used goes to the dead-letter topic with the reason; the request's downstream gets
an error result so callers learn of it; the rest of the batch proceeds.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError, KafkaTimeoutError

from flowserve.component import Batch, Component, read_result
from flowserve.errors import ErrorKind, Failure, FlowserveError, WireError
from flowserve.kafka.clients import make_data_plane, start_client
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.kafka.shutdown import bounded, stop_client
from flowserve.runtime.batching import BatchPolicy, describe, make_policy
from flowserve.runtime.cache import NodeCache
from flowserve.runtime.commits import Commits
from flowserve.runtime.dedup import FirstWins
from flowserve.runtime.emit import Counters, Emitter, Item, _visits
from flowserve.runtime.execute import Executor
from flowserve.runtime.fastpath import decode_column
from flowserve.runtime.heap import settle
from flowserve.runtime.held import HeldOffsets
from flowserve.runtime.hooks import BatchOutcome, HookFactory, StageContext, no_hooks
from flowserve.runtime.join import TP, JoinBuffer, Ready
from flowserve.runtime.metrics import NodeMetrics
from flowserve.runtime.profiles import ExecProfile, load_node_profiles
from flowserve.runtime.rewind import Backoff, ResumePoints, abandon, transient
from flowserve.topology.graph import Node, Topology
from flowserve.wire.envelope import (
    H_DEADLINE,
    H_ERROR,
    H_ID,
    H_VISITS,
    deadline_of,
    decode_record,
    now_ms,
)
from flowserve.wire.tensors import encode_tensors

log = logging.getLogger("flowserve.worker")
#: how stale the batch policy's execution-time predictions may get (see ExecProfile.refresh_s)
PROFILE_REFRESH_S = 0.05
_EMPTY = encode_tensors({})


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, worker: StageWorker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: Any) -> None:
        # Let the batch in flight finish and commit before the partitions move to another worker.
        async with self.worker._step_lock:
            await self.worker.drain()
            self.worker._forget_read(revoked)
            self.worker._resume.forget(revoked)

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


class StageWorker(Emitter):
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
        self.policy: BatchPolicy = policy or make_policy(topology, node_id, profiles.get(node_id), profiles)
        #: execution time per batch size, seeded from the profile file and kept live by every batch.
        self.profile: ExecProfile = self.policy.profile or profiles.get(node_id) or ExecProfile()
        self.profile.refresh_s = PROFILE_REFRESH_S
        self.metrics: NodeMetrics | None = None
        self._last_lag = 0
        self.executor = Executor(self.component, self.settings.inline_below_ms / 1000)
        self._early: list[Any] = []  # acknowledgements of batches sent before the step ends
        self._publishing: asyncio.Task[None] | None = None
        self.join = JoinBuffer(self.node) if self.node.needs_join or self.node.triggers else None
        self.held = HeldOffsets(self.component) if self.component.keeps_state else None
        self.counters = Counters()
        spec = self.node.cache
        self.cache = NodeCache(node_id, self.component, int(spec.max_mb * 2**20), spec.ttl_s,
                               vary=spec.vary) if spec else None
        self.max_bytes = topology.spec.max_message_bytes
        self._topic_sources = {s.topic for ss in self.node.bindings.values() for s in ss}
        self._inputs_topic = topology.inputs_topic
        self._replies_prefix = topology.replies_prefix
        self._outputs_topic = topology.outputs_topic
        self._cycles = topology.spec.allow_cycles
        # Columnar intake applies to plain nodes: one input port fed by one topic, no join, no cycles.
        self._columnar: tuple[str, str] | None = None
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
        self._seen: dict[TP, int] = {}
        #: first-wins inputs (a parity-protected node's outputs): request ids already read, per partition
        self._first = FirstWins(self.node.first_wins) if self.node.first_wins else None
        #: the batch awaiting its acknowledgements: futures, offsets, and whether it may commit (see _settle)
        self._inflight: tuple[list[Any], dict[TopicPartition, int], bool] | None = None
        #: where to re-read from when a produce fails (flowserve.runtime.rewind)
        self._resume = ResumePoints()
        self._backoff = Backoff()
        # librdkafka or aiokafka (WorkerSettings.client): the same interface, aiokafka's error classes
        self.consumer, self.producer, self.outbox = make_data_plane(
            kafka, self.settings, group_id=topology.group_id(node_id), max_message_bytes=self.max_bytes,
            client_id=f"fs-{node_id}")
        self.commits = Commits(self.consumer, self.settings.commit_interval_ms, node_id, self.counters)
        #: features attached to this node's batches (capture, ...): see flowserve.runtime.hooks
        self.hooks = tuple(hooks(topology, self.node, self.component))

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
        """The worker's counters and its hooks' (parity, ...)."""
        counts = self.counters.snapshot()
        for hook in self.hooks:
            counts.update(hook.counters())
        if self.cache is not None:
            counts.update(self.cache.counters())
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
                if not transient(exc) or self.held is not None:
                    raise
                await self._rewind(exc)
                return
        self._backoff.reset()

    async def _rewind(self, exc: KafkaError) -> None:
        """The broker did not take some outputs: drop what is unacknowledged and re-read each partition from
        its first record whose outputs were not acknowledged (see :mod:`flowserve.runtime.rewind`)."""
        if self._inflight is not None:
            abandon(self._inflight[0])
        abandon(self._early)
        self._inflight, self._early = None, []
        self.outbox.discard()
        assigned = self.consumer.assignment()
        targets = self._resume.targets(assigned)
        for tp, offset in targets.items():
            self.consumer.seek(tp, offset)
            self._seen[(tp.topic, tp.partition)] = offset
        self._forget_read(assigned)  # what joins and first-wins inputs remember would drop the re-read records
        self.counters.rewinds += 1
        delay = self._backoff.next()
        log.warning("node %s: outputs not acknowledged by the broker (%r); re-reading %s in %.1f s", self.node.id,
                    exc, ", ".join(f"{tp.topic}[{tp.partition}]@{off}" for tp, off in sorted(targets.items())) or
                    "nothing", delay)
        await asyncio.sleep(delay)

    def _forget_read(self, partitions: Any) -> None:
        """Forget what joins and first-wins inputs hold of these partitions' records: they will be read again
        (here after a rewind, by their new owner after a rebalance)."""
        if self.join is not None:
            self.join.drop_partitions({tp.partition for tp in partitions})
        if self._first is not None:
            self._first.drop(partitions)

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
        items: list[Item] = []
        handled: dict[TP, int] = {}
        self._resume.fetched(fetched)
        for tp, records in fetched.items():
            if records:
                key = (tp.topic, tp.partition)
                handled[key] = self._seen[key] = records[-1].offset + 1
        # One queue in arrival order: partitions merged by record timestamp, each partition's order kept.
        ordered = next(iter(fetched.values())) if len(fetched) == 1 else heapq.merge(
            *fetched.values(), key=_timestamp)
        waits: list[float] = []
        records = list(ordered)
        if self._first is not None:
            kept = self._first.keep(records)
            self.counters.duplicates += len(records) - len(kept)
            records = kept
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
        if items:
            await self._process(items, now)
        clean = self._after_step(force=not fetched or self.commits.due())  # False: a hook holds records back
        sent, futures = await self.outbox.send() if self.outbox.count else (0, [])
        self.counters.records_out += sent
        if self._early:
            futures, self._early = [*self._early, *futures], []
        # Two-stage pipeline: this batch's acknowledgements are awaited after the next fetch, so the
        # broker's ack round trip overlaps useful work. Commits still follow their own batch's acks.
        previous, self._inflight = self._inflight, None
        if previous is not None:
            try:
                await self._settle(*previous)
            except BaseException:
                abandon(futures)
                raise
        if handled or futures:
            offsets = self._offsets(handled)
            if fetched:
                self._inflight = (futures, offsets, clean)
            else:
                await self._settle(futures, offsets, clean, force=True)
        elif not fetched and self.commits.pending:
            await self.commits.commit()  # idle: do not leave acknowledged work uncommitted

    async def drain(self) -> None:
        """Wait for the batch in flight to be acknowledged and commit everything acknowledged.

        Outputs the broker does not take in time are given up, their offsets not committed: whoever owns
        the partitions next (this worker after a rebalance, or another) reads those inputs again. A
        rebalance must not wait on a broker fault: until this returns, the worker cannot rejoin its group.
        """
        previous, self._inflight = self._inflight, None
        flushed: list[Any] = []
        self._after_step(force=True)
        try:
            if self.outbox.count:
                flushed = (await self.outbox.send())[1]
            if previous is not None:
                futures, offsets, _ = previous
                await self._settle([*futures, *flushed], offsets, force=True)
            elif flushed:
                await self._acknowledged(flushed)
        except KafkaError as exc:
            if not transient(exc):
                raise
            self.outbox.discard()
            log.warning("node %s: outputs not acknowledged by the broker (%r); their inputs are not committed and "
                        "will be read again", self.node.id, exc)
        if self.commits.pending:
            await self.commits.commit()

    async def _acknowledged(self, futures: list[Any]) -> None:
        """Wait for delivery futures, at most ``request_timeout_ms``: a produce stuck on a frozen leader
        (aiokafka retries an idempotent batch without end) must not hold the step, and with it the
        worker's group membership, longer than that. Raises ``KafkaTimeoutError`` past it."""
        try:
            await asyncio.wait_for(asyncio.gather(*futures), self.settings.request_timeout_ms / 1000)
        except BaseException as exc:
            abandon(futures)
            if isinstance(exc, TimeoutError):
                raise KafkaTimeoutError(f"{len(futures)} batch(es) not acknowledged within "
                                        f"{self.settings.request_timeout_ms} ms") from None
            raise

    async def _settle(self, futures: list[Any], offsets: dict[TopicPartition, int], clean: bool = True, *,
                      force: bool = False) -> None:
        """Wait for a batch's acknowledgements; its offsets become committable only then.

        Under load, commits wait for ``Commits.due``; ``force`` (idle, rebalance, shutdown) commits at once.
        Not ``clean``: a hook still holds records of this batch back (e.g. lineage being gathered), so
        nothing commits until a later batch carries them.
        """
        if futures:
            await self._acknowledged(futures)
        self.commits.add(offsets)
        self._resume.acknowledged(offsets)
        if self.commits.pending and (force or (clean and self.commits.due())):
            await self.commits.commit()

    def _after_step(self, *, force: bool) -> bool:
        """Every hook's end of step (each is called); True when none holds records of past batches back."""
        clean = True
        for hook in self.hooks:
            clean = hook.after_step(force=force) and clean
        return clean

    def _offsets(self, handled: dict[TP, int]) -> dict[TopicPartition, int]:
        oldest = dict(self.join.oldest_offsets()) if self.join is not None else {}
        if self.held is not None:
            for tp, off in self.held.oldest().items():
                oldest[tp] = min(off, oldest.get(tp, off))
            # A partition held back earlier may be free now though this fetch had none of its records.
            assigned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
            handled = {**{tp: off for tp, off in self._seen.items() if tp in assigned}, **handled}
        return {TopicPartition(t, p): min(off, oldest.get((t, p), off)) for (t, p), off in handled.items()}

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

    async def _process(self, items: list[Item], now: int) -> None:
        groups: dict[tuple, list[Item]] = {}
        ports = self.component.inputs
        for item in items:
            r = item.ready
            if r.error is not None:
                await self._emit_error(r, r.error, count=False)
                continue
            deadline = deadline_of(r.headers.get(H_DEADLINE)) if self._deadlines else None
            if deadline is not None and deadline < now:
                self.counters.expired += 1
                await self._emit_error(r, self._expired)
                continue
            if item.signature is not None:  # checked as a whole batch on intake
                groups.setdefault(item.signature, []).append(item)
                continue
            try:
                rows = None
                for port, array in r.tensors.items():
                    ports[port].check(port, array)
                    if rows is None:
                        rows = array.shape[0]
                    elif array.shape[0] != rows:
                        raise WireError(f"input ports disagree on the number of rows ({rows} vs {array.shape[0]})")
            except WireError as exc:
                await self._dead_letter_item(item, Failure(exc.kind, str(exc)))
                continue
            signature = tuple((p, a.dtype.str, a.shape[1:]) for p, a in r.tensors.items())
            groups.setdefault(signature, []).append(item)
        for group in groups.values():
            await self._work_off(group)

    async def _work_off(self, queue: list[Item]) -> None:
        """Run a FIFO queue batch by batch as the policy plans it, re-planning with the real clock after
        each batch. Requests the policy says cannot make their deadline are answered at once (error result:
        kind ``refused`` when hopeless even alone, ``deadline`` when doomed by the queue ahead).

        Each plan sees only the head of the queue (the policy's ``window``), so working off a queue of n
        costs O(n * window / batch) in Python, not O(n^2)."""
        deadlines: list[float | None] = ([deadline_of(it.ready.headers.get(H_DEADLINE)) for it in queue]
                                         if self._deadlines else [None] * len(queue))
        window = self.policy.window or 4 * self.node.max_batch
        pos, first = 0, True
        while pos < len(queue):
            now = now_ms()
            end = min(len(queue), pos + window)
            drop: dict[int, str] = {}
            if not first:  # expired while earlier batches ran (checked as they reach the window)
                for i in range(pos, end):
                    d = deadlines[i]
                    if d is not None and d < now:
                        self.counters.expired += 1
                        drop[i] = ""
                        await self._emit_error(queue[i].ready, self._expired)
            first = False
            plan = None
            if len(drop) < end - pos:
                live = [i for i in range(pos, end) if i not in drop] if drop else list(range(pos, end))
                plan = self.policy.plan([deadlines[i] for i in live], now)
                for k, why in sorted(plan.refuse.items()):
                    self.counters.refused += 1
                    drop[live[k]] = why
                    await self._emit_error(queue[live[k]].ready,
                                           Failure(ErrorKind.REFUSED, f"refused by node '{self.node.id}': {why}"))
                for k, why in sorted(plan.doomed.items()):
                    self.counters.doomed += 1
                    drop[live[k]] = why
                    await self._emit_error(queue[live[k]].ready,
                                           Failure(ErrorKind.DEADLINE, f"dropped by node '{self.node.id}': {why}"))
            if drop:  # close the gaps inside the window (a C-level slice move, not per-record Python)
                kept = [i for i in range(pos, end) if i not in drop]
                queue[pos:end] = [queue[i] for i in kept]
                deadlines[pos:end] = [deadlines[i] for i in kept]
                end = pos + len(kept)
            if plan is None or pos == end:
                continue
            take = max(1, min(plan.take, self.node.max_batch, end - pos))
            batch = queue[pos:pos + take]
            pos += take
            started = time.perf_counter()
            seconds = await self._run_batch(batch)
            if pos < len(queue) and self.outbox.count:  # results of this batch leave now, not after the queue
                sent, futures = await self.outbox.send()
                self.counters.records_out += sent
                self._early.extend(futures)
            if seconds is not None:  # what a batch costs here besides process: assembling, encoding, producing
                self.policy.observe_overhead(time.perf_counter() - started - seconds)

    def _observe(self, size: int, seconds: float) -> None:
        self.executor.observe(seconds)
        self.profile.observe(size, seconds)
        self.policy.observe(size, seconds)
        if self.metrics is not None:
            self.metrics.batch(size, seconds)

    async def _run_batch(self, group: list[Item]) -> float | None:
        """Process one batch and emit its results; the seconds ``process`` took (None when it failed, or
        when the prediction cache answered every request and ``process`` did not run)."""
        sizes = [next(iter(it.ready.tensors.values())).shape[0] if it.ready.tensors else 1 for it in group]
        # The prediction cache: hits skip process, the misses run as one smaller batch (flowserve.runtime.cache)
        looked = self.cache.lookup([it.ready.tensors for it in group],
                                   [it.ready.headers for it in group]) if self.cache is not None else None
        todo, todo_sizes = group, sizes
        if looked is not None and looked.hits:
            todo = [it for it, e in zip(group, looked.entries, strict=True) if e is None]
            todo_sizes = [n for n, e in zip(sizes, looked.entries, strict=True) if e is None]
        tokens = [hook.begin(group) for hook in self.hooks] if self.hooks else None
        outputs: dict[str, np.ndarray] = {}
        mask: dict[str, np.ndarray] = {}
        errors: dict[int, str] = {}
        seconds: float | None = None
        if todo:
            batch = _batch_of(todo, todo_sizes, absent=self.join is not None and self.join.kind == "deadline")
            self.counters.batches += 1
            self.counters.last_batch = len(todo)
            try:
                result, seconds = await self.executor.run(batch)
                outputs, mask, errors = read_result(self.component, result, batch.rows, node=self.node.id)
            except Exception as exc:  # noqa: BLE001 - a component bug must not kill the worker
                if len(group) == 1:
                    await self._dead_letter_item(group[0], Failure(
                        ErrorKind.COMPONENT_FAILURE, f"{type(self.component).__name__}.process failed: {exc!r}"))
                    return None
                # Isolate the request that broke the batch: retry each one alone (a cached one is looked up,
                # and counted, again).
                for item in group:
                    await self._run_batch([item])
                return None
            self._observe(len(todo), seconds)
        if looked is not None and self.cache is not None:
            outputs, mask, errors = self.cache.complete(looked, sizes, outputs, mask, errors)
        if self.held is not None:
            self.held.processed((it.ready.request_id, it.source) for it in group if it.source)
        await self._emit(group, sizes, outputs, mask, errors)
        done = now_ms()
        for item in group:
            deadline = deadline_of(item.ready.headers.get(H_DEADLINE))
            if deadline is not None and deadline < done:
                self.counters.late += 1
        if tokens is not None:
            outcome = BatchOutcome(sizes, outputs, mask, errors)
            for hook, token in zip(self.hooks, tokens, strict=True):
                hook.end(token, outcome)
        return seconds


def _batch_of(group: list[Item], sizes: list[int], absent: bool = False) -> Batch:
    """The requests of ``group`` as one batch: each port's tensors concatenated in order."""
    first = group[0].ready.tensors
    if len(group) == 1:
        tensors = dict(first)
    else:
        tensors = {port: np.concatenate([it.ready.tensors[port] for it in group]) for port in first}
    masks = _absent_masks(group, sizes) if absent else None  # behind a deadline join only
    return Batch(tensors, sizes, [it.ready.request_id for it in group], [it.ready.headers for it in group],
                 masks)


def _absent_masks(group: list[Item], sizes: list[int]) -> dict[str, np.ndarray] | None:
    """Per port with an absent input somewhere in the batch, which rows are present (``Batch.present``)."""
    if not any(it.ready.absent for it in group):
        return None
    masks: dict[str, np.ndarray] = {}
    start = 0
    for it, rows in zip(group, sizes, strict=True):
        for port in it.ready.absent:
            mask = masks.get(port)
            if mask is None:
                mask = masks[port] = np.ones(sum(sizes), dtype=bool)
            mask[start:start + rows] = False
        start += rows
    return masks


def _timestamp(rec: Any) -> int:
    return rec.timestamp or 0


__all__ = ["Counters", "StageWorker"]

# KafkaError is re-exported for callers that want to catch broker failures around run().
_ = KafkaError
