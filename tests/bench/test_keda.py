"""The KEDA + HPA baseline of ``flowserve bench tuner`` (flowserve_bench.keda): replicas against sequences
computed by hand from KEDA's and the HPA's rules, the lagThreshold derivation it shares with ``flowserve
deploy render`` (flowserve.deploy.keda), and the bench's targets on rows whose answers are known."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from flowserve.deploy import keda as deploy_keda
from flowserve.deploy.keda import DEFAULT_LAG_THRESHOLD, lag_threshold, lag_thresholds, path_stages, slo_shares
from flowserve.errors import FlowserveError
from flowserve.topology.graph import load_topology, load_topology_text
from flowserve.tuning.plan import Plan
from flowserve.tuning.stages import StageConfig
from flowserve_bench import keda as bench_keda
from flowserve_bench.keda import PRESETS, KedaAutoscaler, autoscalers, preset
from flowserve_bench.tuner_report import tuner_targets

ROOT = Path(__file__).parents[2]
IDENTITY = "component: flowserve.builtin:Identity, params: {ports: {x: {datatype: FP32, shape: [-1, 4]}}}"


def _hpa(name: str = "keda", **kw: int) -> KedaAutoscaler:
    args = {"replicas": 2, "min_replicas": 2, "max_replicas": 8, "lag_threshold": 10, "partitions": 8} | kw
    return KedaAutoscaler(PRESETS[name], **args)


def _run(hpa: KedaAutoscaler, lags: list[int]) -> list[int]:
    """One HPA sync every 15 s from t=0 with these lags; the replicas after each."""
    return [hpa.sync(15.0 * i, [lag]) for i, lag in enumerate(lags)]


# A step of lag: quiet, a little (+25% over target), inside the tolerance, a burst, then quiet for 5 minutes.
STEP = [0, 25, 31, 200, 200] + [0] * 21


def test_keda_defaults_follow_a_step_as_computed_by_hand() -> None:
    replicas = _run(_hpa(), STEP)
    # t=0: lag 0 proposes 0, but the HPA's first recommendation is the 2 replicas it found: stays at the floor.
    # t=15: 25 / (10 x 2) = 1.25 is outside the 10% tolerance: ceil(25 / 10) = 3.
    # t=30: 31 / (10 x 3) = 1.03 is inside it: stays at 3.
    # t=45: 200 // 10 = 20 > 8 partitions, so KEDA serves 8 x 10 = 80: proposes 8, but one 15-s period
    #       allows at most max(3 x 2, 3 + 4) = 7.  t=60: 8 (max(14, 11), then maxReplicaCount 8).
    # From t=75 the lag is 0, but the scale-down window holds the 8s recommended at t=45 and t=60 until
    # the window (300 s, recommendations strictly newer than now - 300) no longer reaches t=60: at t=360.
    assert replicas[:5] == [2, 3, 3, 7, 8]
    assert replicas[5:24] == [8] * 19  # t=75 .. t=345
    assert replicas[24:] == [2, 2]  # t=360: down to minReplicaCount (100% per 15 s allows it), never below


def test_keda_tuned_scales_down_after_its_60_s_window() -> None:
    replicas = _run(_hpa("keda-tuned"), STEP)
    assert replicas[:8] == [2, 3, 3, 7, 8, 8, 8, 8]  # t=105: the window (45, 105] still holds t=60's 8
    assert replicas[8:] == [2] * 18  # t=120


def test_the_floor_is_the_plans_replicas() -> None:
    """The strawman this replaces dropped a 3-consumer plan to ceil(lag / threshold) = 1 at its first poll."""
    hpa = _hpa(replicas=3, min_replicas=3)
    assert _run(hpa, [0] * 40) == [3] * 40
    with pytest.raises(FlowserveError, match="scale to zero is not modelled") as err:
        _hpa(min_replicas=0)
    assert err.value.kind == "invalid_input"


def test_scale_up_is_limited_per_period_and_by_the_partitions() -> None:
    hpa = _hpa(replicas=1, min_replicas=1, max_replicas=100, partitions=30)
    # lag 1000 // 10 = 100 > 30 partitions: KEDA caps the metric at 300, so the HPA wants 30;
    # per 15 s: 1 -> max(2, 5) = 5 -> max(10, 9) = 10 -> 20 -> 30
    assert _run(hpa, [1000] * 5) == [5, 10, 20, 30, 30]
    idle = KedaAutoscaler(preset("keda", allow_idle_consumers=True), replicas=1, min_replicas=1, max_replicas=50,
                          lag_threshold=10, partitions=30)
    assert _run(idle, [1000] * 5) == [5, 10, 20, 40, 50]  # uncapped metric: up to maxReplicaCount


def test_several_triggers_take_the_largest_proposal_and_a_cached_metric_is_stale() -> None:
    hpa = _hpa()
    assert hpa.sync(0, [0, 0]) == 2
    assert hpa.sync(15, [30, 50]) == 5  # proposals 3 and 5
    cached = KedaAutoscaler(preset("keda", use_cached_metrics=True), replicas=2, min_replicas=2, max_replicas=8,
                            lag_threshold=10, partitions=8)
    # pollingInterval 30 s: the HPA's sync at t=15 sees the lag KEDA read at t=0
    assert [cached.sync(t, [lag]) for t, lag in [(0, 0), (15, 60), (30, 60)]] == [2, 2, 6]
    assert cached.next_sync_s == 45


def test_status_replicas_still_starting_enter_the_ratio() -> None:
    hpa = _hpa(replicas=4, min_replicas=2)
    # spec 4, ready 2: 42 / (10 x 2) = 2.1 is outside the tolerance: ceil(4.2) = 5
    assert hpa.sync(0, [42], ready=2) == 5


# ---------------------------------------------------------------- the lagThreshold derivation


def test_lag_threshold_is_what_one_consumer_drains_within_its_share() -> None:
    assert lag_threshold(40.0, 0.25) == 10
    assert lag_threshold(26.9, 0.3) == 8  # floor(8.07)
    assert lag_threshold(0.5, 0.3) == 1  # never 0: the HPA divides by it
    assert lag_threshold(50.0, 0.6 / 3) == 10  # 0.6 / 3 is 0.19999...: not 9
    with pytest.raises(FlowserveError, match="positive throughput"):
        lag_threshold(0.0, 0.3)


def test_the_slo_is_shared_over_the_longest_path_through_each_node() -> None:
    topology = load_topology_text(f"""
