"""A node's ``models:`` section: its catalogue, its mistakes, and how the hook lays a batch's answers out."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from flowserve.errors import ErrorKind, Failure, FlowserveError
from flowserve.models import BANDWIDTH, Catalogue, Scheduler
from flowserve.models.catalogue import WEIGHTS
from flowserve.models.stage import ModelsAnswer
from flowserve.runtime import hardware as hw
from flowserve.topology.spec import ModelsSpec


def test_a_count_names_models_by_prefix_in_the_catalogues_mix() -> None:
    cat = Catalogue.declared(ModelsSpec(count=4, prefix="v-"))
    assert [s.name for s in cat] == ["v-00000", "v-00001", "v-00002", "v-00003"]
    assert [s.size_bytes for s in cat] == [s.size_bytes for s in Catalogue.emulated(4)]


def test_a_listed_model_overrides_its_size_and_table() -> None:
    spec = ModelsSpec(names=["a", {"name": "b", "size_mb": 25, "latency_ms": {1: 2.0, 8: 4.0}}], kind="alexnet",
                      link="pcie4-x16")
    a, b = Catalogue.declared(spec)
    assert a.size_bytes == WEIGHTS["alexnet"] and a.table == hw.latency_table("alexnet", "gpu-small")
    assert b.size_bytes == 25_000_000 and b.load_s == pytest.approx(25e6 / BANDWIDTH["pcie4-x16"])
    assert b.batch_s(1) == pytest.approx(0.002) and b.batch_s(8) == pytest.approx(0.004)


def test_mistakes_say_what_to_write() -> None:
    with pytest.raises(ValidationError, match="one of the two"):
        ModelsSpec(names=["a"], count=3)
    with pytest.raises(ValidationError, match="one of the two"):
        ModelsSpec()
    with pytest.raises(ValidationError, match="'a' is listed twice"):
        ModelsSpec(names=["a", "a"])
    with pytest.raises(FlowserveError, match="model 'x' has kind 'gpt'") as err:
        Catalogue.declared(ModelsSpec(names=["x"], kind="gpt"), node="zoo")
    assert err.value.kind is ErrorKind.INVALID_TOPOLOGY
    with pytest.raises(FlowserveError, match="unknown link 'pcie9'"):
        Catalogue.declared(ModelsSpec(count=1, link="pcie9"))


def test_a_horizon_lets_a_newcomer_evict_a_model_predicted_later_than_it() -> None:
    """With a deadline a minute off, every idle model's predicted next use comes before it: without a
    horizon the newcomer waits; with one it loads at once, evicting the idle model."""
    cat = Catalogue.declared(ModelsSpec(count=2, kind="resnet50"))
    size = cat[0].size_bytes
    for horizon, loads in ((math.inf, []), (0.1, ["m-00001"])):
        s = Scheduler(cat, size, horizon=horizon)
        s.preload(["m-00000"])
        s.predictor.observe("m-00000", 0.0)  # predicted again in 1 / (0.1 per s) = 10 s
        s.submit(0, "m-00001", deadline=60.0, now=0.0)
        assert [a.model for a in s.step(0.0).actions] == loads


def test_the_answer_masks_failed_requests_rows() -> None:
    y = np.arange(6, dtype=np.float32).reshape(3, 2)
    answer = ModelsAnswer([{"y": y[:1]}, Failure(ErrorKind.DEADLINE, "late"), {"y": y[1:]}])
    assert answer.skip == [True, True, True]
    assert list(answer.failures) == [1] and answer.failures[1].kind is ErrorKind.DEADLINE
    outputs, mask, errors = answer.complete([1, 1, 2], {}, {}, {})
    assert outputs["y"].shape == (4, 2) and not errors
    np.testing.assert_array_equal(outputs["y"][[0, 2, 3]], y)
    assert mask["y"].tolist() == [True, False, True, True]


def test_a_model_with_requests_waiting_is_kept_whatever_the_horizon() -> None:
    """Memory for two; c runs, a waits (due at 0.5), b arrives (due at 0.9): b may not evict a, needed
    first; once c is done, a runs and b evicts c, idle (predicted in 10 s)."""
    cat = Catalogue.declared(ModelsSpec(names=["a", "b", "c"], kind="resnet50"))
    s = Scheduler(cat, 2 * cat[0].size_bytes, horizon=0.0)
    s.preload(["a", "c"])
    s.submit(0, "c", deadline=1.0, now=0.0)
    (run_c,) = s.step(0.0).actions
    s.submit(1, "a", deadline=0.5, now=0.001)
    s.submit(2, "b", deadline=0.9, now=0.001)
    assert s.step(0.001).actions == []  # compute busy; a is needed before b, c is running
    s.finished(run_c, run_c.end)
    after = s.step(run_c.end).actions
    assert [(x.kind.value, x.model, x.evicted) for x in after] == [("batch", "a", ()), ("load", "b", ("c",))]
