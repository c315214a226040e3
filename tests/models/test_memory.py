"""Device memory: eviction order on a hand-made sequence (furthest predicted next use first, LRU among
models with no prediction, never a pinned model nor one needed before the newcomer), and the LRU baseline."""

from __future__ import annotations

import math

import pytest

from flowserve.errors import ErrorKind, FlowserveError
from flowserve.models import Catalogue, DeviceMemory, LruServer, ModelSpec, Predictor, Scheduler
from flowserve.models.scheduler import Action, ActionKind


def _loaded(capacity: int, names: str, size: int = 100) -> DeviceMemory:
    m = DeviceMemory(capacity)
    for t, name in enumerate(names):  # loaded (and last used) at t = 0, 1, 2, ...
        m.admit(name, size, now=float(t))
        m.unpin(name)
    return m


def test_eviction_order_on_a_hand_made_sequence() -> None:
    m = _loaded(500, "abcde")
    m.touch("a", 10.0)  # a used last; b, c, d, e in order before it
    next_use = {"b": 20.0, "c": 50.0, "d": 30.0}  # e and a: nothing predicted
    # all of it: no prediction first (LRU among them: e then a), then furthest predicted: c, d, b
    assert m.victims(500, now=11.0, next_use=next_use) == ("e", "a", "c", "d", "b")
    assert m.victims(100, now=11.0, next_use=next_use) == ("e",)
    assert m.victims(300, now=11.0, next_use=next_use) == ("e", "a", "c")
    # none needed before the newcomer is: c (50) may go, d (30) may not
    assert m.victims(300, now=11.0, next_use=next_use, keep_before=40.0) == ("e", "a", "c")
    assert m.victims(400, now=11.0, next_use=next_use, keep_before=40.0) is None
    m.pin("e")  # in use: never evicted
    assert m.victims(100, now=11.0, next_use=next_use) == ("a",)
    assert m.victims(600, now=11.0, next_use={}) is None  # larger than the device


def test_admit_evicts_then_counts() -> None:
    m = _loaded(200, "ab")
    assert m.admit("c", 100, now=5.0, evict=("a",)) == ("a",)
    assert set(m.resident) == {"b", "c"} and m.used == 200 and m.loads == 3 and m.evictions == 1
    with pytest.raises(FlowserveError, match="in use") as e:
        m.evict("c")  # its load is in progress
    assert e.value.kind is ErrorKind.UNAVAILABLE
    with pytest.raises(FlowserveError, match="0 bytes free"):
        m.admit("d", 100, now=6.0)


def test_the_predictor_decays_and_predicts_from_the_rate() -> None:
    p = Predictor(tau=10.0)
    assert p.next_use("x", 0.0) == math.inf  # never seen: no prediction
    for _ in range(20):
        p.observe("x", 0.0)
    assert p.rate("x", 0.0) == pytest.approx(2.0)
    assert p.next_use("x", 0.0) == pytest.approx(0.5)
    assert p.rate("x", 10.0) == pytest.approx(2.0 / math.e)


def _cat(*names: str) -> Catalogue:
    return Catalogue([ModelSpec(n, 100, 0.01, {1: 0.005}) for n in names])


def test_the_scheduler_evicts_the_model_needed_furthest_away() -> None:
    s = Scheduler(_cat("hot", "busy", "cold", "new"), capacity=300)
    s.preload(["hot", "busy", "cold"])
    for _ in range(100):
        s.predictor.observe("hot", 0.0)  # 10 a second: next predicted in 0.1 s
    s.predictor.observe("cold", 0.0)  # once: next predicted in 10 s
    s.compute = Action(ActionKind.BATCH, "hot", 0.0, 0.001, 0.001)  # busy: only the copy lane picks
    s.submit(1, "busy", deadline=0.05, now=0.0)
    s.submit(2, "new", deadline=0.5, now=0.0)
    (load,) = s.step(0.0).actions
    assert (load.kind, load.model, load.evicted) == (ActionKind.LOAD, "new", ("cold",))


def test_lru_serves_in_arrival_order_and_evicts_the_least_recently_used() -> None:
    s = LruServer(_cat("a", "b", "c"), capacity=200)
    s.preload(["a", "b"])
    s.memory.touch("a", 1.0)  # b is the least recently used
    s.submit(1, "c", deadline=0.1, now=2.0)
    s.submit(2, "b", deadline=0.1, now=2.0)
    s.submit(3, "a", deadline=0.1, now=2.0)
    out = s.step(2.0)
    batch, load = out.actions
    assert (batch.kind, batch.model, batch.requests) == (ActionKind.BATCH, "b", (2,))  # oldest resident one
    assert (load.kind, load.model, load.evicted) == (ActionKind.LOAD, "c", ("a",))  # b is pinned by its batch
    assert out.refused == []


def test_a_prior_rate_keeps_a_preloaded_hot_model_resident_before_its_first_request() -> None:
    cat = Catalogue([ModelSpec(n, 100, 0.01, {1: 0.005}) for n in ("a-hot", "b-cold", "new")])
    for expect, evicted in (({}, ("a-hot",)), ({"a-hot": 50.0}, ("b-cold",))):
        s = Scheduler(cat, capacity=200)
        s.preload(["a-hot", "b-cold"])
        s.expect(expect)  # without a prior both are unpredicted, and the least recently used goes: a tie, by name
        assert s.predictor.rate("a-hot", 0.0) == (50.0 if expect else 0.0)
        s.submit(0, "new", deadline=1.0, now=0.0)
        (load,) = s.step(0.0).actions
        assert load.model == "new" and load.evicted == evicted