name: paths
nodes:
  a: {{{IDENTITY}, inputs: {{x: input.x}}}}
  b: {{{IDENTITY}, inputs: {{x: input.x}}}}
  c: {{{IDENTITY}, inputs: {{x: b.x}}}}
outputs: {{a: a.x, c: c.x}}
""")
    # two outputs: a collecting stage joins them, and a request queues there too
    assert path_stages(topology) == {"a": 2, "b": 3, "c": 3, "outputs": 3}
    assert slo_shares(topology, 0.6) == pytest.approx({"a": 0.3, "b": 0.2, "c": 0.2, "outputs": 0.2})
    ensemble = load_topology(ROOT / "topologies" / "ensemble.yaml")
    # pre, mlp|cnn, *_probs, avg, post and the stage collecting post's and avg's outputs
    assert set(path_stages(ensemble).values()) == {6}
    assert lag_thresholds(topology, 0.6, {"a": 10.0, "b": None}) == {
        "a": 3, "b": DEFAULT_LAG_THRESHOLD, "c": DEFAULT_LAG_THRESHOLD, "outputs": DEFAULT_LAG_THRESHOLD}
    with pytest.raises(FlowserveError, match="slo_ms") as err:
        lag_thresholds(topology, None, {"a": 10.0})
    assert err.value.kind == "invalid_input"


def test_the_bench_sets_each_stage_as_render_would_from_the_plan() -> None:
    topology = load_topology(ROOT / "topologies" / "image-processing.yaml")
    # preprocess on cpu at batch 1 takes 0.8 ms (flowserve.runtime.hardware), plus the plan's 9.2 ms per batch
    plan = Plan(topology.name, 600.0, 8, 15.0, {"pre": StageConfig("cpu", 1, 3), "classify": StageConfig("cpu", 8, 2)},
                overhead_ms=9.2)
    hpas = autoscalers(topology, plan, PRESETS["keda"])
    pre = hpas["pre"]
    assert (pre.replicas, pre.min_replicas, pre.max_replicas, pre.partitions) == (3, 3, 8, 8)
    assert pre.lag_threshold == 30  # 1 / (0.8 + 9.2 ms) = 100 records/s x 0.3 s (600 ms over 2 stages)
    assert hpas["classify"].min_replicas == 2
    rates = bench_keda.consumer_throughput(topology, plan)
    assert hpas["classify"].lag_threshold == lag_threshold(rates["classify"], 0.3)


def test_the_modules_examples_run() -> None:
    for module in (bench_keda, deploy_keda):
        assert doctest.testmod(module).failed == 0


# ---------------------------------------------------------------- the bench's targets


def _rows(misses: dict[str, int], attainment: float = 0.999, tuner_cost: float = 0.5) -> list[dict[str, object]]:
    return [{"trace": t, "contender": c, "misses": misses[c], "attainment": attainment if c == "tuner" else 0.9,
             "cost_dollars": tuner_cost if c == "tuner" else 1.0}
            for t in ("steady", "step", "bursty", "diurnal") for c in ("static", "keda", "tuner")]


def test_targets_pass_a_good_run_and_fail_a_bad_one() -> None:
    good = tuner_targets(_rows({"static": 50, "keda": 100, "tuner": 5}), [])
    assert good == {"tuner_attainment_ge_99pct_every_trace": True,
                    "tuner_cost_le_0.6x_static_on_step_and_diurnal": True, "tuner_misses_le_fifth_of_keda": True}
    # 4 traces x 30 misses = 120 > 400 / 5
    assert not tuner_targets(_rows({"static": 50, "keda": 100, "tuner": 30}), [])["tuner_misses_le_fifth_of_keda"]
    late = tuner_targets(_rows({"static": 0, "keda": 0, "tuner": 0}, attainment=0.98, tuner_cost=0.7), [])
    assert late["tuner_attainment_ge_99pct_every_trace"] is False
    assert late["tuner_cost_le_0.6x_static_on_step_and_diurnal"] is False
    sims = [{"pipeline": "a", "p99_ratio": 1.1}, {"pipeline": "b", "error": "no plan"}]
    assert tuner_targets([], sims) == {"simulator_p99_within_15pct_of_live": False}


def test_a_simulated_twin_far_from_its_live_run_fails_fidelity() -> None:
    rows = _rows({"static": 50, "keda": 100, "tuner": 5})
    tuner = next(r for r in rows if r["contender"] == "tuner")
    tuner.update(sim_attainment=tuner["attainment"] - 0.01, sim_cost_dollars=tuner["cost_dollars"] * 1.1)
    assert tuner_targets(rows, [])["simulated_tuned_runs_within_2pts_and_15pct_cost"]
    tuner.update(sim_cost_dollars=tuner["cost_dollars"] * 1.2)  # 20% off the live cost
    assert not tuner_targets(rows, [])["simulated_tuned_runs_within_2pts_and_15pct_cost"]
