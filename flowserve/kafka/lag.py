"""How far each stage's consumer group is behind its input topics: what KEDA's Kafka scaler reads, and
what the tuner's profile rule drains (:mod:`flowserve.tuning.rules`)."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from flowserve.kafka.settings import KafkaSettings
from flowserve.topology.graph import Topology


class LagReader:
    """Reads, per stage and input topic, the records its group has not committed: a partition without a
    commit counts its whole log (KEDA's kafka scaler with ``offsetResetPolicy: earliest``). Holds one admin
    client and one group-less consumer open between reads (the tuner reads every second)."""

    def __init__(self, kafka: KafkaSettings, topology: Topology) -> None:
        self.kafka = kafka
        self.topology = topology
        #: the topology's partitions now (the tuner may grow them)
        self.partitions = topology.spec.partitions
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        self._admin = AIOKafkaAdminClient(**self.kafka.client_kwargs())
        self._consumer = AIOKafkaConsumer(group_id=None, **self.kafka.client_kwargs())
        await self._admin.start()
        await self._consumer.start()

    async def per_topic(self) -> dict[str, list[int]]:
        """Per node, per input topic (one KEDA trigger each), its group's lag."""
        assert self._admin is not None and self._consumer is not None, "start() first"  # noqa: S101
        out: dict[str, list[int]] = {}
        for node_id, node in self.topology.nodes.items():
            tps = [TopicPartition(t, p) for t in node.input_topics for p in range(self.partitions)]
            ends = await self._consumer.end_offsets(tps)
            committed = await self._admin.list_consumer_group_offsets(self.topology.group_id(node_id), partitions=tps)
            lag = {tp: max(0, ends[tp] - (committed[tp].offset if tp in committed and committed[tp].offset >= 0
                                          else 0)) for tp in tps}
            out[node_id] = [sum(v for tp, v in lag.items() if tp.topic == t) for t in node.input_topics]
        return out

    async def per_stage(self) -> dict[str, int]:
        """Per node, its group's lag over all its input topics."""
        return {node: sum(lags) for node, lags in (await self.per_topic()).items()}

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
        if self._admin is not None:
            await self._admin.close()
