"""``flowserve bench tuner --part rebalance``: what a member joining or leaving a consumer group costs the
records in flight, per group protocol, on Apache Kafka 4 (live, this machine).

The simulated cluster (:mod:`flowserve.tuning.cluster`) pauses a stage 0.1-1.0 s whenever its consumers change
(an eager rebalance), and ``--pause none`` stood for what the consumer protocol of KIP-848 would approach:
only the moved partitions pause. This measures it rather than assuming it. Each case runs on its own group and
topic: a producer sends ``RATE`` records/s round-robin over ``PARTITIONS`` partitions, each carrying its send
time; ``CONSUMERS`` librdkafka consumers (one thread each) read them; at ``JOIN_AT`` s one more joins and at
``LEAVE_AT`` s one of the first leaves (closes). A record's latency is its first receipt less its send time;
around each change (1 s before to ``SPAN_S`` after) the bench counts records later than ``LATE_S``, the
largest latency, and the partitions that had a late record.

Cases: the classic protocol with flowserve's settings (range, eager; heartbeat 300 ms on the Apache Kafka it
manages, 1 s on any other cluster, the simulated cluster's case), the classic protocol's cooperative-sticky
assignor, and the consumer protocol (``group.protocol=consumer``) with
the broker's ``uniform`` and ``range`` assignors, at Apache Kafka's default heartbeat of 5 s and (``uniform``)
at 1 s, on a second broker whose heartbeat bounds allow it. The consumers only read: a flowserve worker also
drains its batch and commits before it gives a partition up, which adds a batch and an acknowledgement.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

RATE, PARTITIONS, CONSUMERS = 2000, 24, 4
JOIN_AT, LEAVE_AT, END_S, SPAN_S = 15.0, 35.0, 55.0, 15.0
#: a record later than this counts as late (the image-processing SLO is 250 ms)
LATE_S = 0.25
#: the classic protocol as flowserve's workers run it on the Apache Kafka it manages
#: (flowserve.kafka.brokers.apache_kafka), and on any other cluster (flowserve.kafka.settings: heartbeat 1 s)
CLASSIC = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 300}
CLASSIC_1S = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}
#: case -> (broker heartbeat of the consumer protocol in ms, consumer settings)
CASES: dict[str, tuple[int, dict[str, Any]]] = {
    "classic-eager-range": (5000, {**CLASSIC, "partition.assignment.strategy": "range"}),
    "classic-eager-range-1s": (5000, {**CLASSIC_1S, "partition.assignment.strategy": "range"}),
    "classic-cooperative-sticky": (5000, {**CLASSIC, "partition.assignment.strategy": "cooperative-sticky"}),
    "kip848-uniform-5s": (5000, {"group.protocol": "consumer", "group.remote.assignor": "uniform"}),
    "kip848-range-5s": (5000, {"group.protocol": "consumer", "group.remote.assignor": "range"}),
    "kip848-uniform-1s": (1000, {"group.protocol": "consumer", "group.remote.assignor": "uniform"}),
}


@dataclass(frozen=True, slots=True)
class Change:
    """What one join or leave cost: records sent around it, those late, the largest latency (inf: a record
    never read) and the partitions with a late record."""

    records: int
    late: int
    worst_s: float
    stalled_partitions: int


def around(sent: Mapping[int, tuple[float, int]], first: Mapping[int, float], at: float,
           span_s: float = SPAN_S, late_s: float = LATE_S) -> Change:
    """The records sent from 1 s before ``at`` to ``span_s`` after it (``sent``: id -> (send time, partition),
    times from the run's start; ``first``: id -> first receipt)."""
    records = late = 0
    worst = 0.0
    stalled: set[int] = set()
    for rid, (ts, partition) in sent.items():
        if not at - 1 <= ts < at + span_s:
            continue
        records += 1
        got = first.get(rid)
        latency = got - ts if got is not None else float("inf")
        worst = max(worst, latency)
        if latency > late_s:
            late += 1
            stalled.add(partition)
    return Change(records, late, worst, len(stalled))


def one_run(bootstrap: str, name: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """One case once on its own topic and group; returns the join's and the leave's :class:`Change`."""
    import confluent_kafka as ck
    from confluent_kafka.admin import AdminClient, NewTopic

    topic, group = f"rebalance-{name}", f"rebalance-{name}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    first: dict[int, float] = {}
    lock, stop, leave = threading.Lock(), threading.Event(), threading.Event()

    def consume(k: int) -> None:
        c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": f"c{k}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": True,
                         "auto.commit.interval.ms": 100, **settings})
        c.subscribe([topic])
        while not stop.is_set() and not (k == 0 and leave.is_set()):
            batch = c.consume(500, 0.05)
            now = time.monotonic()
            with lock:
                for m in batch:
                    key = m.key()
                    if m.error() is None and key is not None:
                        first.setdefault(int(key), now)
        c.close()

    threads = [threading.Thread(target=consume, args=(k,), daemon=True) for k in range(CONSUMERS)]
    for t in threads:
        t.start()
    time.sleep(8)  # the group forms before the clock starts
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": "1"})
    sent: dict[int, tuple[float, int]] = {}
    start = time.monotonic()
    i, joined = 0, False
    while (now := time.monotonic() - start) < END_S:
        while i < int(now * RATE):
            sent[i] = (time.monotonic() - start, i % PARTITIONS)
            producer.produce(topic, key=str(i), value=b"x" * 100, partition=i % PARTITIONS)
            i += 1
        producer.poll(0)
        if not joined and now >= JOIN_AT:
            joined = True
            threads.append(threading.Thread(target=consume, args=(CONSUMERS,), daemon=True))
            threads[-1].start()
        if now >= LEAVE_AT:
            leave.set()
        time.sleep(0.001)
    producer.flush(10)
    time.sleep(6)  # the last records are read
    stop.set()
    for t in threads:
        t.join(10)
    with lock:  # receipts from the run's start, as the send times are
        got = {rid: t - start for rid, t in first.items()}
    return {"join": around(sent, got, JOIN_AT), "leave": around(sent, got, LEAVE_AT),
            "never_read": sum(1 for rid in sent if rid not in got)}


