"""Request-reply over Kafka for the gateway: its topics, its own reply topics, and partition rotation.

Each gateway instance has one reply topic per topology (``<prefix>.<topology>.replies.<instance>``) and
puts it in every request's ``fs-reply-to`` header; the worker that writes the topology's outputs sends
the reply there, on the partition the request came in on. Matching replies to callers, deduplication,
deadlines and per-tick produce batches are the request-reply engine's
(:class:`flowserve.kafka.replies.ReplyRouter`); each batch goes to the next partition of a topology.

A topology can gain partitions while it runs (``flowserve tune --max-partitions``): once a second the
bridge looks at its producer's metadata, and when a topology's inputs topic has grown it grows its own
reply topic to match, reads the new reply partitions, and only then sends requests to the new ones.

A request naming a model of a many-model node goes where that model is placed instead: the partition its
topology's :class:`Routes` gives (:attr:`KafkaBridge.routes`; ``flowserve gateway`` sets a
:class:`flowserve.models.ModelRouter` for each topology with a ``models:`` node).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from flowserve.errors import BrokerError
from flowserve.kafka.admin import delete_topics, ensure_topics, grow_partitions
from flowserve.kafka.replies import GROWTH_CHECK_S, Reply, ReplyCounters, ReplyRouter
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology.capture import topic_configs
from flowserve.topology.graph import Topology
from flowserve.wire.envelope import Headers

log = logging.getLogger("flowserve.gateway")


class Routes(Protocol):
    """Where the requests for the models of one topology's many-model node enter (docs/models.md)."""

    def partition(self, model: str) -> int:
        """The partition of the next request for ``model``."""
        ...


class KafkaBridge:
    """One producer and one reply consumer for every topology a gateway serves."""

    def __init__(self, topologies: Sequence[Topology], kafka: KafkaSettings, instance: str) -> None:
        self.topologies = list(topologies)
        self.kafka = kafka
        self.instance = instance
        # The reply topic has the topology's partition count: a reply lands on the request's partition.
        self.router = ReplyRouter(
            kafka, [(self.reply_topic(t), p) for t in self.topologies for p in range(t.spec.partitions)],
            max_message_bytes=max(t.spec.max_message_bytes for t in self.topologies),
            client_id=f"fs-gateway-{instance}", label=f"gateway {instance}")
        #: topology name -> the partitions requests go to (grows with the topology's inputs topic)
        self.partitions = {t.name: t.spec.partitions for t in self.topologies}
        #: topology name -> the partitions of requests naming a model (many-model nodes; others rotate)
        self.routes: dict[str, Routes] = {}
        self._growth: asyncio.Task[None] | None = None

    @property
    def counters(self) -> ReplyCounters:
        return self.router.counters

    def reply_topic(self, topology: Topology) -> str:
        return topology.reply_topic(self.instance)

    async def start(self) -> None:
        for t in self.topologies:
            await ensure_topics(self.kafka, [*t.topics(), self.reply_topic(t)], t.spec.partitions,
                                max_message_bytes=t.spec.max_message_bytes, configs=topic_configs(t))
        await self.router.start()
        self._growth = asyncio.create_task(self._follow_growth(), name=f"gateway {self.instance}: partitions")

    async def stop(self, *, delete_topics: bool = True) -> None:
        if self._growth is not None:
            self._growth.cancel()
            await asyncio.gather(self._growth, return_exceptions=True)
            self._growth = None
        await self.router.stop()
        if delete_topics:
            await self._delete_reply_topics()

    async def _delete_reply_topics(self) -> None:
        try:
            await delete_topics(self.kafka, [self.reply_topic(t) for t in self.topologies], timeout_s=5)
        except BrokerError as exc:  # best effort: a leftover reply topic only costs disk
            log.warning("gateway %s: %s", self.instance, exc)

    def in_flight(self) -> int:
        return self.router.in_flight()

    def has(self, request_id: str) -> bool:
        return self.router.has(request_id)

    async def send_feedback(self, topology: Topology, key: bytes, value: bytes, headers: Headers) -> None:
        """Write one feedback record to the topology's feedback topic; returns once the broker acknowledged it."""
        await self.router.send(topology.feedback_topic, key, value, headers)

    def submit(self, topology: Topology, request_id: str, value: bytes, headers: Headers,
               timeout_s: float, model: str | None = None) -> asyncio.Future[Reply]:
        """Queue one request; the future resolves with its reply, or fails at ``timeout_s``.

        Requests of one tick go to one partition of each topology, the next tick's to the next one; a
        request for ``model`` goes to the partition its topology's :attr:`routes` give, where it has some.
        """
        routes = self.routes.get(topology.name) if model is not None else None
        chosen = routes.partition(model) if routes is not None and model is not None else self.router.batch
        partition = chosen % self.partitions[topology.name]
        return self.router.submit(topology.inputs_topic, partition, request_id, value, headers, timeout_s)

    async def _follow_growth(self) -> None:
        while True:
            await asyncio.sleep(GROWTH_CHECK_S)
            for t in self.topologies:
                grown = self.router.partitions_of(t.inputs_topic)
                if grown <= self.partitions[t.name]:
                    continue
                try:  # replies land on the request's partition: the reply topic must have it first
                    await grow_partitions(self.kafka, [self.reply_topic(t)], grown)
                    await self.router.follow((self.reply_topic(t), p) for p in range(self.partitions[t.name], grown))
                except BrokerError as exc:  # keep sending to the partitions it has; try again next time
                    log.warning("gateway %s: topology '%s' has %d partitions now, but its replies cannot follow: "
                                "%s", self.instance, t.name, grown, exc)
                    continue
                log.info("gateway %s: topology '%s' now on %d partitions", self.instance, t.name, grown)
                self.partitions[t.name] = grown
