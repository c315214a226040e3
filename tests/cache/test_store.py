"""The prediction cache without a broker: keys, eviction in bytes, TTL, versions, merging hits and misses."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest

from flowserve.cache.store import ENTRY_OVERHEAD, NodeCache, PredictionCache, tensor_key, version_digest
from flowserve.component import Batch, Component, Port
from flowserve.errors import TopologyError
from flowserve.topology.graph import load_topology_text

V1 = version_digest("node", "v1")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Double(Component):
    inputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 2])}
    outputs: ClassVar[dict[str, Port]] = {"y": Port("FP32", [-1, 2])}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"y": batch["x"] * 2}


def x(*values: float) -> dict[str, np.ndarray]:
    return {"x": np.array([values], dtype=np.float32)}


# -- keys -----------------------------------------------------------------------------------------

def test_equal_tensors_give_equal_keys_whatever_their_memory() -> None:
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    b = np.asfortranarray(a.copy())  # same values, another layout in memory
    assert tensor_key(V1, {"x": a, "z": a[:1]}) == tensor_key(V1, {"z": a[:1].copy(), "x": b})


@pytest.mark.parametrize("other", [
    {"x": np.zeros((1, 2), dtype=np.float64)},            # dtype
    {"x": np.zeros((2, 1), dtype=np.float32)},            # shape
    {"w": np.zeros((1, 2), dtype=np.float32)},            # name
    {"x": np.array([[0, 1e-30]], dtype=np.float32)},      # bytes
])
def test_any_difference_gives_another_key(other: dict[str, np.ndarray]) -> None:
    assert tensor_key(V1, {"x": np.zeros((1, 2), dtype=np.float32)}) != tensor_key(V1, other)


@pytest.mark.parametrize("dtype", [np.float16, np.bool_, np.int8, np.uint64, np.complex64])
def test_every_fixed_width_dtype_is_keyed(dtype: type) -> None:
    a = np.zeros((2, 3), dtype=dtype)
    b = a.copy()
    b[1, 2] = 1
    assert tensor_key(V1, {"x": a}) == tensor_key(V1, {"x": a.copy()}) != tensor_key(V1, {"x": b})
    assert tensor_key(V1, {"x": a[0, 0]}) != tensor_key(V1, {"x": a[:1, :1]})  # shape () vs (1, 1)


def test_varying_headers_are_part_of_the_key() -> None:
    t = {"x": np.zeros((1, 2), dtype=np.float32)}
    keys = {tensor_key(V1, t, vary) for vary in ([b"ann"], [b"bob"], [None], [b""], [])}
    assert len(keys) == 5
    cache = NodeCache("n", Double(), 1 << 20, vary=["x-user"])
    looked = cache.lookup([x(1, 1), x(1, 1), x(1, 1)], [{"x-user": b"ann"}, {"x-user": b"bob"}, {}])
    assert len(set(looked.keys)) == 3
    assert NodeCache("n", Double(), 1 << 20).lookup([x(1, 1)], [{"x-user": b"ann"}]).keys == \
        NodeCache("n", Double(), 1 << 20).lookup([x(1, 1)], [{"x-user": b"bob"}]).keys  # not varied: ignored


def test_version_is_part_of_the_key() -> None:
    t = {"x": np.zeros((1, 2), dtype=np.float32)}
    assert tensor_key(V1, t) != tensor_key(version_digest("node", "v2"), t)
    assert version_digest("a", None) != version_digest("a", "")


def test_bytes_tensors_are_keyed_element_by_element() -> None:
    a = np.array([b"ab", b"c"], dtype=object)
    b = np.array([b"a", b"bc"], dtype=object)
    assert tensor_key(V1, {"s": a}) != tensor_key(V1, {"s": b})
    assert tensor_key(V1, {"s": a}) == tensor_key(V1, {"s": np.array([b"ab", b"c"], dtype=object)})


# -- the store ------------------------------------------------------------------------------------

def entry_bytes(key: bytes, *arrays: np.ndarray) -> int:
    return len(key) + ENTRY_OVERHEAD + sum(a.nbytes for a in arrays)


def test_eviction_is_bounded_in_bytes_least_recently_used_first() -> None:
    row = np.zeros(100, dtype=np.uint8)
    one = entry_bytes(b"k0", row)
    cache = PredictionCache(max_bytes=3 * one)
    for k in (b"k0", b"k1", b"k2"):
        assert cache.put(k, {"y": row})
    assert cache.bytes == 3 * one and cache.evictions == 0
    assert cache.get(b"k0") is not None  # k1 is now the least recently used
    cache.put(b"k3", {"y": row})
    assert cache.evictions == 1 and cache.bytes == 3 * one
    assert cache.get(b"k1") is None and cache.get(b"k0") is not None
    big = np.zeros(4 * one, dtype=np.uint8)
    assert not cache.put(b"kb", {"y": big})  # larger than the whole bound: not kept, nothing evicted
    assert len(cache) == 3
    cache.put(b"kw", {"y": np.zeros(2 * one - 2 - ENTRY_OVERHEAD, dtype=np.uint8)})  # takes the room of two
    assert cache.bytes == cache.max_bytes and cache.evictions == 3 and len(cache) == 2


def test_ttl_expires_entries_on_the_given_clock() -> None:
    clock = FakeClock()
    cache = PredictionCache(1 << 20, ttl_s=10, clock=clock)
    cache.put(b"k", {"y": np.ones(3)})
    clock.now += 10
    assert cache.get(b"k") is not None
    clock.now += 0.5
    assert cache.get(b"k") is None
    assert (cache.hits, cache.misses, cache.expired, cache.bytes, len(cache)) == (1, 1, 1, 0, 0)


def test_entries_are_read_only_copies() -> None:
    cache = PredictionCache(1 << 20)
    out = np.ones(3)
    cache.put(b"k", {"y": out})
    out[0] = 7  # the producer's array changes afterwards: the cached copy does not
    entry = cache.get(b"k")
    assert entry is not None and entry.outputs["y"][0] == 1
    with pytest.raises(ValueError, match="read-only"):
        entry.outputs["y"][0] = 5


# -- a node's cache ---------------------------------------------------------------------------------

def run(cache: NodeCache, comp: Component, requests: list[dict[str, np.ndarray]]) -> tuple:
    """What a worker does: look up, process the misses as one batch, complete."""
    looked = cache.lookup(requests)
    sizes = [r["x"].shape[0] for r in requests]
    todo = [r for r, e in zip(requests, looked.entries, strict=True) if e is None]
    outputs: dict = {}
    if todo:
        batch = Batch({"x": np.concatenate([r["x"] for r in todo])}, [r["x"].shape[0] for r in todo],
                      [str(i) for i in range(len(todo))])
        outputs = dict(comp.process(batch))  # type: ignore[arg-type]
    return cache.complete(looked, sizes, outputs, {}, {}), len(todo)


def test_mixed_hits_and_misses_come_back_in_batch_order() -> None:
    comp = Double()
    cache = NodeCache("n", comp, 1 << 20)
    (_, _, _), processed = run(cache, comp, [x(1, 1), x(3, 3)])
    assert processed == 2
    two_rows = {"x": np.array([[5, 5], [6, 6]], dtype=np.float32)}
    requests = [x(2, 2), x(3, 3), two_rows, x(1, 1), x(4, 4)]
    (outputs, mask, errors), processed = run(cache, comp, requests)
    assert processed == 3  # x(3,3) and x(1,1) were hits
    expected = np.concatenate([r["x"] for r in requests]) * 2
    np.testing.assert_array_equal(outputs["y"], expected)
    assert mask == {} and errors == {}
    assert cache.counters()["cache_hits"] == 2 and cache.counters()["cache_misses"] == 5
    (outputs, _, _), processed = run(cache, comp, [x(4, 4), two_rows])  # all hits: process not called
    assert processed == 0
    np.testing.assert_array_equal(outputs["y"], np.array([[8, 8], [10, 10], [12, 12]], dtype=np.float32))
    outputs["y"][0] = -1  # what a hit hands out is the caller's to change
    (again, _, _), _ = run(cache, comp, [x(4, 4)])
    np.testing.assert_array_equal(again["y"], [[8, 8]])


def test_failed_requests_are_not_cached_and_keep_their_errors_at_their_place() -> None:
    comp = Double()
    cache = NodeCache("n", comp, 1 << 20)
    run(cache, comp, [x(1, 1)])
    looked = cache.lookup([x(1, 1), x(2, 2), x(3, 3)])
    fresh = {"y": np.array([[4, 4], [6, 6]], dtype=np.float32)}
    outputs, _, errors = cache.complete(looked, [1, 1, 1], fresh, {}, {0: "bad row"})
    assert errors == {1: "bad row"}  # row 0 of the misses is row 1 of the batch
    np.testing.assert_array_equal(outputs["y"], [[2, 2], [4, 4], [6, 6]])
    again = cache.lookup([x(2, 2), x(3, 3)])
    assert [e is None for e in again.entries] == [True, False]


def test_masks_of_hits_and_misses_are_merged() -> None:
    comp = Double()
    cache = NodeCache("n", comp, 1 << 20)
    looked = cache.lookup([x(1, 1), x(2, 2)])
    cache.complete(looked, [1, 1], {"y": np.array([[2, 2], [4, 4]], dtype=np.float32)}, {"y": np.array([True, False])},
                   {})
    looked = cache.lookup([x(2, 2), x(5, 5), x(1, 1)])
    outputs, mask, _ = cache.complete(looked, [1, 1, 1], {"y": np.array([[10, 10]], dtype=np.float32)}, {}, {})
    np.testing.assert_array_equal(mask["y"], [False, True, True])
    np.testing.assert_array_equal(outputs["y"][1:], [[10, 10], [2, 2]])


def test_a_new_weights_hash_empties_the_cache() -> None:
    comp = Double()
    cache = NodeCache("n", comp, 1 << 20)
    run(cache, comp, [x(1, 1)])
    assert cache.lookup([x(1, 1)]).hits == 1
    comp.weights_hash = "sha256:new"  # a reload or a promote
    assert cache.lookup([x(1, 1)]).hits == 0
    counters = cache.counters()
    assert counters["cache_invalidations"] == 1 and counters["cache_bytes"] == 0


def test_params_and_node_are_part_of_the_version() -> None:
    assert NodeCache("a", Double(), 1).version != NodeCache("b", Double(), 1).version


# -- the YAML ----------------------------------------------------------------------------------------

YAML = """
name: t
cache: {max_mb: 1}
nodes:
  a: {component: "tests.cache.test_store:Double", inputs: {x: input.x}, cache: CACHE}
  b: {component: "tests.cache.test_store:Double", inputs: {x: a.y}}
