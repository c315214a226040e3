"""The planner: the known optimum of a small synthetic pipeline, and plan files applied to a topology."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from flowserve.errors import FlowserveError
from flowserve.topology import load_topology
from flowserve.tuning.plan import Plan, apply_plan, load_plan, make_plan, save_plan, service_curves
from flowserve.tuning.search import cheaper_families, search
from flowserve.tuning.simulate import simulate
from flowserve.tuning.stages import StageConfig, StageOptions, cost, partitions_for, sim_stages
from flowserve.tuning.traces import generate

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"
PRICES = {"small": 1.0, "big": 2.5}


def _pipeline() -> list[StageOptions]:
    return [
        StageOptions("a", {"small": {1: 0.004, 8: 0.012}, "big": {1: 0.001, 8: 0.003}}, [(None, "x")]),
        StageOptions("b", {"small": {1: 0.010, 8: 0.030}, "big": {1: 0.003, 8: 0.008}}, [("a", "x")], output=True),
    ]


def test_planner_finds_the_brute_force_optimum() -> None:
    arrivals = generate("poisson", rate=300, seconds=8, seed=2).arrivals
    slo, hop = 0.060, 0.002
    options = _pipeline()
    config, result = search(options, arrivals, slo, prices=PRICES, hop_s=hop, seed=1)
    assert result.percentile(99) <= slo

    def p99(cfg: dict[str, StageConfig]) -> float:
        return simulate(sim_stages(options, cfg), arrivals, partitions=partitions_for(cfg), hop_s=hop,
                        jitter=0.05, seed=1).percentile(99)

    # every configuration in the planner's space, cheapest first: the first that meets the SLO is optimal
    choices = [StageConfig(k, b, c) for k in PRICES for b in (1, 2, 4, 8, 16, 32, 64) for c in (1, 2, 3, 4)]
    configs = sorted(({"a": a, "b": b} for a, b in itertools.product(choices, choices)),
                     key=lambda cfg: cost(cfg, PRICES))
    optimum = next(cfg for cfg in configs if p99(cfg) <= slo)
    assert cost(config, PRICES) == pytest.approx(cost(optimum, PRICES))


def test_a_stage_on_many_cheap_consumers_may_move_to_fewer_dearer_ones() -> None:
    # 10 small consumers cost 10; big ones cost 2.5 each, so up to 3 of them are cheaper: the search must
    # offer them (at every batch from the current one up), not only kinds cheaper than the stage's own
    options = _pipeline()[:1]
    families = cheaper_families(options, {"a": StageConfig("small", 1, 10)}, PRICES, 1000)
    assert ("a", "small", 1, 9) in families
    assert {(kind, most) for _, kind, _, most in families} == {("small", 9), ("big", 3)}
    assert sorted(b for _, kind, b, _ in families if kind == "big") == [1, 2, 4, 8, 16, 32, 64]
    # a dearer kind that cannot undercut the stage's cost is not offered
    assert {k for _, k, _, _ in cheaper_families(options, {"a": StageConfig("small", 1, 2)}, PRICES, 1000)} == {"small"}


def test_infeasible_slo_is_refused() -> None:
    arrivals = generate("poisson", rate=50, seconds=5, seed=2).arrivals
    with pytest.raises(FlowserveError, match="relax the SLO"):
        search(_pipeline(), arrivals, 0.001, prices=PRICES, hop_s=0.002)


def test_plan_for_a_topology_round_trips_and_applies(tmp_path: Path) -> None:
    topology = load_topology(TOPOLOGIES / "cascade-emulated.yaml")
    arrivals = generate("poisson", rate=100, seconds=10, seed=0).arrivals
    plan = make_plan(topology, arrivals, 150, hop_ms=5, overhead_ms=2)
    assert plan.predicted["p99_ms"] <= 150
    assert set(plan.stages) == set(topology.nodes)
    back = load_plan(save_plan(plan, tmp_path / "p.json"))
    assert back.stages == plan.stages and back.partitions == plan.partitions
    assert (back.hop_ms, back.overhead_ms) == (5, 2)
    assert back.envelope == plan.envelope and len(plan.envelope) >= 3  # what the tuner scales against
    # and the SLO's split: each stage's simulated p99 there, at least its batch's overhead
    assert set(back.predicted["stage_p99_ms"]) == set(topology.nodes)
    assert all(v >= 2 for v in back.predicted["stage_p99_ms"].values())
    planned = apply_plan(topology, back)
    assert planned.spec.partitions == plan.partitions
    expensive = planned.spec.nodes["expensive"]
    assert expensive.params["hardware"] == plan.stages["expensive"].hardware
    assert (expensive.replicas, expensive.max_batch) == (plan.stages["expensive"].consumers,
                                                         plan.stages["expensive"].max_batch)
    assert expensive.batching.policy == "lag"
    assert "hardware" not in planned.spec.nodes["final"].params  # Identity has no hardware to choose


def test_service_curves_pay_the_per_batch_overhead() -> None:
    plan = Plan("t", 100, 4, 2, {"a": StageConfig("big", 8, 2), "b": StageConfig("small", 1, 1)}, overhead_ms=1)
    curves = service_curves(_pipeline(), plan)
    assert curves["a"].rate == pytest.approx(2 * 8 / (0.003 + 0.001))  # two consumers, batches of 8 in 3 + 1 ms
    assert curves["b"].latency == pytest.approx(0.010 + 0.001)


def test_a_plan_for_another_topology_is_refused() -> None:
    topology = load_topology(TOPOLOGIES / "image-processing.yaml")
    plan = Plan("other", 100, 4, 2, {"pre": StageConfig("cpu", 1, 1)})
    with pytest.raises(FlowserveError, match="not 'image_processing'"):
        apply_plan(topology, plan)
