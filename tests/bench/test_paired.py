"""The statistics of interleaved-slice comparisons (flowserve_bench.paired)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from flowserve_bench.paired import (
    Slice,
    balanced_order,
    block_members,
    percentile_ratio,
    summary,
    throughput,
    throughput_ratio,
)


def _slices(rates: list[float], seconds: float = 2.0) -> list[Slice]:
    return [Slice(int(r * seconds), seconds, [1.0] * int(r * seconds)) for r in rates]


def test_throughput_is_total_requests_over_total_time() -> None:
    assert throughput([Slice(100, 1.0), Slice(300, 3.0)]) == 100.0
    assert summary(_slices([10.0, 20.0]))["throughput_rps"] == 15.0


def test_a_side_twice_as_fast_in_every_slice_has_ratio_two_with_no_spread() -> None:
    rates = [900.0, 1500.0, 1100.0, 1300.0]  # the machine drifts; both sides drift together
    ratio, low, high = throughput_ratio(_slices([2 * r for r in rates]), _slices(rates))
    assert ratio == low == high == pytest.approx(2.0)


def test_slice_noise_widens_the_interval_around_the_ratio() -> None:
    rng = np.random.default_rng(0)
    base = rng.uniform(800, 1600, 30)
    a, b = _slices(list(base * rng.normal(1.0, 0.05, 30))), _slices(list(base))
    ratio, low, high = throughput_ratio(a, b)
    assert low < ratio < high
    assert low < 1.0 < high


def test_percentile_ratio_of_scaled_latencies_is_the_scale() -> None:
    rng = np.random.default_rng(1)
    slices = [list(rng.exponential(5.0, 300)) for _ in range(10)]
    ratio, low, high = percentile_ratio([[1.2 * x for x in s] for s in slices], slices)
    assert ratio == pytest.approx(1.2)
    assert low == pytest.approx(1.2) and high == pytest.approx(1.2)


def test_p99_interval_resamples_whole_slices() -> None:
    # One slice on each side holds a stall; the interval must reflect that it may or may not be drawn.
    rng = np.random.default_rng(2)
    a = [list(rng.exponential(5.0, 200)) for _ in range(10)]
    b = [list(rng.exponential(5.0, 200)) for _ in range(10)]
    a[3] = a[3] + [500.0] * 30  # more than 1% of all latencies: p99 is the stall when slice 3 is drawn
    ratio, low, high = percentile_ratio(a, b)
    assert low < 1.5 < ratio <= high


@pytest.mark.parametrize("compare", [throughput_ratio, percentile_ratio])
def test_sides_must_have_as_many_slices(compare: object) -> None:
    with pytest.raises(ValueError, match="same number of slices"):
        if compare is throughput_ratio:
            throughput_ratio(_slices([1.0]), _slices([1.0, 2.0]))
        else:
            percentile_ratio([[1.0]], [[1.0], [2.0]])


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_balanced_order_follows_every_configuration_by_every_other_equally(n: int) -> None:
    labels = [chr(ord("a") + i) for i in range(n)]
    order = balanced_order(labels, 7)
    counts = {label: order.count(label) for label in labels}
    assert len(set(counts.values())) == 1 and counts["a"] >= 7
    pairs = Counter(zip(order, order[1:] + order[:1], strict=True))  # the sequence repeats: wrap around
    assert set(pairs) == {(x, y) for x in labels for y in labels if x != y}
    assert len(set(pairs.values())) == 1


def test_balanced_order_needs_two_configurations() -> None:
    with pytest.raises(ValueError, match="at least two"):
        balanced_order(["a"], 3)


def test_blocks_widen_the_interval_when_deployments_differ() -> None:
    # two blocks (deployments): in one, a is 20% faster than b; in the other, equal
    a = _slices([120.0] * 10 + [100.0] * 10)
    b = _slices([100.0] * 20)
    blocks = [0] * 10 + [1] * 10
    _, low, high = throughput_ratio(a, b)
    _, block_low, block_high = throughput_ratio(a, b, blocks=blocks)
    assert high - low < 0.1 < block_high - block_low  # one block's own ratio (1.0 or 1.2) can be drawn twice
    assert block_low == pytest.approx(1.0, abs=0.01) and block_high == pytest.approx(1.2, abs=0.01)


def test_blocks_must_name_every_slice() -> None:
    with pytest.raises(ValueError, match="block for each"):
        throughput_ratio(_slices([1.0, 2.0, 3.0]), _slices([1.0, 2.0, 3.0]), blocks=[0, 1])


def test_block_members_lists_each_blocks_slices_in_order() -> None:
    assert block_members([0, 0, 1, 1, 0]) == [[0, 1, 4], [2, 3]]