outputs: {y: b.y}
"""


def test_cache_options_load_and_bad_ones_name_the_node() -> None:
    topology = load_topology_text(YAML.replace("CACHE", "{max_mb: 0.5, ttl_s: 30, vary: [X-User]}"))
    assert topology.nodes["a"].cache is not None and topology.nodes["a"].cache.ttl_s == 30
    assert topology.nodes["a"].cache.vary == ["x-user"]
    assert topology.nodes["b"].cache is None and topology.spec.cache is not None
    for bad in ("{max_mb: 0}", "{ttl_s: -1}", "{size: 3}", "{vary: ['x user']}"):
        with pytest.raises(TopologyError) as info:
            load_topology_text(YAML.replace("CACHE", bad))
        assert info.value.node == "a" and "cache" in str(info.value)


def test_a_fused_chain_is_cached_when_every_member_is() -> None:
    both = YAML.replace("CACHE", "{max_mb: 2, ttl_s: 30}").replace("inputs: {x: a.y}}",
                                                                    "inputs: {x: a.y}, cache: {max_mb: 1}}")
    fused = load_topology_text(both + "fuse: {ab: [a, b]}\n")
    assert fused.nodes["ab"].cache is not None
    assert (fused.nodes["ab"].cache.max_mb, fused.nodes["ab"].cache.ttl_s) == (1, 30)
    with pytest.raises(TopologyError, match="every member needs 'cache:'") as info:
        load_topology_text(YAML.replace("CACHE", "{max_mb: 2}") + "fuse: {ab: [a, b]}\n")
    assert info.value.node == "b"
