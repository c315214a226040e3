"""The planner's bound pruning and its lifted consumer cap; the stage-by-stage simulator on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from flowserve.tuning import simulate as sim
from flowserve.tuning.bounds import Bounds
from flowserve.tuning.plan import required_stages
from flowserve.tuning.search import MAX_CONSUMERS, search
from flowserve.tuning.simulate import SimStage, simulate
from flowserve.tuning.stages import StageConfig, StageOptions, partitions_for, sim_stages
from flowserve.tuning.traces import generate

PRICES = {"small": 1.0, "big": 2.5}


def _two_stages() -> list[StageOptions]:
    return [
        StageOptions("a", {"small": {1: 0.004, 8: 0.012}, "big": {1: 0.001, 8: 0.003}}, [(None, "x")]),
        StageOptions("b", {"small": {1: 0.010, 8: 0.030}, "big": {1: 0.003, 8: 0.008}}, [("a", "x")], output=True),
    ]


def _fan_out_join() -> list[StageOptions]:
    return [
        StageOptions("detect", {"small": {1: 0.006, 8: 0.020}, "big": {1: 0.002, 8: 0.006}}, [(None, "x")]),
        StageOptions("left", {"small": {1: 0.003, 8: 0.010}}, [("detect", "x")]),
        StageOptions("right", {"small": {1: 0.005, 8: 0.015}, "big": {1: 0.002, 8: 0.004}}, [("detect", "x")]),
        StageOptions("join", {"small": {1: 1e-5}}, [("left", "x"), ("right", "x")], output=True),
    ]


def test_the_same_plan_with_and_without_bound_pruning() -> None:
    ruled_out = 0
    for options, rate, slo in [(_two_stages, 300, 0.060), (_two_stages, 1500, 0.040), (_fan_out_join, 600, 0.060)]:
        arrivals = generate("poisson", rate=rate, seconds=6, seed=3).arrivals
        with_bounds: dict[str, int] = {}
        without: dict[str, int] = {}
        pruned = search(options(), arrivals, slo, prices=PRICES, hop_s=0.002, overhead_s=0.001, seed=1,
                        counts=with_bounds)
        plain = search(options(), arrivals, slo, prices=PRICES, hop_s=0.002, overhead_s=0.001, seed=1,
                       prune=False, counts=without)
        assert pruned[0] == plain[0], (options.__name__, rate)
        assert pruned[1].percentile(99) == plain[1].percentile(99) <= slo
        assert without["pruned"] == 0 and with_bounds["simulated"] <= without["simulated"]
        ruled_out += with_bounds["pruned"]
    assert ruled_out > 0  # the bounds did answer some probes


def test_what_the_bounds_rule_out_the_simulation_refuses_too() -> None:
    options = _two_stages()
    arrivals = generate("gamma", rate=800, seconds=6, seed=4, cv=2).arrivals
    slo = 0.050
    bounds = Bounds(options, arrivals, slo, percentile=99, hop_s=0.002, overhead_s=0.001, jitter=0.05, seed=1)
    checked = 0
    for kind in PRICES:
        for batch in (1, 8, 64):
            fewest = bounds.fewest("b", kind, batch)
            if fewest > 1:
                config = {"a": StageConfig("big", 64, 8), "b": StageConfig(kind, batch, fewest - 1)}
                result = simulate(sim_stages(options, config), arrivals, partitions=partitions_for(config),
                                  hop_s=0.002, overhead_s=0.001, seed=1)
                assert result.percentile(99) > slo
                checked += 1
    assert checked >= 3


def test_the_planner_scales_a_stage_past_32_consumers() -> None:
    # 10 ms an item whatever the batch: 4,000 req/s need about 40 consumers
    options = [StageOptions("m", {"small": {1: 0.010, 64: 0.640}}, [(None, "x")], output=True)]
    arrivals = generate("poisson", rate=4000, seconds=2, seed=5).arrivals
    counts: dict[str, int] = {}
    config, result = search(options, arrivals, 0.100, prices=PRICES, hop_s=0.001, counts=counts)
    assert 32 < config["m"].consumers <= MAX_CONSUMERS
    assert result.percentile(99) <= 0.100
    assert counts["simulated"] < 60  # bisected, not one consumer at a time


def test_required_stages_leave_out_a_routed_branch() -> None:
    options = [
        StageOptions("cheap", {"small": {1: 0.001}}, [(None, "x")]),
        StageOptions("router", {"small": {1: 1e-6}}, [("cheap", "x")], fractions={"sure": 0.7, "unsure": 0.3}),
        StageOptions("expensive", {"small": {1: 0.01}}, [("router", "unsure")]),
        StageOptions("final", {"small": {1: 1e-6}}, [("router", "sure"), ("expensive", "x")], join="any",
                     output=True),
    ]
    assert required_stages(options) == {"cheap", "router", "final"}
    assert required_stages(_fan_out_join()) == {"detect", "left", "right", "join"}


# -- the simulator, by hand ----------------------------------------------------------------------------

def _one(consumers: int = 1, max_batch: int = 1, table: dict[int, float] | None = None) -> SimStage:
    return SimStage("m", table or {1: 0.01}, inputs=[(None, "x")], consumers=consumers, max_batch=max_batch,
                    output=True)


def _latencies(stages: list[SimStage], arrivals: list[float], partitions: int, hop_s: float = 0.0) -> list[float]:
    return np.round(simulate(stages, arrivals, partitions=partitions, hop_s=hop_s, jitter=0.0).latency_s, 6).tolist()


def test_a_freed_consumer_batches_what_queued_and_an_idle_one_serves_at_once() -> None:
    # 0 alone (0-10 ms); 1 and 2 queued by 10 ms go together (10-22 ms); 3 finds it idle (30-40 ms)
    stage = _one(max_batch=2, table={1: 0.010, 2: 0.012})
    assert _latencies([stage], [0.0, 0.002, 0.004, 0.030], 1) == [0.01, 0.02, 0.018, 0.01]


def test_partitions_spread_over_consumers_like_the_range_assignor() -> None:
    # 4 partitions over 3 consumers: [0, 0, 1, 2]; request i is on partition i % 4, all at t = 0
    assert _latencies([_one(consumers=3)], [0.0] * 8, 4) == [0.01, 0.02, 0.01, 0.01, 0.03, 0.04, 0.02, 0.02]
    # more consumers than partitions: the extra ones sit idle
    assert _latencies([_one(consumers=4)], [0.0] * 4, 2) == [0.01, 0.01, 0.02, 0.02]


def test_stages_in_series_pay_each_hop() -> None:
    stages = [SimStage("a", {1: 0.010}, inputs=[(None, "x")]),
              SimStage("b", {1: 0.005}, inputs=[("a", "x")], output=True)]
    assert _latencies(stages, [0.0, 0.001], 1, hop_s=0.001) == [0.018, 0.027]  # 1+10+1+5+1; then waits on a


def test_an_any_join_takes_the_first_input_and_drops_the_later() -> None:
    stages = [SimStage("a", {1: 0.001}, inputs=[(None, "x")]),
              SimStage("fast", {1: 0.001}, inputs=[("a", "x")]),
              SimStage("slow", {1: 0.005}, inputs=[("a", "x")]),
              SimStage("final", {1: 0.001}, inputs=[("fast", "x"), ("slow", "x")], join="any", output=True)]
    result = simulate(stages, [0.0], partitions=1, hop_s=0.0, jitter=0.0)
    assert result.latency_s[0] == pytest.approx(0.003)
    assert result.stages["final"].batches == 1


def test_stages_listed_out_of_order_are_simulated_in_topological_order() -> None:
    stages = [SimStage("b", {1: 0.005}, inputs=[("a", "x")], output=True),
              SimStage("a", {1: 0.010}, inputs=[(None, "x")])]
    assert _latencies(stages, [0.0], 1) == [0.015]


@pytest.mark.skipif(not sim.compiled(), reason="numba is not installed: the kernel runs as Python already")
def test_the_compiled_kernel_matches_its_python_source() -> None:
    rng = np.random.default_rng(7)
    n = 400
    reach = np.sort(rng.random(n)) + np.where(rng.random(n) < 0.1, np.inf, 0.0)
    owner = rng.integers(0, 3, n)
    times = np.array([0.0, 0.004, 0.005, 0.006, 0.007])
    factors, overheads = rng.gamma(4.0, 0.25, n), np.full(n, 0.001)
    args = (reach, np.argsort(reach, kind="stable"), owner, 3, times, factors, overheads)
    compiled, python = sim.kernel()(*args), sim._serve(*args)
    np.testing.assert_array_equal(compiled[0], python[0])
    np.testing.assert_array_equal(compiled[1], python[1])
    assert compiled[2:] == pytest.approx(python[2:])
