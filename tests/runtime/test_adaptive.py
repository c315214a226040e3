"""The adaptive (SLO) policy under load, on a fake clock: backlogs batch up to the node's maximum, the
doomed are dropped early (Clockwork), and nothing that can still make its deadline is dropped."""

from __future__ import annotations

import pytest

from flowserve.runtime.batching import FixedPolicy, Plan, SLOPolicy, make_policy
from flowserve.runtime.budget import Budget
from flowserve.runtime.profiles import ExecProfile
from flowserve.topology.graph import load_topology_text

NOW = 1_700_000_000_000.0  # the fake clock, epoch ms
EXACT = Budget(share=1.0, reserve_s=0.0, downstream_s=0.0)
#: batching pays: a batch of b takes 1 + b / 8 ms (p99 = p50), so 256 cost 33 ms, 0.13 ms a request
CHEAP = ExecProfile({1: 0.001125, 8: 0.002, 32: 0.005, 256: 0.033})

NODE = """
name: adaptive
nodes:
  m: {component: fs_testkit:AddOne, inputs: {x: input.x}}
outputs: {y: m.x}
"""


def test_the_node_maximum_is_the_component_capability_not_a_fixed_cap() -> None:
    policy = make_policy(load_topology_text(NODE), "m", CHEAP)
    assert isinstance(policy, SLOPolicy) and policy.max_batch == 1024  # AddOne declares no max: Component's


def test_a_backlog_is_worked_off_in_batches_up_to_the_node_maximum() -> None:
    policy = SLOPolicy(max_batch=256, profile=CHEAP, budget=EXACT)
    assert policy.plan([NOW + 10_000] * 1000, NOW) == Plan(take=256)
    # a backlog whose head could be saved by a small batch: two full batches queued -> a full batch
    queue = [NOW + 4.0] * 8 + [NOW + 200.0] * 600
    plan = policy.plan(queue, NOW)
    assert plan.take == 256 and not plan.refuse and not plan.doomed


def test_a_doomed_request_is_dropped_early_and_one_that_can_make_it_is_kept() -> None:
    """The 40th request behind 39 others: at best in a batch of 40 (6 ms). Due in 5.9 ms it is doomed
    (answered now with a deadline error, not refused: alone it would make it); due in 6 ms it is kept."""
    policy = SLOPolicy(max_batch=256, profile=CHEAP, budget=EXACT)
    finish_40 = CHEAP.p50(40)
    assert finish_40 is not None and finish_40 * 1000 == pytest.approx(6.0)
    queue = [NOW + 100.0] * 39 + [NOW + 5.9]
    plan = policy.plan(queue, NOW)
    assert (plan.take, plan.refuse, list(plan.doomed)) == (39, {}, [39])
    assert "39 requests ahead" in plan.doomed[39] and "5.9 ms left" in plan.doomed[39]
    kept = policy.plan([NOW + 100.0] * 39 + [NOW + 6.0], NOW)
    assert not kept.doomed and not kept.refuse and kept.take == 40


def test_dropped_requests_do_not_count_as_queue_ahead() -> None:
    """Only the requests kept are work ahead: a doomed request frees its place for the ones behind it."""
    policy = SLOPolicy(max_batch=4, profile=ExecProfile({1: 0.010, 4: 0.010}), budget=EXACT)
    # batches of 4 take 10 ms. 8 due in 25 ms fill two batches; the 4 behind them (due in 25 ms) are doomed;
    # the 4 after those are due in 30 ms and make it as the third batch, with the doomed set aside
    queue = [NOW + 25] * 8 + [NOW + 25] * 4 + [NOW + 30] * 4
    plan = policy.plan(queue, NOW)
    assert sorted(plan.doomed) == [8, 9, 10, 11] and plan.take == 4 and not plan.refuse


def test_the_doomed_are_judged_with_the_downstream_path_and_hops() -> None:
    budget = Budget(share=0.5, reserve_s=0.002, downstream_s=0.003)
    policy = SLOPolicy(max_batch=4, profile=ExecProfile({1: 0.010, 4: 0.010}), budget=budget)
    # the 5th request ends here at 20 ms at best, then 5 ms of hops and downstream: due in 24.9 ms it is doomed
    plan = policy.plan([NOW + 1000] * 4 + [NOW + 24.9, NOW + 25.1], NOW)
    assert list(plan.doomed) == [4] and "+ 5.0 ms downstream" in plan.doomed[4]


def _serve(policy: SLOPolicy | FixedPolicy, arrivals: list[tuple[float, float]], profile: ExecProfile) -> int:
    """Deadlines met when one worker runs ``policy`` over ``arrivals`` ((arrival ms, deadline ms), sorted),
    each batch taking its profiled p50 on the fake clock (doomed and refused requests count as missed)."""
    clock, met, pos, queue = arrivals[0][0], 0, 0, []
    while pos < len(arrivals) or queue:
        while pos < len(arrivals) and arrivals[pos][0] <= clock:
            queue.append(arrivals[pos][1])
            pos += 1
        if not queue:
            clock = arrivals[pos][0]
            continue
        queue = [d for d in queue if d >= clock]  # expired before their turn (the worker's check)
        if not queue:
            continue
        plan = policy.plan(queue, clock)
        gone = set(plan.refuse) | set(getattr(plan, "doomed", {}))
        queue = [d for i, d in enumerate(queue) if i not in gone]
        batch, queue = queue[:plan.take], queue[plan.take:]
        if batch:
            clock += (profile.p50(len(batch)) or 0.0) * 1000
            met += sum(d >= clock for d in batch)
    return met


def test_over_a_burst_the_adaptive_policy_meets_at_least_as_many_deadlines_as_static_batches() -> None:
    """A burst of 2,000 requests over 100 ms with a 60 ms SLO, then a quiet tail: a static batch of 32
    works through requests that can no longer make it; the adaptive policy drops those and batches larger."""
    arrivals = [(NOW + i * 0.05, NOW + i * 0.05 + 60) for i in range(2000)]
    arrivals += [(NOW + 100 + i * 2.0, NOW + 160 + i * 2.0) for i in range(200)]
    adaptive = _serve(SLOPolicy(max_batch=256, profile=CHEAP, budget=EXACT), arrivals, CHEAP)
    statics = {size: _serve(FixedPolicy(size), arrivals, CHEAP) for size in (1, 8, 32)}
    assert adaptive >= max(statics.values())
    assert adaptive > statics[32]


def test_the_worker_overhead_per_batch_counts_in_every_prediction() -> None:
    """The profile times ``process`` only; what the worker spends per batch besides (encoding, producing)
    is learnt from its reports and added per batch: behind two full batches the 9th request, due in 25 ms,
    makes it at 10 ms a batch, not at 10 + 3 ms."""
    policy = SLOPolicy(max_batch=4, profile=ExecProfile({1: 0.008, 4: 0.008}), budget=EXACT)
    queue = [NOW + 1000] * 8 + [NOW + 25]
    assert not policy.plan(queue, NOW).doomed  # 8 + 8 + 8 = 24 ms
    for seconds in (0.002, 0.004, 0.003, float("nan"), -1.0, 0.9, 0.003):  # nonsense is ignored, a stall
        policy.observe_overhead(seconds)                                   # does not move the median
    assert policy.overhead_s == pytest.approx(0.003)
    assert list(policy.plan(queue, NOW).doomed) == [8]  # 3 x (8 + 3) = 33 ms
    assert FixedPolicy(4).observe_overhead(0.5) is None  # the baselines ignore it
