"""The prediction cache: outputs kept by a hash of the input tensors and of the version that computed them.

Clipper put a prediction cache in front of its models; here a node asks for one in its YAML
(``cache: {max_mb: 64, ttl_s: 60}``) and the gateway keeps one per topology (a top-level ``cache:``).

- **Keys** are blake2b digests of the version (node id, component, params, ``weights_hash``) and, per
  input tensor in name order, its name, dtype, shape and bytes. Equal inputs give equal keys; any of those
  differing gives another key. A new version (a reload or promote changes ``weights_hash``) empties the
  cache at once: old entries could never be hit again, so they would only hold bytes until evicted.
- **Eviction** is LRU bounded in bytes (array bytes + key + a fixed per-entry overhead). LRU rather than
  CLOCK: CLOCK exists to make a hit cheap where hits run concurrently (a reference bit instead of a list
  move under a lock), but a worker's cache is touched by one thread, and ``OrderedDict.move_to_end`` is an
  O(1) C call; LRU also evicts better than CLOCK's approximation of it.
- **TTL**: an entry older than ``ttl_s`` is a miss (and dropped), against a clock that tests can fake.
- **Immutability**: entries hold read-only copies; what a hit hands out is a fresh array, so no later
  stage (a fused member, a hook) can change what the next hit returns.

A worker uses :class:`NodeCache` around ``process`` through its stage hook (:mod:`flowserve.cache.hooks`):
the hits of a batch skip it, the misses run as one smaller batch, and :meth:`NodeCache.complete` merges
both back in the batch's order.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowserve.component import Component
from flowserve.runtime.hooks import Outcome

#: bytes charged per entry besides its arrays and key: the dicts and tuple that hold it (an estimate)
ENTRY_OVERHEAD = 256
DIGEST_SIZE = 16


def version_digest(*parts: str | None) -> bytes:
    """A digest of whatever identifies the computation (ids, parameters, weights hashes)."""
    h = hashlib.blake2b(digest_size=DIGEST_SIZE)
    for part in parts:
        h.update(b"\x01" if part is None else b"\x00" + part.encode() + b"\x00")
    return h.digest()


def component_version(node_id: str, component: Component) -> bytes:
    """The version of a node's outputs: node id, component and params, and the loaded weights' hash."""
    params = component.params.model_dump_json()
    return version_digest(node_id, component.describe(), params, component.weights_hash)


def tensor_key(version: bytes, tensors: Mapping[str, np.ndarray], vary: Sequence[bytes | None] = ()) -> bytes:
    """The cache key of one request's tensors under ``version``: names, dtypes, shapes and bytes; and the
    values of the headers its outputs depend on (``vary``, None where a request has none)."""
    h = hashlib.blake2b(version, digest_size=DIGEST_SIZE)
    for value in vary:
        h.update(b"\x01" if value is None else len(value).to_bytes(8, "little") + value)
    for name in sorted(tensors):
        a = tensors[name]
        h.update(f"\x00{name}\x00{a.dtype.str}\x00{a.shape}\x00".encode())
        if a.dtype.kind == "O":  # BYTES: each element length-prefixed, so ["ab", "c"] differs from ["a", "bc"]
            for x in a.ravel():
                b = x if isinstance(x, bytes) else str(x).encode()
                h.update(len(b).to_bytes(8, "little"))
                h.update(b)
        else:
            h.update(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)  # any fixed-width dtype, no copy
    return h.digest()


def frozen(array: np.ndarray) -> np.ndarray:
    """A read-only copy of ``array``."""
    out = np.array(array, copy=True)
    out.setflags(write=False)
    return out


@dataclass(frozen=True, slots=True)
class Entry:
    """One request's cached result: its output rows per port, and which rows each masked port emitted."""

    outputs: Mapping[str, np.ndarray]
    mask: Mapping[str, np.ndarray]
    nbytes: int
    born: float


class PredictionCache:
    """An LRU map from keys to :class:`Entry`, bounded in bytes, with an optional TTL. Not thread-safe."""

    def __init__(self, max_bytes: int, ttl_s: float | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: OrderedDict[bytes, Entry] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.expired = 0
        self.invalidations = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> Entry | None:
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        if self.ttl_s is not None and self.clock() - entry.born > self.ttl_s:
            self._drop(key)
            self.expired += 1
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: bytes, outputs: Mapping[str, np.ndarray], mask: Mapping[str, np.ndarray] | None = None
            ) -> bool:
        """Keep read-only copies of ``outputs`` (and ``mask``) under ``key``; False when one entry alone
        exceeds the bound (then nothing is kept)."""
        outs = {p: frozen(a) for p, a in outputs.items()}
        masks = {p: frozen(m) for p, m in (mask or {}).items()}
        size = len(key) + ENTRY_OVERHEAD + sum(a.nbytes for a in outs.values()) + sum(m.nbytes for m in masks.values())
        if size > self.max_bytes:
            return False
        if key in self._entries:
            self._drop(key)
        self._entries[key] = Entry(outs, masks, size, self.clock())
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
            self.evictions += 1
        return True

    def clear(self) -> None:
        """Forget every entry (the version changed)."""
        if self._entries:
            self.invalidations += 1
        self._entries.clear()
        self.bytes = 0

    def _drop(self, key: bytes) -> None:
        self.bytes -= self._entries.pop(key).nbytes

    def counters(self, prefix: str = "cache_") -> dict[str, int]:
        return {f"{prefix}hits": self.hits, f"{prefix}misses": self.misses, f"{prefix}evictions": self.evictions,
                f"{prefix}bytes": self.bytes, f"{prefix}entries": len(self._entries),
                f"{prefix}expired": self.expired, f"{prefix}invalidations": self.invalidations}


