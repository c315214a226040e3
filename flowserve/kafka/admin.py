"""Topic administration: create a topology's topics (waiting for their leaders), describe and delete them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from flowserve.errors import BrokerError
from flowserve.kafka.clients import OVERHEAD
from flowserve.kafka.settings import KafkaSettings


async def ensure_topics(kafka: KafkaSettings, topics: Iterable[str], partitions: int,
                        *, max_message_bytes: int | None = None, timeout_s: float = 30.0,
                        configs: Mapping[str, Mapping[str, str]] | None = None) -> list[str]:
    """Create the topics that are missing, all with ``partitions`` partitions. Returns those created.

    ``configs`` adds per-topic settings (e.g. ``retention.ms``) to the topics it names.
    """
    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
    except Exception as exc:
        raise BrokerError(f"cannot reach Kafka at {kafka.bootstrap}: {exc!r}") from None
    try:
        existing = set(await admin.list_topics())
        config = {"max.message.bytes": str(max_message_bytes + OVERHEAD)} if max_message_bytes else {}
        wanted = [t for t in dict.fromkeys(topics) if t not in existing]
        if wanted:
            new = [NewTopic(t, num_partitions=partitions, replication_factor=1,
                            topic_configs={**config, **(configs or {}).get(t, {})})
                   for t in wanted]
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(new)
            await _await_leaders(admin, wanted, partitions, timeout_s)
        return wanted
    finally:
        await admin.close()


async def _await_leaders(admin: AIOKafkaAdminClient, topics: list[str], partitions: int, timeout_s: float) -> None:
    """Return once every partition of ``topics`` has a leader. A broker acknowledges CreateTopics before
    its metadata knows the leaders; clients that fetch offsets meanwhile get NotLeaderForPartition (and
    log it as an error) until they do."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        described = await admin.describe_topics(topics)
        led = [m for m in described if not m.get("error_code") and len(m.get("partitions", [])) == partitions
               and all(p.get("leader", -1) >= 0 and not p.get("error_code") for p in m["partitions"])]
        if len(led) == len(topics) or asyncio.get_running_loop().time() > deadline:
            return  # past the deadline, clients retry on their own: not worth failing over
        await asyncio.sleep(0.02)


async def describe_partitions(kafka: KafkaSettings, topics: Iterable[str]) -> dict[str, int]:
    """Partition count per existing topic."""
    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
    await admin.start()
    try:
        out: dict[str, int] = {}
        for meta in await admin.describe_topics(list(topics)):
            if not meta.get("error_code"):
                out[meta["topic"]] = len(meta.get("partitions", []))
        return out
    finally:
        await admin.close()


async def delete_topics(kafka: KafkaSettings, topics: Iterable[str], timeout_s: float = 10.0) -> None:
    """Delete the topics that exist among ``topics``; raises :class:`BrokerError` when the broker refuses."""
    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        existing = set(await admin.list_topics())
        doomed = [t for t in dict.fromkeys(topics) if t in existing]
        if doomed:
            await asyncio.wait_for(admin.delete_topics(doomed), timeout_s)
    except Exception as exc:
        raise BrokerError(f"could not delete topics at {kafka.bootstrap}: {exc!r}") from None
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
