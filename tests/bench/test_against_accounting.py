"""The accounting of ``flowserve bench gateway --against``: fake slices whose answers are known go in, the
figures and targets that come out are checked. No server and no broker: the bench itself runs end to end
in tests/bench/test_against.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from flowserve.bench.against import FS, OTHER, arrivals, comparison_row, measure_load, targets
from flowserve.bench.load import poisson_slice
from flowserve.bench.paired import Slice


def _slice(requests: int, seconds: float = 2.0, latency_ms: float = 5.0) -> Slice:
    return Slice(requests, seconds, [latency_ms] * requests)


def _row(fs: list[Slice], other: list[Slice]) -> dict[str, Any]:
    return comparison_row("c8", {FS: fs, OTHER: other}, {FS: 0, OTHER: 0}, {FS: {}, OTHER: {}})


def test_equal_sides_have_ratio_one() -> None:
    row = _row([_slice(200)] * 4, [_slice(200)] * 4)
    assert row["throughput_ratio"] == [1.0, 1.0, 1.0]
    assert row["paired_slices"] == 4


def test_an_empty_slice_drags_the_ratio_down_instead_of_vanishing() -> None:
    # flowserve answered nothing in one of four slices (a stall); the other side answered in all four
    row = _row([_slice(200), _slice(0), _slice(200), _slice(200)], [_slice(200)] * 4)
    ratio, low, high = row["throughput_ratio"]
    assert ratio == pytest.approx(0.75)
    assert low < 1.0 and high <= 1.0
    assert row["paired_slices"] == 4
    assert row[FS]["empty_slices"] == 1 and row[OTHER]["empty_slices"] == 0
    assert row[FS]["throughput_rps"] == pytest.approx(75.0)


def test_an_empty_slice_on_the_other_side_raises_the_ratio() -> None:
    row = _row([_slice(200)] * 4, [_slice(200), _slice(200), _slice(0), _slice(200)])
    assert row["throughput_ratio"][0] == round(4 / 3, 3)


def test_a_side_that_answered_nothing_at_all_has_no_bounded_ratio() -> None:
    row = _row([_slice(200)] * 2, [_slice(0)] * 2)
    assert row["throughput_ratio"] == [None, None, None]  # flowserve / 0: unbounded, written as null
    assert row[OTHER]["throughput_rps"] == 0.0


def _runs(ratio: list[float | None], p99: list[float | None]) -> dict[str, list[dict[str, Any]]]:
    loads = [{"load": f"c{c}", "throughput_ratio": ratio, "p99_ratio": p99} for c in (1, 8, 32, 128)]
    return {kind: [{"topology": "digits-fused", "loads": loads}, {"topology": "digits", "loads": loads}]
            for kind in ("embedded", "kafka")}


def test_targets_read_the_conservative_end_of_each_interval() -> None:
    met = targets(_runs([1.3, 1.05, 1.6], [0.9, 0.7, 1.4]))
    assert all(met.values()), met
    # the point estimates still pass, the intervals do not: throughput's low end under 1, p99's high end over 1.5
    missed = targets(_runs([1.3, 0.95, 1.6], [0.9, 0.7, 1.6]))
    assert not any(missed.values()), missed


def test_a_stall_fails_the_throughput_target() -> None:
    stalled = _row([_slice(300), _slice(0), _slice(300), _slice(300)], [_slice(200)] * 4)  # 1.125x on the point
    met = targets(_runs(stalled["throughput_ratio"], [1.0, 1.0, 1.0]))
    assert not met["fused_ge_1x_mlserver_all_levels_both_brokers"]
    assert not targets(_runs([1.3, None, 1.6], [1.0, 1.0, 1.0]))["three_stage_ge_1x_at_32_and_up"]


def _dues(rng: np.random.Generator, rate: float, seconds: float) -> list[float]:
    """The arrival times ``poisson_slice`` draws from ``rng`` (its loop, without sending anything)."""
    due, out = 0.0, []
    while (due := due + float(rng.exponential(1.0 / rate))) < seconds:
        out.append(due)
    return out


async def test_both_sides_of_a_pair_get_the_same_arrival_times() -> None:
    turns: list[tuple[str, list[float]]] = []  # (side, its arrival times), in the order the slices ran

    async def drive(side: str, seconds: float, rng: np.random.Generator) -> tuple[Slice, int]:
        turns.append((side, _dues(rng, 100.0, seconds)))
        return _slice(len(turns[-1][1])), 0

    comparison = await measure_load("poisson100", 3, drive, rounds=4, slice_s=1.0, cpu=dict)
    assert [side for side, _ in turns] == [FS, OTHER, OTHER, FS, FS, OTHER, OTHER, FS]
    pairs = [(turns[2 * k][1], turns[2 * k + 1][1]) for k in range(4)]
    for first, second in pairs:
        assert first == second and len(first) > 50
    assert pairs[0][0] != pairs[1][0]  # pairs differ from one another
    assert [len(comparison.slices[s]) for s in (FS, OTHER)] == [4, 4]


class _Counting:
    """A fake V2 target that answers every call at once and counts them."""

    def __init__(self) -> None:
        self.calls = 0

    async def call(self, body: bytes) -> bool:
        self.calls += 1
        return True


async def test_the_load_generator_replays_a_pairs_arrivals_on_each_side() -> None:
    sides = [_Counting(), _Counting()]
    for side in sides:
        piece, errors = await poisson_slice(side, [b"{}"], 4000.0, 0.05, arrivals(0, 2))  # type: ignore[arg-type]
        assert errors == 0 and piece.requests == side.calls
    assert sides[0].calls == sides[1].calls == len(_dues(arrivals(0, 2), 4000.0, 0.05))
