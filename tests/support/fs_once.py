"""What "answered exactly once" means under at-least-once delivery, as a check a test can fail.

A worker killed mid-batch, or one that rewinds after a produce the broker did not take in time, writes some
replies twice: that is at-least-once, and the reader deduplicates by request id. So "exactly once" is said
of the caller: every request has a reply on the outputs topic, and every reply past a request's first was
dropped by the client's dedup and counted there (``ReplyCounters.duplicates``), none handed to a caller.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable

from fs_topics import read_to_end

from flowserve.client import TopologyClient
from flowserve.kafka.settings import KafkaSettings
from flowserve.wire.envelope import H_ID


async def replies_on_topic(kafka: KafkaSettings, topic: str, partitions: int, ids: Iterable[str]) -> Counter[str]:
    """How many reply records each of ``ids`` has on ``topic``, read from the start to its current end."""
    wanted = set(ids)
    counts: Counter[str] = Counter()
    for rec in await read_to_end(kafka, topic, partitions):
        rid = (rec.key or dict(rec.headers or ()).get(H_ID, b"")).decode("utf-8", "replace")
        if rid in wanted:
            counts[rid] += 1
    return counts


async def assert_answered_once(client: TopologyClient, kafka: KafkaSettings, ids: Iterable[str]) -> int:
    """Every request in ``ids`` has a reply on the outputs topic, and the client's dedup dropped (and counted)
    every reply past the first, so no caller was handed two. Returns how many duplicates it dropped."""
    ids = list(ids)
    topic = client.topology.outputs_topic
    counts = await replies_on_topic(kafka, topic, client.partitions, ids)
    unanswered = [rid for rid in ids if counts[rid] == 0]
    assert not unanswered, f"{len(unanswered)} requests have no reply on {topic}, e.g. {unanswered[:5]}"
    extra = sum(counts.values()) - len(ids)
    # The client reads the same records: wait (bounded) until it has read as far as the check did. Its
    # count may be higher (a readiness probe's duplicate counts there too), never lower: a duplicate the
    # dedup did not count is one a caller was handed.
    try:
        async with asyncio.timeout(60):
            while client.duplicates < extra:
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"{extra} duplicate replies on {topic}, the client's dedup dropped only "
                             f"{client.duplicates}: the rest reached a caller") from None
    return extra
