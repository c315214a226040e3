"""``POST /v2/models/{name}/explain``: a request answered as ``infer`` answers it, with its explanation.

The gateway does not compute explanations: it sends the request with the ``fs-explain: 1`` header, which
the topology's explain side branch (``flowserve explainer``, started by ``flowserve run`` for a topology
with an ``explain:`` section) explains whatever its sample, and waits for the record keyed by the request
id on ``<prefix>.<topology>.explanations``. :class:`ExplanationWatch` starts reading that topic at its end
before the request is sent, so the record cannot be missed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from flowserve.errors import DeadlineExceeded, ErrorKind, FlowserveError
from flowserve.kafka.admin import describe_partitions
from flowserve.kafka.clients import start_client
from flowserve.kafka.settings import KafkaSettings
from flowserve.kafka.shutdown import stop_client


class ExplanationWatch:
    """Reads ``topic`` from its end (as of entering) for one request id's explanation record."""

    def __init__(self, kafka: KafkaSettings, topic: str) -> None:
        self.kafka = kafka
        self.topic = topic
        self._consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, fetch_max_wait_ms=50,
                                          **kafka.client_kwargs())

    async def __aenter__(self) -> ExplanationWatch:
        consumer = self._consumer
        # the admin client's answer: a group-less consumer that subscribed to nothing has no topic's partitions
        count = (await describe_partitions(self.kafka, [self.topic])).get(self.topic, 0)
        if not count:
            raise FlowserveError(f"no topic {self.topic}: is the topology's explainer running (flowserve run "
                                   "starts it for a topology with an explain: section)?", kind=ErrorKind.UNAVAILABLE)
        await start_client(consumer, self.kafka)
        tps = [TopicPartition(self.topic, p) for p in range(count)]
        consumer.assign(tps)
        for tp, end in (await consumer.end_offsets(tps)).items():
            consumer.seek(tp, end)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await stop_client(self._consumer, "the explanation watch")

    async def wait(self, request_id: str, timeout_s: float) -> dict[str, Any]:
        """The explanation record of ``request_id``; :class:`DeadlineExceeded` when none came in ``timeout_s``."""
        key = request_id.encode()
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    for records in (await self._consumer.getmany(timeout_ms=200)).values():
                        for rec in records:
                            if rec.key == key and rec.value:
                                return dict(json.loads(rec.value))
        except TimeoutError:
            raise DeadlineExceeded(f"no explanation of request '{request_id}' on {self.topic} within {timeout_s:g} s; "
                                   "is the topology's explainer running, and keeping up?") from None