@dataclass(slots=True)
class Lookup:
    """A batch's keys and, per request, its cached entry (None: a miss, to be processed)."""

    keys: list[bytes]
    entries: list[Entry | None]

    @property
    def hits(self) -> int:
        return sum(e is not None for e in self.entries)


class NodeCache:
    """A node's prediction cache, keyed under its component's current version."""

    def __init__(self, node_id: str, component: Component, max_bytes: int, ttl_s: float | None = None, *,
                 vary: Sequence[str] = (), clock: Callable[[], float] = time.monotonic) -> None:
        self.node_id = node_id
        self.component = component
        self.vary = tuple(vary)
        self.cache = PredictionCache(max_bytes, ttl_s, clock=clock)
        self._weights: str | None = component.weights_hash
        self.version = component_version(node_id, component)

    def _check_version(self) -> None:
        # setup, a reload or a promote changes weights_hash; one attribute read per batch notices it
        if self.component.weights_hash != self._weights:
            self._weights = self.component.weights_hash
            self.version = component_version(self.node_id, self.component)
            self.cache.clear()

    def lookup(self, requests: Sequence[Mapping[str, np.ndarray]],
               headers: Sequence[Mapping[str, bytes]] = ()) -> Lookup:
        """Each request's key and cached entry, in order (``headers``: each request's, for ``vary``)."""
        self._check_version()
        version, get, vary = self.version, self.cache.get, self.vary
        if vary:
            keys = [tensor_key(version, t, [h.get(name) for name in vary])
                    for t, h in zip(requests, headers or [{}] * len(requests), strict=True)]
        else:
            keys = [tensor_key(version, t) for t in requests]
        return Lookup(keys, [get(k) for k in keys])

    def complete(self, looked: Lookup, sizes: Sequence[int], outputs: dict[str, np.ndarray],
                 mask: dict[str, np.ndarray], errors: dict[int, str]) -> Outcome:
        """The whole batch's outputs, masks and errors, in its order, from the cached entries and what
        ``process`` returned for the misses (``outputs``... over the misses only, in order); the misses
        that did not fail are cached."""
        hits = looked.hits
        if hits == len(sizes):
            out, m = assemble([(e.outputs, e.mask) for e in looked.entries if e is not None], sizes)
            return out, m, {}
        miss_sizes = sizes if not hits else [n for n, e in zip(sizes, looked.entries, strict=True) if e is None]
        fresh = split(outputs, mask, miss_sizes)
        bad = _failed(errors, miss_sizes)
        miss_keys = looked.keys if not hits else [k for k, e in zip(looked.keys, looked.entries, strict=True)
                                                   if e is None]
        for j, (key, (outs, masks)) in enumerate(zip(miss_keys, fresh, strict=True)):
            if j not in bad:
                self.cache.put(key, outs, masks)
        if not hits:
            return outputs, mask, errors
        parts: list[tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]] = []
        merged_errors: dict[int, str] = {}
        fresh_iter = iter(fresh)
        miss_starts = np.cumsum([0, *miss_sizes])
        start, j = 0, 0
        for n, e in zip(sizes, looked.entries, strict=True):
            if e is not None:
                parts.append((e.outputs, e.mask))
            else:
                parts.append(next(fresh_iter))
                if j in bad:  # the failed request's rows keep their reasons, at their new position
                    shift = start - int(miss_starts[j])
                    merged_errors.update({r + shift: why for r, why in errors.items()
                                          if miss_starts[j] <= r < miss_starts[j + 1]})
                j += 1
            start += n
        out, m = assemble(parts, sizes)
        return out, m, merged_errors

    def counters(self) -> dict[str, int]:
        return self.cache.counters()


def split(outputs: Mapping[str, np.ndarray], mask: Mapping[str, np.ndarray], sizes: Sequence[int]
          ) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """Per request (``sizes``: its rows), its rows of every output and mask (views, not copies)."""
    out = []
    start = 0
    for n in sizes:
        stop = start + n
        out.append(({p: a[start:stop] for p, a in outputs.items()}, {p: m[start:stop] for p, m in mask.items()}))
        start = stop
    return out


def assemble(parts: Sequence[tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]], sizes: Sequence[int]
             ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One batch's outputs and masks from per-request parts, in order: fresh arrays, never a part itself.

    A port some request has no rows for (its ``process`` returned nothing there) gets filler rows that
    its mask switches off."""
    template: dict[str, np.ndarray] = {}
    for outs, _ in parts:
        for p, a in outs.items():
            template.setdefault(p, a)
    outputs: dict[str, np.ndarray] = {}
    mask: dict[str, np.ndarray] = {}
    for port, tmpl in template.items():
        pieces: list[Any] = []
        flags: list[np.ndarray | None] = []
        for (outs, masks), n in zip(parts, sizes, strict=True):
            rows = outs.get(port)
            if rows is None:
                pieces.append(np.zeros((n, *tmpl.shape[1:]), dtype=tmpl.dtype))
                flags.append(np.zeros(n, dtype=bool))
            else:
                pieces.append(rows)
                flags.append(masks.get(port))
        outputs[port] = np.concatenate(pieces) if len(pieces) > 1 else np.array(pieces[0], copy=True)
        if any(f is not None for f in flags):
            mask[port] = np.concatenate([np.ones(n, dtype=bool) if f is None else f
                                         for f, n in zip(flags, sizes, strict=True)])
    return outputs, mask


def _failed(errors: Mapping[int, str], sizes: Sequence[int]) -> set[int]:
    """Indices of the requests (``sizes``: rows of each) holding a failed row."""
    if not errors:
        return set()
    ends = np.cumsum(sizes)
    return {int(np.searchsorted(ends, r, side="right")) for r in errors}