def summarise(case: str, runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A case's row: per change the median late records over the runs and the worst latency of any."""
    broker_heartbeat, settings = CASES[case]
    # the heartbeat the case's members run with: the classic protocol's own, the consumer protocol's broker's
    heartbeat = settings.get("heartbeat.interval.ms", broker_heartbeat)
    row: dict[str, Any] = {"case": case, "heartbeat_ms": heartbeat, "runs": len(runs)}
    for change in ("join", "leave"):
        parts: list[Change] = [r[change] for r in runs]
        row[f"{change}_records"] = statistics.median(c.records for c in parts)
        row[f"{change}_late"] = statistics.median(c.late for c in parts)
        row[f"{change}_worst_s"] = max(c.worst_s for c in parts)
        row[f"{change}_stalled_partitions"] = max(c.stalled_partitions for c in parts)
    row["never_read"] = sum(r["never_read"] for r in runs)
    return row


def rebalance_bench(rounds: int = 2, log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Every case ``rounds`` times, interleaved, on Apache Kafka 4 (one broker per heartbeat setting)."""
    from flowserve.kafka.brokers.apache_kafka import ApacheKafka

    wall = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    for heartbeat_ms in sorted({hb for hb, _ in CASES.values()}, reverse=True):
        # the consumer protocol's heartbeat is the broker's (group.consumer.*); 5 s is Apache Kafka's default
        config = {"group.consumer.min.heartbeat.interval.ms": min(heartbeat_ms, 5000),
                  "group.consumer.heartbeat.interval.ms": heartbeat_ms}
        with ApacheKafka.start(nodes=1, config=config) as kafka:
            for r in range(rounds):
                for case, (hb, settings) in CASES.items():
                    if hb != heartbeat_ms:
                        continue
                    runs[case].append(one_run(kafka.bootstrap, f"{case}-{r}", settings))
                    if log:
                        j, lv = runs[case][-1]["join"], runs[case][-1]["leave"]
                        log(f"{case} round {r + 1}: join {j.late} late, worst {j.worst_s:.2f} s; "
                            f"leave {lv.late} late, worst {lv.worst_s:.2f} s")
    rows = [summarise(case, runs[case]) for case in CASES]
    return {"workload": "tuner", "part": "rebalance", "rate": RATE, "partitions": PARTITIONS,
            "consumers": CONSUMERS, "late_ms": LATE_S * 1000, "rows": rows, "wall_s": time.perf_counter() - wall,
            "targets": {}}
