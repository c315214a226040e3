"""The tuner's controller: scale up at once when the envelope grows, down only after the hold."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from flowserve.errors import BrokerError, FlowserveError
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology.graph import load_topology
from flowserve.tuning.curves import TokenBucket
from flowserve.tuning.partitions import PartitionGrowth, check_growable
from flowserve.tuning.plan import Plan, planned_envelope
from flowserve.tuning.rules import StageTarget, needed_consumers, plan_excess, relative_consumers
from flowserve.tuning.scalers import LocalScaler
from flowserve.tuning.stages import StageConfig, StageOptions
from flowserve.tuning.targets import targets_from_plan
from flowserve.tuning.tuner import Action, Controller, apply_growth, tune

# a stage serving batches of 4 in 40 ms: 100 requests/s per consumer, 100 ms of the SLO
TARGET = StageTarget("m", batch=4, batch_s=0.04, slo_share_s=0.1, max_consumers=6)


def test_needed_consumers_from_the_delay_bound() -> None:
    # rate 150/s, burst 3: R >= 150 and R >= 3 / (0.1 - 0.04) = 50 -> 2 consumers of 100/s
    assert needed_consumers([TokenBucket(150, 3, 1.0)], TARGET)[0] == 2
    # a burst of 30 must drain within the 60 ms slack: R >= 500 -> 5 consumers of 100/s, but 5 on 6
    # partitions leave the busiest with 2 of them (167/s): 6
    c, why = needed_consumers([TokenBucket(10, 30, 0.04)], TARGET)
    assert c == 6 and "burst 30.0" in why
    assert needed_consumers([TokenBucket(5000, 1, 1.0)], TARGET)[0] == 6  # never beyond the partitions
    assert needed_consumers([], TARGET)[0] == 1


def _arrivals(rate: float, start: float, end: float) -> np.ndarray:
    return np.arange(start, end, 1.0 / rate)


def test_scales_up_at_once_and_down_after_the_hold() -> None:
    ctl = Controller([TARGET], hold_s=5, hysteresis=0.25, horizon_s=4, settle_s=1.5, rule="bound")
    ctl.observe(_arrivals(50, 0, 10))
    assert ctl.decide(10.0, {"m": 1}) == []
    ctl.observe(_arrivals(250, 10, 12))  # the rate steps up: 3 consumers needed, asked for at once
    (up,) = ctl.decide(12.0, {"m": 1})
    assert (up.before, up.after) == (1, 3) and "rate" in up.reason
    ctl.observe(_arrivals(250, 12, 14))
    assert ctl.decide(13.0, {"m": 1}) == []  # settling: the group is rebalancing (its pods not yet counted)
    assert ctl.decide(14.0, {"m": 3}) == []
    ctl.observe(_arrivals(50, 14, 30))  # and back down
    decisions = {t: ctl.decide(float(t), {"m": 3}) for t in range(15, 31)}
    first_down = min(t for t, acts in decisions.items() if acts)
    # the 4 s horizon still holds the spike until t=18; the hold then lasts 5 s
    assert first_down == 23
    (down,) = decisions[first_down]
    assert (down.before, down.after) == (3, 1) and "below for 5 s" in down.reason


def test_hysteresis_keeps_a_stage_that_is_just_enough() -> None:
    ctl = Controller([TARGET], hold_s=1, hysteresis=0.25, horizon_s=4, rule="bound")
    ctl.observe(_arrivals(180, 0, 20))  # 2 consumers do it; 1.25 x 180 = 225 would need 3
    for t in range(5, 21):
        assert ctl.decide(float(t), {"m": 2}) == []


def test_targets_share_the_slo_and_the_traffic() -> None:
    options = [
        StageOptions("cheap", {"k": {1: 0.01}}, [(None, "x")]),
        StageOptions("router", {"k": {1: 0.0}}, [("cheap", "x")], fractions={"sure_x": 0.7, "unsure_x": 0.3}),
        StageOptions("expensive", {"k": {1: 0.03}}, [("router", "unsure_x")]),
        StageOptions("final", {"k": {1: 0.0}}, [("router", "sure_x"), ("expensive", "x")], join="any", output=True),
    ]
    plan = Plan("t", 100.0, 8, 2.0, {o.id: StageConfig("k", 1, 1) for o in options})
    targets = {t.id: t for t in targets_from_plan(options, plan)}
    assert targets["expensive"].traffic_share == 0.3
    assert targets["final"].traffic_share == 1.0
    # what hops and batch times leave: half in equal parts, half in proportion to batch time
    slack = 0.1 - 0.002 * 5 - 0.04
    assert targets["expensive"].slo_share_s == pytest.approx(0.03 + slack / 2 / 4 + slack / 2 * 0.03 / 0.04)
    assert targets["router"].slo_share_s == pytest.approx(slack / 2 / 4)
    # one consumer's safe rate: below its full-batch throughput, and unlimited for a stage taking no time
    assert 0 < targets["expensive"].safe_rate < 1 / 0.03
    assert targets["router"].safe_rate == float("inf")
    assert targets["expensive"].max_consumers == 8


def test_a_plan_with_per_stage_p99s_splits_half_the_slo_in_their_proportions() -> None:
    # the plan's simulation found each stage's p99 (wait, batch and overhead): half the longest path's
    # budget (the SLO after its hops) goes in proportion to them, half as a plan without them splits it
    options = [
        StageOptions("split", {"k": {1: 0.01}}, [(None, "x")]),
        StageOptions("a", {"k": {1: 0.04}}, [("split", "x")]),
        StageOptions("b", {"k": {1: 0.02}}, [("split", "x")]),
        StageOptions("join", {"k": {1: 0.01}}, [("a", "x"), ("b", "x")], output=True),
    ]
    p99s = {"split": 15.0, "a": 45.0, "b": 70.0, "join": 10.0}  # b queues longest: it is the critical path
    plan = Plan("t", 200.0, 8, 2.0, {o.id: StageConfig("k", 1, 1) for o in options}, {"stage_p99_ms": p99s})
    shares = {t.id: t.slo_share_s for t in targets_from_plan(options, plan, profile=False)}
    budget = 0.2 - 0.002 * 4
    slack = budget - 0.06  # the even split's: the longest path by batch time is split, a, join

    def even(batch_s: float) -> float:
        return batch_s + slack / 2 / 3 + slack / 2 * batch_s / 0.06

    assert shares["b"] == pytest.approx((budget * 70 / 95 + even(0.02)) / 2)
    assert shares["a"] == pytest.approx((budget * 45 / 95 + even(0.04)) / 2)
    assert shares["split"] + shares["b"] + shares["join"] <= budget
    # a share never falls below the stage's own batch time (its p99s overfilled the SLO)
    tight = Plan("t", 30.0, 8, 2.0, plan.stages, {"stage_p99_ms": p99s})
    assert {t.id: t.slo_share_s for t in targets_from_plan(options, tight, profile=False)}["a"] == pytest.approx(0.04)
    # a plan without them (an older file) splits the slack evenly and by batch time, as before
    older = Plan("t", 200.0, 8, 2.0, plan.stages, {"stage_p99_ms": {"a": 45.0}})
    old_shares = {t.id: t.slo_share_s for t in targets_from_plan(options, older, profile=False)}
    assert old_shares["a"] == pytest.approx(even(0.04))


# the plan's trace: 64/s evenly (spacings and windows exact in binary), so a 0.25-s window held 16 arrivals
PLANNED = [(0.25, 16), (0.5, 32), (1.0, 64)]
PLANNED_TARGET = StageTarget("m", batch=4, batch_s=0.04, slo_share_s=0.1, max_consumers=12, consumers=2)


def test_relative_rule_scales_the_plans_consumers_by_how_far_live_exceeds_its_trace() -> None:
    # the plan's own traffic keeps the plan; twice the rate -> 4
    assert relative_consumers(plan_excess(_arrivals(64, 0, 5), PLANNED), PLANNED_TARGET)[0] == 2
    c, why = relative_consumers(plan_excess(_arrivals(128, 0, 5), PLANNED), PLANNED_TARGET)
    assert c == 4 and "x2.00 of the plan's 2" in why
    # a burst on a light stream: 48 arrivals within 0.19 s, so 52 in a 0.25-s window where the plan saw 16
    burst = np.sort(np.concatenate([_arrivals(16, 0, 5), 2.0 + np.arange(48) / 256]))
    c, why = relative_consumers(plan_excess(burst, PLANNED), PLANNED_TARGET)
    assert c == 7 and "window 0.25 s: 52 arrivals" in why  # 2 x 3.25, rounded up
    assert relative_consumers(plan_excess(_arrivals(2048, 0, 5), PLANNED), PLANNED_TARGET)[0] == 12  # the cap
    assert relative_consumers(plan_excess(np.zeros(0), PLANNED), PLANNED_TARGET)[0] == 1


def test_relative_rule_leaves_out_windows_too_small_to_count() -> None:
    planned = [(1 / 64, 1), (0.25, 16)]  # one arrival per 1/64-s window: 3 in one is noise, not 3x the traffic
    clumped = np.sort(np.concatenate([_arrivals(64, 0, 5), [1.0001, 1.0002]]))
    # from the 0.25-s window: 18 of 16
    assert relative_consumers(plan_excess(clumped, planned), PLANNED_TARGET)[0] == 3


def test_relative_controller_goes_to_the_need_in_one_step_and_back_after_the_hold() -> None:
    ctl = Controller([PLANNED_TARGET], hold_s=5, hysteresis=0.25, horizon_s=4, settle_s=1.5, rule="relative",
                     planned=PLANNED)
    ctl.observe(_arrivals(64, 0, 10))
    assert ctl.decide(10.0, {"m": 2}) == []
    ctl.observe(_arrivals(256, 10, 12))  # 4x the plan's rate: 8 consumers, in one action (one rebalance)
    (up,) = ctl.decide(12.0, {"m": 2})
    assert (up.before, up.after) == (2, 8)
    ctl.observe(_arrivals(64, 12, 30))
    decisions = {t: ctl.decide(float(t), {"m": 8}) for t in range(13, 31)}
    first_down = min(t for t, acts in decisions.items() if acts)
    assert first_down == 21  # the 4-s horizon holds the spike until t=16, then the 5-s hold
    (down,) = decisions[first_down]
    assert (down.before, down.after) == (8, 3)  # the plan's 2 with the hysteresis's 25%, rounded up


def test_plan_keeps_its_traces_envelope() -> None:
    arrivals = _arrivals(64, 0, 10)
    envelope = planned_envelope(arrivals, 1 / 16)
    assert [w for w, _ in envelope][:3] == [1 / 16, 1 / 8, 1 / 4]
    assert envelope[-1][0] == pytest.approx(arrivals[-1] / 2)  # up to half the trace
    assert dict(envelope)[0.25] == 16
    assert planned_envelope(arrivals[:1], 1 / 16) == []


def test_the_relative_rule_needs_a_plan_with_an_envelope() -> None:
    topology = load_topology(Path(__file__).resolve().parents[2] / "topologies" / "image-processing.yaml")
    plan = Plan(topology.name, 250.0, 4, 5.0, {n: StageConfig("cpu", 1, 1) for n in topology.nodes})
    kafka = KafkaSettings(bootstrap="127.0.0.1:1")  # refused before any connection
    with pytest.raises(FlowserveError, match="make it again with 'flowserve plan'"):
        asyncio.run(tune(topology, plan, kafka, LocalScaler(None), stop=asyncio.Event(),  # type: ignore[arg-type]
                         rule="relative"))
    with pytest.raises(FlowserveError, match="unknown tuner rule"):
        asyncio.run(tune(topology, plan, kafka, LocalScaler(None), stop=asyncio.Event(),  # type: ignore[arg-type]
                         rule="fastest"))


class _Growth(PartitionGrowth):
    """The growth's arithmetic without a broker (the live test grows real topics); ``refuse`` fails it."""

    def __init__(self, partitions: int, limit: int, refuse: bool = False) -> None:
        topology = load_topology(Path(__file__).resolve().parents[2] / "topologies" / "image-processing.yaml")
        super().__init__(topology, KafkaSettings(bootstrap="127.0.0.1:1"), partitions=partitions, limit=limit)
        self.refuse = refuse

    async def grow(self, consumers: int) -> int:
        if self.refuse:
            raise BrokerError("no CreatePartitions here")
        if consumers > self.partitions:
            self.partitions = self.target(consumers)
        return self.partitions


