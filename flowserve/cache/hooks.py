"""The prediction cache as a stage hook: a node's ``cache:`` section answers repeated requests.

Before a batch's ``process`` the hook looks every request up (:meth:`~flowserve.cache.store.NodeCache.lookup`);
the hits are skipped, ``process`` runs on the misses as one smaller batch, and the hook merges both back in
the batch's order, caching the misses that did not fail. A batch retried request by request after a
failure is looked up (and counted) again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from flowserve.cache.store import Lookup, NodeCache
from flowserve.component import Component
from flowserve.errors import Failure
from flowserve.runtime.emit import Item
from flowserve.runtime.hooks import Outcome, StageHooks
from flowserve.topology.graph import Node, Topology


class CacheAnswer:
    """One batch's lookup: the hits are skipped, :meth:`complete` merges them with what ``process`` gave."""

    __slots__ = ("cache", "looked", "skip")

    def __init__(self, cache: NodeCache, looked: Lookup) -> None:
        self.cache = cache
        self.looked = looked
        self.skip = [e is not None for e in looked.entries]

    @property
    def failures(self) -> Mapping[int, Failure]:
        return {}  # a hit is an answer: failed requests are never cached

    def complete(self, sizes: Sequence[int], outputs: dict[str, np.ndarray], mask: dict[str, np.ndarray],
                 errors: dict[int, str]) -> Outcome:
        return self.cache.complete(self.looked, sizes, outputs, mask, errors)


class CacheHooks(StageHooks):
    """A node's prediction cache in front of its ``process``."""

    def __init__(self, cache: NodeCache) -> None:
        self.cache = cache

    def answer(self, items: Sequence[Item], sizes: Sequence[int]) -> CacheAnswer:
        return CacheAnswer(self.cache, self.cache.lookup([it.ready.tensors for it in items],
                                                         [it.ready.headers for it in items]))

    def counters(self) -> Mapping[str, int]:
        return self.cache.counters()


def cache_hooks(topology: Topology, node: Node, component: Component) -> list[StageHooks]:
    """The :data:`~flowserve.runtime.hooks.HookFactory` of the prediction cache: a :class:`CacheHooks` for a
    node whose YAML asks for a cache, nothing (and no cost) elsewhere."""
    spec = node.cache
    if spec is None:
        return []
    return [CacheHooks(NodeCache(node.id, component, int(spec.max_mb * 2**20), spec.ttl_s, vary=spec.vary))]
