"""The gateway's response cache: a repeated request to a topology with a top-level ``cache:`` is answered
from memory, without a Kafka round trip.

The keys are :mod:`flowserve.cache.store`'s over the request's input tensors, under the topology's
version as far as the gateway knows it: name, ``version``, the whole YAML (so any change of params or
weight paths makes new keys) and the weights hashes its components declare. Only plain successes are
kept: never an error result, never an answer rebuilt from a parity group. What is kept is the output
tensors, not the response body, so each answer carries its own request's id and encoding.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from flowserve.cache.store import PredictionCache, tensor_key, version_digest
from flowserve.topology.graph import Topology

#: response header saying whether the answer came from the gateway's cache (``hit``) or the pipeline
CACHE_HEADER = "X-Flowserve-Cache"


def topology_version(topology: Topology) -> bytes:
    """What the gateway knows of a topology's version: its YAML and its components' weights hashes."""
    hashes = [f"{n}={node.component.weights_hash}" for n, node in topology.nodes.items()]
    return version_digest(topology.name, topology.version, topology.spec.model_dump_json(), *hashes)


class ResponseCache:
    """One :class:`PredictionCache` per topology that asks for one."""

    def __init__(self, topologies: list[Topology]) -> None:
        self._caches: dict[str, tuple[bytes, PredictionCache]] = {}
        self._vary: dict[str, list[str]] = {}
        for t in topologies:
            spec = t.spec.cache
            if spec is not None:
                self._caches[t.name] = (topology_version(t), PredictionCache(int(spec.max_mb * 2**20), spec.ttl_s))
                self._vary[t.name] = spec.vary

    def key(self, topology: Topology, tensors: Mapping[str, np.ndarray], headers: Mapping[str, str]
            ) -> bytes | None:
        """The request's key (``headers``: the HTTP request's, names lower-cased, for ``vary``), or None when
        its topology has no cache."""
        found = self._caches.get(topology.name)
        if found is None:
            return None
        vary = [None if (v := headers.get(name)) is None else v.encode() for name in self._vary[topology.name]]
        return tensor_key(found[0], tensors, vary)

    def get(self, topology: Topology, key: bytes) -> dict[str, np.ndarray] | None:
        """The cached outputs of ``key`` (read-only arrays), or None."""
        entry = self._caches[topology.name][1].get(key)
        return dict(entry.outputs) if entry is not None else None

    def put(self, topology: Topology, key: bytes, outputs: Mapping[str, np.ndarray]) -> None:
        self._caches[topology.name][1].put(key, outputs)

    def invalidate(self, topology: Topology) -> None:
        """Forget a topology's answers (its live version changed under the same YAML)."""
        found = self._caches.get(topology.name)
        if found is not None:
            found[1].clear()

    def counters(self) -> dict[str, dict[str, int]]:
        """Per cached topology: hits, misses, evictions, bytes, entries."""
        return {name: cache.counters(prefix="") for name, (_, cache) in self._caches.items()}
