"""The floor under a stage hop, for ``flowserve bench hop-cpu``: relays that do only what every hop must.

A relay reads a record, writes it to the next topic with its key and headers, waits for the broker's
acknowledgement and commits (at most every 100 ms, as a worker does), and nothing else: no decoding, no
``process``, no bookkeeping. Four kinds, which part a hop's cost apart:

- ``librdkafka``: confluent-kafka's own batch loop on one thread (``poll`` for the first record, a
  non-blocking ``consume`` for the rest, a ``produce`` per record, ``flush``, which sends them at once), with
  the settings of flowserve's librdkafka data plane (:func:`librdkafka_configs`): the least a hop costs
  from Python on a published client;
- ``plane-aiokafka`` and ``plane-librdkafka``: the same loop on an event loop through the consumer, producer
  and outbox a stage worker gets (:func:`flowserve.kafka.clients.make_data_plane`) on each client: what
  the data plane costs before the worker's own work (decoding, ``process``, encoding, bookkeeping);
- ``native``: the same loop on an event loop with the Kafka work in C a batch per call, woken by a file
  descriptor (:mod:`flowserve_bench.hop_native`): what a hop would cost on a binding built for the plane.

As many relays as the topology has stages form a chain on the same broker, in the same run, and a closed
loop in the bench drives it at each level's concurrency, with records of the pipeline's input size and the
headers a request enters with. Their CPU per record per hop is the least a hop costs on that client from
Python; what a stage worker spends above it is flowserve's own work.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from flowserve.kafka.clients import librdkafka_consumer_config, librdkafka_producer_config
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve_bench.hop_native import NativeUnavailable, build, relay_native
from flowserve_bench.procs import cpu_of

#: the relays commit at most this often, as a worker does (WorkerSettings.commit_interval_ms)
COMMIT_EVERY_S = 0.1
#: how long the relays may take to join their groups before the floor is given up
READY_S = 60.0
#: the largest record the relays' clients are sized for, as a worker's are for its topology's default
MAX_MESSAGE_BYTES = 1_048_576
CLIENTS = ("librdkafka", "plane-aiokafka", "plane-librdkafka", "native")


def unavailable(client: str) -> str | None:
    """Why the floor on ``client`` cannot run here (None: it can). Only the native relay needs building."""
    if client != "native":
        return None
    try:
        build()
    except NativeUnavailable as exc:
        return str(exc)
    return None


def _on_term() -> list[bool]:
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    return stop


def librdkafka_configs(kafka: KafkaSettings, group: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A relay's consumer and producer settings: a stage worker's on librdkafka (the same functions build
    both), so the floors move when the plane's settings do."""
    worker = WorkerSettings()
    return (librdkafka_consumer_config(kafka, worker, group_id=group, max_message_bytes=MAX_MESSAGE_BYTES,
                                       client_id=group),
            librdkafka_producer_config(kafka, worker, max_message_bytes=MAX_MESSAGE_BYTES, client_id=group))


def relay_librdkafka(kafka: KafkaSettings, source: str, sink: str, group: str) -> None:
    """The librdkafka relay's loop, until SIGTERM."""
    import confluent_kafka as ck

    stop = _on_term()
    consumer_config, producer_config = librdkafka_configs(kafka, group)
    # commit() with no offsets commits what the consumer stored: here librdkafka stores each record's
    # position as it hands it over, where the worker stores positions only once outputs are acknowledged
    consumer = ck.Consumer({**consumer_config, "enable.auto.offset.store": True})
    producer = ck.Producer(producer_config)
    consumer.subscribe([source])
    last = 0.0
    while not stop[0]:
        first = consumer.poll(0.1)
        if first is None:
            continue
        for m in [first, *consumer.consume(9_999, 0)]:
            if m.error() is None:
                producer.produce(sink, m.value(), m.key(), m.partition() or 0, headers=m.headers())
        producer.flush(10)
        if time.monotonic() - last >= COMMIT_EVERY_S:
            consumer.commit(asynchronous=False)
            last = time.monotonic()
    consumer.close()


async def relay_data_plane(kafka: KafkaSettings, client: str, source: str, sink: str, group: str) -> None:
    """The loop of a relay on a stage worker's data plane on ``client``, until SIGTERM."""
    from flowserve.kafka.clients import make_data_plane

    stop = _on_term()
    worker = WorkerSettings.model_validate({"client": client})
    consumer, producer, outbox = make_data_plane(kafka, worker, group_id=group, max_message_bytes=MAX_MESSAGE_BYTES,
                                                 client_id=group)
    await producer.start()
    await consumer.start()
    consumer.subscribe([source])
    pending: dict[Any, int] = {}
    last = 0.0
    while not stop[0]:
        fetched = await consumer.getmany(timeout_ms=100, max_records=10_000)
        if not fetched:
            continue
        for tp, records in fetched.items():
            for r in records:
                outbox.add(sink, tp.partition, r.key, r.value, list(r.headers or ()))
            pending[tp] = records[-1].offset + 1
        await outbox.flush()
        if time.monotonic() - last >= COMMIT_EVERY_S:
            await consumer.commit(pending)
            pending, last = {}, time.monotonic()
    await consumer.stop()
    await producer.stop()