def _run_grow(growth: PartitionGrowth, before: int, after: int) -> tuple[Action | None, list[int], list[tuple]]:
    told: list[int] = []
    follows: list[tuple] = []
    scaler = LocalScaler(None)  # type: ignore[arg-type]

    async def grown(partitions: int) -> None:
        told.append(partitions)

    scaler.grown = grown  # type: ignore[method-assign]

    async def on_grow(a: int, b: int, action: Action) -> None:
        follows.append((a, b))

    action = asyncio.run(apply_growth(growth, Action("m", before, after, 0.0, "needs more"), scaler, on_grow))
    return action, told, follows


def test_a_scale_up_past_the_partitions_grows_them_at_least_doubling() -> None:
    action, told, follows = _run_grow(_Growth(partitions=2, limit=8), 2, 3)
    assert action is not None and (action.before, action.after) == (2, 3)
    assert told == [4] and follows == [(2, 4)]  # doubled: each growth rebalances every stage
    action, told, _ = _run_grow(_Growth(partitions=2, limit=8), 2, 7)
    assert action is not None and action.after == 7 and told == [7]


def test_growth_stops_at_the_limit_and_the_action_is_capped() -> None:
    action, told, _ = _run_grow(_Growth(partitions=2, limit=3), 1, 5)
    assert action is not None and action.after == 3 and "capped at 3 partitions" in action.reason
    assert told == [3]
    action, told, _ = _run_grow(_Growth(partitions=3, limit=3), 3, 5)
    assert action is None and told == []  # nothing left to take


