"""Which workers hold which models: consistent hashing of model names over partitions, hot models replicated.

A model's home is the partition its name hashes to (BLAKE2b of the name, modulo the partition count: the
same model lands on the same partition on every machine and in every run, and adding models moves none),
and a partition belongs to the worker Kafka's range assignor gives it (contiguous ranges in partition order).
A model whose share of the traffic is high gets replicas: it needs ``share * workers / hot_share`` workers
(``hot_share``: the part of one worker's even share of the traffic one model may take alone), at most every
worker; replica ``k`` goes to the owner of the next partition along the ring whose worker holds no copy
yet. Requests for a replicated model are spread over its workers in turn.

>>> p = Placement(workers=2, partitions=8)
>>> p.place({"cold": 0.01, "hot": 0.5})["hot"]  # half the traffic: a copy on each worker
(0, 1)
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Iterator, Mapping

from flowserve.errors import ErrorKind, FlowserveError


def partition_of(name: str, partitions: int) -> int:
    """The partition model ``name`` hashes to (stable across processes, unlike ``hash``)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


class Placement:
    """Models over ``workers`` workers through ``partitions`` partitions (default: 16 per worker)."""

    def __init__(self, workers: int, *, partitions: int | None = None, hot_share: float = 0.2) -> None:
        partitions = partitions or 16 * workers
        if workers < 1 or partitions < workers or not 0 < hot_share <= 1:
            raise FlowserveError(f"placement needs workers >= 1 (got {workers}), at least as many partitions "
                                 f"(got {partitions}) and 0 < hot_share <= 1 (got {hot_share})",
                                 kind=ErrorKind.INVALID_SETTINGS)
        self.workers = workers
        self.partitions = partitions
        self.hot_share = hot_share
        self.holders: dict[str, tuple[int, ...]] = {}

    def owner(self, partition: int) -> int:
        """The worker Kafka's range assignor gives ``partition`` (contiguous ranges, the first ones larger):
        with ``q, r = divmod(partitions, workers)`` the first ``r`` workers take ``q + 1`` partitions each."""
        q, r = divmod(self.partitions, self.workers)
        big = r * (q + 1)  # the partitions of the workers with one more
        return partition // (q + 1) if partition < big else r + (partition - big) // q

    def home(self, name: str) -> int:
        return self.owner(partition_of(name, self.partitions))

    def replicas(self, share: float) -> int:
        """Workers a model with ``share`` of all requests needs."""
        return max(1, min(self.workers, math.ceil(share * self.workers / self.hot_share - 1e-9)))

    def place(self, shares: Mapping[str, float]) -> dict[str, tuple[int, ...]]:
        """Each model's workers, its home first, from each model's share of the requests (shares of models
        not named are taken as 0: one worker). Placing again with new shares rebalances: a model that grew
        hot gains workers, one that cooled keeps only its home."""
        for name, share in shares.items():
            self.holders[name] = tuple(w for w, _ in itertools.islice(self.ring(name), self.replicas(share)))
        return self.holders

    def ring(self, name: str) -> Iterator[tuple[int, int]]:
        """Along the ring of partitions from ``name``'s home, each worker with its first partition there,
        ``(worker, partition)``, its home's first: the order replicas are placed in."""
        start = partition_of(name, self.partitions)
        seen: set[int] = set()
        for k in range(self.partitions):
            partition = (start + k) % self.partitions
            worker = self.owner(partition)
            if worker not in seen:
                seen.add(worker)
                yield worker, partition

    def workers_of(self, name: str) -> tuple[int, ...]:
        """The workers holding ``name`` (its home alone for a model never placed)."""
        return self.holders.get(name) or (self.home(name),)

    def route(self, name: str, k: int) -> int:
        """The worker for the ``k``-th request of model ``name``: its workers in turn."""
        holders = self.workers_of(name)
        return holders[k % len(holders)]
