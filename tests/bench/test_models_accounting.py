"""``flowserve bench models``'s accounting: a good run meets every target, and known bad runs (late
answers, requests neither answered nor refused, too little goodput, a missing cell) fail theirs."""

from __future__ import annotations

import numpy as np

from flowserve_bench.models import models_bench
from flowserve_bench.models_account import FLOWSERVE, LRU, Slice, goodput_ratio, models_targets, row, slices_of


def _slices(sent: int, within: int, late: int, refused: int, count: int = 10) -> list[Slice]:
    return [Slice(sent, within, late, refused)] * count


def _rows(flowserve: list[Slice], lru: list[Slice]) -> list[dict]:
    return [row(m, s, w, load, 100.0, 10.0, {FLOWSERVE: flowserve, LRU: lru})
            for m, w in ((1000, 2), (4000, 4)) for s in (0.9, 1.2) for load in (0.5, 0.7)]


GOOD = _slices(100_000, 99_990, 0, 10)
LRU_RUN = _slices(100_000, 40_000, 60_000, 0)


def test_a_good_run_meets_every_target() -> None:
    targets = models_targets(_rows(GOOD, LRU_RUN))
    assert targets == {"1000_models_2_workers_70pct_attainment_ge_99.9pct": True,
                       "1000_models_2_workers_70pct_late_le_0.01pct": True,
                       "1000_models_2_workers_70pct_rest_refused_early_deadline": True,
                       "goodput_ge_2x_lru_at_70pct": True,
                       "4000_models_4_workers_50pct_attainment_ge_99.9pct": True}


def test_a_known_bad_run_fails_its_targets() -> None:
    late = _slices(100_000, 99_900, 90, 10)  # 99.9% within but 0.09% late
    lost = _slices(100_000, 99_990, 0, 5)  # 5 per slice neither answered nor refused
    close_lru = _slices(100_000, 60_000, 40_000, 0)  # flowserve's goodput is only 1.67x
    t = models_targets(_rows(late, LRU_RUN))
    assert not t["1000_models_2_workers_70pct_late_le_0.01pct"]
    assert t["1000_models_2_workers_70pct_rest_refused_early_deadline"]
    t = models_targets(_rows(lost, LRU_RUN))
    assert not t["1000_models_2_workers_70pct_rest_refused_early_deadline"]
    assert not models_targets(_rows(GOOD, close_lru))["goodput_ge_2x_lru_at_70pct"]
    # attainment decided on the interval's low end: one bad slice of ten sinks it
    one_bad = GOOD[:9] + [Slice(100_000, 98_000, 0, 2_000)]
    assert not models_targets(_rows(one_bad, LRU_RUN))["1000_models_2_workers_70pct_attainment_ge_99.9pct"]
    # a cell that did not run fails its target
    rows = [r for r in _rows(GOOD, LRU_RUN) if r["models"] != 4000]
    assert not models_targets(rows)["4000_models_4_workers_50pct_attainment_ge_99.9pct"]


def test_figures_and_slices_count_every_request() -> None:
    arrival = np.arange(10.0)
    within = np.array([1, 1, 1, 0, 0, 1, 1, 1, 1, 0], dtype=bool)
    late = np.array([0, 0, 0, 1, 0, 0, 0, 0, 0, 0], dtype=bool)
    refused = np.array([0, 0, 0, 0, 1, 0, 0, 0, 0, 0], dtype=bool)
    parts = slices_of(arrival, within, late, refused, 2)
    assert parts == [Slice(5, 3, 1, 1), Slice(5, 4, 0, 0)]
    assert parts[1].lost == 1
    r = row(1000, 0.9, 2, 0.7, 1.0, 10.0, {FLOWSERVE: parts, LRU: [Slice(5, 0, 5, 0)] * 2})
    f = r[FLOWSERVE]
    assert (f["sent"], f["within"], f["late"], f["refused"], f["lost"]) == (10, 7, 1, 1, 1)
    assert f["attainment"][0] == 0.7 and f["goodput_rps"] == 0.7
    assert f["goodput_vs_lru"][0] == float("inf")
    assert goodput_ratio([Slice(1, 1, 0, 0)] * 3, [Slice(1, 1, 0, 0)] * 3) == [1.0, 1.0, 1.0]


def test_a_tiny_simulated_run_accounts_for_every_request() -> None:
    result = models_bench((100,), (1.2,), (2,), (0.5,), seconds=3.0, capacity_seconds=2.0, slices=3,
                          highest=False, log=None)
    assert result["simulated"] is True and "not live" in result["note"]
    (r,) = result["rows"]
    for name in (FLOWSERVE, LRU):
        f = r[name]
        assert f["sent"] == f["within"] + f["late"] + f["refused"] + f["lost"] > 0
        assert 0.0 <= f["copy_busy"] <= 1.0 and 0.0 < f["compute_busy"] <= 1.0
    assert r[LRU]["refused"] == 0  # LRU knows no deadlines
    assert r[FLOWSERVE]["lost"] == 0  # the scheduler answers or refuses each request
    assert r["dedicated_workers"] >= 100
    assert set(result["targets"]) == set(models_targets([]))