def test_a_broker_that_refuses_growth_keeps_the_stages_within_the_partitions() -> None:
    growth = _Growth(partitions=2, limit=8, refuse=True)
    action, told, follows = _run_grow(growth, 1, 4)
    assert action is not None and action.after == 2 and told == [] and follows == []
    assert growth.limit == 2  # and it stops asking
    action, _, _ = _run_grow(growth, 2, 4)
    assert action is None


def test_a_topology_with_parity_groups_cannot_grow() -> None:
    topology = load_topology(Path(__file__).resolve().parents[2] / "topologies" / "digits-parity.yaml")
    with pytest.raises(FlowserveError, match="parity groups"):
        check_growable(topology)


def test_parallel_branches_share_the_slo_instead_of_adding_to_it() -> None:
    # a fan-out to two 40-ms branches and a join: a request crosses three stages, not four
    options = [
        StageOptions("split", {"k": {1: 0.01}}, [(None, "x")]),
        StageOptions("a", {"k": {1: 0.04}}, [("split", "x")]),
        StageOptions("b", {"k": {1: 0.04}}, [("split", "x")]),
        StageOptions("join", {"k": {1: 0.01}}, [("a", "x"), ("b", "x")], output=True),
    ]
    plan = Plan("t", 100.0, 8, 2.0, {o.id: StageConfig("k", 1, 1) for o in options})
    targets = {t.id: t for t in targets_from_plan(options, plan, profile=False)}
    slack = 0.1 - 0.002 * 4 - 0.06  # three stages on the longest path, four hops
    assert targets["a"].slo_share_s == pytest.approx(0.04 + slack / 2 / 3 + slack / 2 * 0.04 / 0.06)


