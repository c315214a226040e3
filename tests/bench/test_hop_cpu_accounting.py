"""``flowserve bench hop-cpu``'s accounting: issue 35's CPU-per-hop target on good and known bad runs, and the
paired ratio it reads (CPU seconds over records, now against before, slice pairs kept together)."""

from __future__ import annotations

from typing import Any

import pytest

from flowserve_bench.hop_cpu_targets import ISSUE_35_BEFORE, TARGET, targets
from flowserve_bench.paired import sum_ratio


def _run(ratios: dict[str, list[float | None]], commit: str = ISSUE_35_BEFORE) -> dict[str, Any]:
    return {"before": {"ref": commit, "commit": commit},
            "loads": [{"load": load, "cpu_ratio": ratio} for load, ratio in ratios.items()]}


GOOD = {"c1": [0.4, 0.38, 0.45], "c8": [0.42, 0.4, 0.48], "c32": [0.44, 0.41, 0.49], "c128": [0.3, 0.28, 0.33]}


def test_a_good_run_meets_the_target() -> None:
    assert targets(_run(GOOD)) == {TARGET: True}


@pytest.mark.parametrize("bad", [
    # the point passes, the interval's high end does not
    {**GOOD, "c8": [0.47, 0.44, 0.53]},
    # what this machine measured on 2026-12-04 (benchmarks/results/hop-cpu.json): no gain on bb77cab
    {**GOOD, "c8": [1.12, 1.05, 1.18], "c32": [1.06, 0.97, 1.16]},
    # a level not run, an unbounded ratio
    {k: v for k, v in GOOD.items() if k != "c128"},
    {**GOOD, "c1": [0.4, 0.38, None]},
])
def test_known_bad_runs_fail_it(bad: dict[str, list[float | None]]) -> None:
    assert targets(_run(bad)) == {TARGET: False}


def test_a_run_against_another_commit_decides_nothing_for_issue_35() -> None:
    assert targets(_run(GOOD, commit="cb84bbe")) == {TARGET: False}


def test_the_ratio_sums_each_side_before_dividing_and_keeps_pairs_together() -> None:
    # now: 2 CPU-s over 4,000 records and 1 over 1,000; before: 2 over 2,000 and 4 over 2,000
    point, low, high = sum_ratio([2.0, 1.0], [4000, 1000], [2.0, 4.0], [2000, 2000])
    assert point == pytest.approx((3 / 5000) / (6 / 4000))
    assert low <= point <= high
    # identical sides: the ratio is 1 in every resample
    assert sum_ratio([1.0, 2.0], [10, 30], [1.0, 2.0], [10, 30]) == pytest.approx((1.0, 1.0, 1.0))


async def test_a_commit_this_clone_lacks_is_a_clear_error() -> None:
    from flowserve.kafka.settings import KafkaSettings
    from flowserve_bench.hop_cpu import hop_cpu

    with pytest.raises(SystemExit, match="'no-such-ref' is not in .*git fetch --unshallow"):
        await hop_cpu(KafkaSettings(bootstrap="127.0.0.1:1"), before="no-such-ref")


def test_the_floor_is_relay_cpu_over_records_times_hops() -> None:
    from flowserve_bench.hop_cpu import floor_row

    # two slices: 300 records in 2 s with 0.09 CPU-s, 100 in 2 s with 0.03: 0.12 s / (400 x 3 hops)
    assert floor_row([(300, 2.0, 0.09), (100, 2.0, 0.03)], stages=3) == {
        "cpu_us_per_record_per_hop": 100.0, "throughput_rps": 100.0}
    # nothing came out: no division by zero, nothing claimed
    assert floor_row([(0, 2.0, 0.01)], stages=3)["throughput_rps"] == 0.0