class Floor:
    """A chain of ``stages`` relays on ``client`` on fresh topics, and the closed loop that drives it."""

    def __init__(self, kafka: KafkaSettings, client: str, stages: int, partitions: int, value: bytes,
                 headers: Sequence[tuple[str, bytes]]) -> None:
        import confluent_kafka as ck
        from confluent_kafka.admin import AdminClient, NewTopic

        self.client, self.stages = client, stages
        config = {**kafka.librdkafka_config(), "socket.nagle.disable": True}
        run = f"flowserve-hop-floor-{client}-{uuid.uuid4().hex[:8]}"
        self.topics = [f"{run}-{i}" for i in range(stages + 1)]
        self.admin = AdminClient(config)
        for future in self.admin.create_topics([NewTopic(t, partitions, 1) for t in self.topics]).values():
            future.result(30)
        # the relays read the rest of their settings as a worker does, from FLOWSERVE_* (credentials too)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
               "FLOWSERVE_IDEMPOTENCE": "1" if kafka.idempotence else "0",
               "FLOWSERVE_FETCH_MAX_WAIT_MS": str(kafka.fetch_max_wait_ms)}
        self.relays = [subprocess.Popen([sys.executable, "-m", "flowserve_bench.hop_floor", client, kafka.bootstrap,
                                         self.topics[i], self.topics[i + 1], f"{run}-g{i}"], env=env)
                       for i in range(stages)]
        self.value = value
        self.headers: list[tuple[str, str | bytes | None]] = [(k, v) for k, v in headers]
        self.producer = ck.Producer({**config, "acks": "all", "linger.ms": 0})
        self.consumer = ck.Consumer({**config, "group.id": f"{run}-driver", "enable.auto.commit": False})
        # From the start: the last topic is the floor's own, so whatever is in it came through the chain. At
        # OFFSET_END, the consumer looked the end up after ready()'s record had gone through (0.5 s) in 1 floor
        # of 3-6 in a test, so it never saw that record.
        self.consumer.assign([ck.TopicPartition(self.topics[-1], p, ck.OFFSET_BEGINNING) for p in range(partitions)])
        self.in_flight = 0
        self.key = 0

    def _send(self) -> None:
        self.key += 1
        self.producer.produce(self.topics[0], self.value, str(self.key).encode(), headers=self.headers)
        self.in_flight += 1

    def ready(self) -> None:
        """Wait until one record has gone through every relay (their groups joined)."""
        end = time.monotonic() + READY_S
        self._send()
        self.producer.flush(10)
        while time.monotonic() < end:
            if self.consumer.poll(0.2) is not None:
                self.in_flight -= 1
                return
        raise RuntimeError(f"hop floor: no record through {self.stages} {self.client} relays within {READY_S:.0f} s")

    def slice(self, concurrency: int, seconds: float) -> tuple[int, float, float]:
        """Keep ``concurrency`` records in the chain for ``seconds``: (records out, seconds, relays' CPU s).
        Records still in the chain at the end come out in a later slice (they count where they land)."""
        pids = [p.pid for p in self.relays]
        while self.in_flight < concurrency:
            self._send()
        self.producer.poll(0)
        cpu0, t0 = cpu_of(pids), time.monotonic()
        end, done = t0 + seconds, 0
        while (now := time.monotonic()) < end:
            first = self.consumer.poll(min(0.05, end - now))
            if first is None:
                continue
            for m in [first, *self.consumer.consume(9_999, 0)]:
                if m.error() is None:
                    done += 1
                    self.in_flight -= 1
                    if self.in_flight < concurrency:
                        self._send()
            self.producer.poll(0)
        return done, time.monotonic() - t0, cpu_of(pids) - cpu0

    def close(self) -> None:
        for p in self.relays:
            p.terminate()
        for p in self.relays:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.consumer.close()
        self.producer.flush(5)
        self.admin.delete_topics(self.topics)


if __name__ == "__main__":  # one relay: CLIENT BOOTSTRAP SOURCE SINK GROUP, other settings from FLOWSERVE_*
    which, bootstrap, *names = sys.argv[1:6]
    settings = KafkaSettings.from_env(bootstrap)
    if which == "librdkafka":
        relay_librdkafka(settings, *names)
    elif which == "native":
        source, sink, group = names
        asyncio.run(relay_native(source, sink, *librdkafka_configs(settings, group), stop=_on_term(),
                                 commit_every_s=COMMIT_EVERY_S))
    else:
        asyncio.run(relay_data_plane(settings, which.removeprefix("plane-"), *names))
