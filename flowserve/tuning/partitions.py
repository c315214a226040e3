"""Add partitions to a running topology's topics, so that its stages can scale past them (CreatePartitions).

The consumers of one stage share its input partitions: past one consumer per partition the rest idle.
On a broker that takes CreatePartitions (Apache Kafka; the embedded broker does not) the tuner raises
the partition count of every topic of the topology together, because a worker writes each output to
the partition number its input came from: downstream topics grow first and the inputs topic last, so
no record is ever meant for a partition that does not exist yet. Kafka cannot remove partitions, so a
scale-down keeps them (an idle partition costs a file handle, not a consumer).

Who sees the new partitions, and when:

- workers subscribe to their input topics: their consumer metadata is at most ``METADATA_MAX_AGE_MS``
  (10 s) old, and the group rebalances over the new partitions when it notices; a producer that is
  asked to write to a partition its metadata does not know yet refreshes it first (the outbox);
- :class:`~flowserve.client.TopologyClient` (and so ``flowserve trace replay``) spreads its requests
  over the new partitions once its producer's metadata shows them, reading their replies from then on;
- the HTTP gateway does the same, growing its own reply topic to match first.

A topology with parity-protected nodes is refused: its coding groups are drawn over the partitions it
started with.
"""

from __future__ import annotations

from flowserve.errors import FlowserveError
from flowserve.kafka.admin import grow_partitions
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology.graph import Topology


def check_growable(topology: Topology) -> None:
    """Raise :class:`FlowserveError` when the topology's partition count cannot change while it runs."""
    protected = [n for n, s in topology.spec.nodes.items() if s.parity is not None]
    if protected:
        raise FlowserveError(f"topology '{topology.name}' cannot gain partitions while it runs: its parity "
                             f"groups ({', '.join(protected)}) are drawn over the partitions it started with; "
                             "give it the partitions it needs up front (flowserve plan's headroom)")


class PartitionGrowth:
    """Grows every topic of ``topology`` together, up to ``limit`` partitions, from ``partitions``."""

    def __init__(self, topology: Topology, kafka: KafkaSettings, *, partitions: int, limit: int) -> None:
        check_growable(topology)
        self.topology = topology
        self.kafka = kafka
        self.partitions = partitions
        self.limit = limit

    def target(self, consumers: int) -> int:
        """The count to grow to for ``consumers``: at least double, since each growth makes every stage's
        group rebalance, and never past ``limit``."""
        return min(self.limit, max(consumers, 2 * self.partitions))

    async def grow(self, consumers: int) -> int:
        """Make sure there are partitions for ``consumers`` (as many as the limit allows); returns the count.

        Raises :class:`~flowserve.errors.BrokerError` when the broker refuses (the count stays as it was)."""
        if consumers <= self.partitions or self.partitions >= self.limit:
            return self.partitions
        count = self.target(consumers)
        # downstream first, the inputs topic last: a record is only ever meant for a partition that exists
        inputs = self.topology.inputs_topic
        await grow_partitions(self.kafka, [*(t for t in self.topology.topics() if t != inputs), inputs], count)
        self.partitions = count
        return count


__all__ = ["PartitionGrowth", "check_growable"]
