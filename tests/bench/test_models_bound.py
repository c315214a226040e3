"""``flowserve bench models``'s offline ceiling: Kise, Ibaraki and Mine's rule drops the fewest loads (checked
against every subset on small agreeable instances), and no contender beats the ceiling it estimates."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from flowserve.models import Catalogue, poisson_zipf
from flowserve_bench.models import MEMORY_SHARE, SLO_S, serve
from flowserve_bench.models_bound import EVICTIONS, Job, bound, fewest_late


def _on_time(jobs: tuple[Job, ...]) -> bool:
    end = float("-inf")
    for release, due, took in jobs:
        end = max(end, release) + took
        if end > due + 1e-12:
            return False
    return True


def _brute_force(jobs: list[Job]) -> int:
    for drop in range(len(jobs) + 1):
        for kept in itertools.combinations(jobs, len(jobs) - drop):
            if _on_time(kept):
                return drop
    raise AssertionError("dropping every job is always on time")


def test_three_loads_due_together_drop_the_long_one() -> None:
    assert fewest_late([(0.0, 10.0, 6.0), (0.0, 10.0, 3.0), (0.0, 10.0, 3.0)]) == 1


def test_an_idle_gap_ends_a_busy_period() -> None:
    # the first load is over before the second is released: neither delays the other
    assert fewest_late([(0.0, 5.0, 5.0), (6.0, 11.0, 5.0), (6.0, 11.4, 0.5)]) == 1
    assert fewest_late([(0.0, 5.0, 5.0), (6.0, 11.0, 5.0)]) == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(1, 8)), min_size=1, max_size=8),
       st.integers(2, 15))
def test_the_rule_drops_the_fewest_on_agreeable_instances(loads: list[tuple[int, int]], slack: int) -> None:
    jobs = [(float(r), float(r + slack), float(p)) for r, p in sorted(loads)]  # one slack: agreeable
    assert fewest_late(jobs) == _brute_force(jobs)


def test_no_contender_beats_the_ceiling() -> None:
    catalogue = Catalogue.emulated(200)
    memory = int(MEMORY_SHARE * catalogue.total_bytes)
    for rate in (60.0, 110.0):
        wl = poisson_zipf(200, rate=rate, seconds=10.0, s=0.9, seed=3)
        online, clairvoyant = (bound(catalogue, wl, 2, memory, slo_s=SLO_S, evict=e) for e in EVICTIONS)
        assert online.requests == wl.arrivals.size and online.cold_requests > 0
        assert clairvoyant.cold_requests < online.cold_requests  # knowing the future keeps fewer models cold
        for contender in ("flowserve", "lru"):
            assert serve(catalogue, wl, 2, memory, contender, seed=3).within().sum() <= online.requests - online.misses


def test_with_every_model_resident_nothing_is_missed() -> None:
    catalogue = Catalogue.emulated(50)
    wl = poisson_zipf(50, rate=100.0, seconds=5.0, s=0.9, seed=1)
    for evict in EVICTIONS:
        ceiling = bound(catalogue, wl, 2, catalogue.total_bytes, slo_s=SLO_S, evict=evict)
        assert (ceiling.misses, ceiling.cold_requests, ceiling.attainment) == (0, 0, 1.0)