def test_one_consumer_is_safe_at_the_rate_the_plan_carried_whatever_its_share() -> None:
    # a slow stage on the longest path leaves a fast one (7 ms a batch, whatever its size) a share too small
    # to wait for a batch in progress; the plan's trace showed one consumer of it carrying 1,000/s within it
    options = [StageOptions("slow", {"k": {64: 0.226}}, [(None, "x")]),
               StageOptions("fast", {"k": {1: 0.007, 64: 0.008}}, [("slow", "x")], output=True)]
    stages = {"slow": StageConfig("k", 64, 3), "fast": StageConfig("k", 64, 1)}
    envelope = [(0.5, 600), (1.0, 1000), (2.0, 1800)]  # the busiest window of >= 1 s: 1,000/s
    plan = Plan("t", 250.0, 8, 5.0, stages, envelope=envelope)
    alone = {t.id: t.safe_rate for t in targets_from_plan(options, Plan("t", 250.0, 8, 5.0, stages))}
    carried = {t.id: t.safe_rate for t in targets_from_plan(options, plan)}
    assert alone["fast"] < 1000.0
    assert carried["fast"] == pytest.approx(1000.0)
    # the slow stage's 3 consumers on 8 partitions: the busiest of them held 3 partitions, 3/8 of 1,000/s
    assert carried["slow"] == pytest.approx(max(alone["slow"], 1000.0 * 3 / 8))
