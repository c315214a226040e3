"""Topic administration: create a topology's topics (waiting for their leaders), describe and delete them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping

from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from flowserve.errors import BrokerError
from flowserve.kafka.clients import OVERHEAD, unreachable
from flowserve.kafka.settings import KafkaSettings

log = logging.getLogger("flowserve.kafka.admin")


def replication(brokers: int, replication_factor: int | None = None,
                min_insync_replicas: int | None = None) -> tuple[int, int]:
    """The replication factor and ``min.insync.replicas`` for new topics on a cluster of ``brokers``.

    Defaults: ``min(3, brokers)`` copies, and 2 in-sync copies where there are 3 or more (so that
    ``acks=all`` survives one broker's loss); 1 otherwise. Asking for more than the cluster has raises
    :class:`BrokerError` before anything is created.

    >>> replication(3), replication(1), replication(5, 2)
    ((3, 2), (1, 1), (2, 1))
    """
    rf = min(3, brokers) if replication_factor is None else replication_factor
    if rf < 1:
        raise BrokerError(f"replication factor {rf} is not valid: use 1 or more")
    if rf > brokers:
        hint = (" (a single-node broker, such as the embedded one, keeps one copy of each partition)"
                if brokers == 1 else "")
        raise BrokerError(f"replication factor {rf} asks for more brokers than the cluster has ({brokers}){hint}: "
                          f"use --replication-factor {brokers} or FLOWSERVE_REPLICATION_FACTOR={brokers}, "
                          "or add brokers")
    isr = (2 if rf >= 3 else 1) if min_insync_replicas is None else min_insync_replicas
    if not 1 <= isr <= rf:
        raise BrokerError(f"min.insync.replicas {isr} must lie between 1 and the replication factor {rf}")
    return rf, isr


async def ensure_topics(kafka: KafkaSettings, topics: Iterable[str], partitions: int,
                        *, max_message_bytes: int | None = None, timeout_s: float = 30.0,
                        configs: Mapping[str, Mapping[str, str]] | None = None) -> list[str]:
    """Create the topics that are missing, all with ``partitions`` partitions. Returns those created.

    Their replication factor and ``min.insync.replicas`` come from ``kafka`` (see :func:`replication`;
    by default three copies, two in sync, on a cluster of three or more brokers). ``configs`` adds
    per-topic settings (e.g. ``retention.ms``) to the topics it names.
    """
    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
    except Exception as exc:
        raise await unreachable(kafka, exc) from None
    try:
        existing = set(await admin.list_topics())
        config = {"max.message.bytes": str(max_message_bytes + OVERHEAD)} if max_message_bytes else {}
        wanted = [t for t in dict.fromkeys(topics) if t not in existing]
        # checked even when every topic exists: an impossible setting is a mistake to report, not to skip
        cluster = await admin.describe_cluster()
        rf, isr = replication(len(cluster["brokers"]), kafka.replication_factor, kafka.min_insync_replicas)
        if wanted:
            if rf > 1:
                config["min.insync.replicas"] = str(isr)
            else:
                log.info("creating %d topic(s) with one copy of each partition: losing the broker loses them",
                         len(wanted))
            new = [NewTopic(t, num_partitions=partitions, replication_factor=rf,
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


async def grow_partitions(kafka: KafkaSettings, topics: Iterable[str], count: int, timeout_s: float = 30.0) -> None:
    """Raise each of ``topics`` that exists to ``count`` partitions, one at a time in the order given
    (CreatePartitions), and return once every new partition has a leader; topics that do not exist yet, or
    already have ``count``, are left alone. Raises :class:`BrokerError` naming the topic the broker refused
    (e.g. one that does not take CreatePartitions); topics before it have grown."""
    topics = list(dict.fromkeys(topics))
    admin = AIOKafkaAdminClient(**kafka.client_kwargs())
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        have = {m["topic"]: len(m.get("partitions", [])) for m in await admin.describe_topics(topics)
                if not m.get("error_code")}
        # already there (a retry, or another tuner): asking again is an error for the broker
        grown = [t for t in topics if t in have and have[t] < count]
        for topic in grown:  # in order: the caller grows downstream topics before those that feed them
            try:
                await asyncio.wait_for(admin.create_partitions({topic: NewPartitions(count)}), timeout_s)
            except Exception as exc:
                raise BrokerError(f"could not raise topic '{topic}' to {count} partitions at {kafka.bootstrap}: "
                                  f"{exc!r}") from None
        await _await_leaders(admin, grown, count, timeout_s)
    except TimeoutError:
        raise BrokerError(f"growing topics to {count} partitions at {kafka.bootstrap} took over {timeout_s:g} s") \
            from None
    finally:
        with contextlib.suppress(Exception):
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
