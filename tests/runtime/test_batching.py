"""SLO-aware batching: profiles (sliding-window p99, interpolation, files) and policies on a fake clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowserve.errors import FlowserveError
from flowserve.runtime.batching import BatchPolicy, FixedPolicy, LagPolicy, Plan, SLOPolicy, TimeoutPolicy, make_policy
from flowserve.runtime.budget import Budget, budget_for
from flowserve.runtime.profiles import (
    ExecProfile,
    load_profiles,
    node_profile,
    profile_path,
    save_profiles,
    sizes_to_profile,
)
from flowserve.topology.graph import load_topology_text
from flowserve.wire.envelope import deadline_of

NOW = 1_700_000_000_000.0  # the fake clock, epoch ms
EXACT = Budget(share=1.0, reserve_s=0.0, downstream_s=0.0)  # the node may use all the remaining time


def linear(ms_per_item: float = 1.0) -> ExecProfile:
    """A profile where a batch of b takes b ms (p99)."""
    return ExecProfile({1: ms_per_item / 1000, 64: 64 * ms_per_item / 1000})


# -- profile estimator --------------------------------------------------------------------------

def test_p99_is_over_a_sliding_window_of_recent_runs() -> None:
    profile = ExecProfile(window=100)
    for _ in range(100):
        profile.observe(4, 0.050)  # an old regime, slow
    for i in range(100):
        profile.observe(4, 0.001 + i * 1e-5)  # the recent one pushes it out of the window
    assert profile.samples(4) == 100
    assert profile.measured_p99(4) == pytest.approx(0.001 + 98.01e-5)
    assert profile.p99(4) == pytest.approx(0.001 + 98.01e-5)


def test_p99_of_a_window_sees_the_tail() -> None:
    profile = ExecProfile(window=100)
    for i in range(100):
        profile.observe(1, 0.010 if i == 50 or i == 60 else 0.001)
    assert profile.measured_p99(1) == pytest.approx(0.010)


def test_interpolates_between_profiled_sizes_and_extrapolates_per_item_beyond() -> None:
    profile = ExecProfile({1: 0.002, 8: 0.004, 32: 0.010})
    assert profile.p99(1) == pytest.approx(0.002)
    assert profile.p99(4) == pytest.approx(0.002 + 0.002 * 3 / 7)
    assert profile.p99(20) == pytest.approx(0.004 + 0.006 * 12 / 24)
    assert profile.p99(64) == pytest.approx(0.020)  # 64/32 of the largest: batching assumed no cheaper


def test_the_planners_curve_is_the_point_predictions_and_follows_new_runs() -> None:
    profile = ExecProfile({1: 0.001, 8: 0.004}, seed_p50={1: 0.0008})
    for q, point in ((99, profile.p99), (50, profile.p50)):
        assert profile.curve(q, 20) == [0.0, *(point(b) for b in range(1, 21))]
    assert len(profile.curve(99, 3)) == 21  # a shorter ask reuses what was built
    for _ in range(20):
        profile.observe(2, 0.05)  # live runs at size 2 replace the seeds (refresh_s = 0: at once)
    assert profile.curve(99, 20)[2] == pytest.approx(profile.p99(2)) == pytest.approx(0.05)
    assert ExecProfile().curve(99, 4) == [0.0] * 5  # nothing known: no time predicted


def test_predictions_never_fall_with_batch_size() -> None:
    profile = ExecProfile({1: 0.005, 2: 0.003, 4: 0.006})
    # figures that disagree are pooled (isotonic regression), not the larger one carried upwards
    assert profile.p99(1) == profile.p99(2) == pytest.approx(0.004)
    assert [profile.p99(s) for s in (1, 2, 3, 4)] == sorted(profile.p99(s) for s in (1, 2, 3, 4))


def test_live_runs_replace_the_seed_once_there_are_enough() -> None:
    profile = ExecProfile({1: 0.100}, min_live=10)
    for _ in range(9):
        profile.observe(1, 0.001)
    assert profile.p99(1) == pytest.approx(0.100)
    profile.observe(1, 0.001)
    assert profile.p99(1) == pytest.approx(0.001)


def test_a_refresh_interval_lets_predictions_lag_new_runs_until_it_passes() -> None:
    # refresh_s 0 (the default): every run counts at once; a long interval keeps the tables built first
    for refresh_s, moves in ((0.0, True), (3600.0, False)):
        profile = ExecProfile({1: 0.001}, min_live=1, refresh_s=refresh_s)
        assert profile.p99(1) == pytest.approx(0.001)
        profile.observe(1, 0.004)
        assert (profile.p99(1) == pytest.approx(0.004)) is moves
    profile.refresh_s = 0.0  # the interval has passed: the next prediction rebuilds
    assert profile.p99(1) == pytest.approx(0.004)


def test_empty_profile_predicts_nothing_and_is_not_ready() -> None:
    profile = ExecProfile()
    assert profile.p99(8) is None and not profile.ready
    profile.observe(1, 0.001)
    profile.observe(0, 0.5)  # ignored
    profile.observe(2, float("nan"))  # ignored
    assert profile.p99(1) == pytest.approx(0.001) and not profile.ready


def test_profile_file_round_trip(tmp_path: Path) -> None:
    path = profile_path(tmp_path / "digits.yaml")
    assert path == tmp_path / "digits.profile.json"
    profile = ExecProfile({1: 0.002, 16: 0.006})
    save_profiles(path, {"model": profile.to_dict()}, topology="digits", device="cpu")
    save_profiles(path, {"pre": ExecProfile({1: 0.0001}).to_dict()}, topology="digits", device="cpu")
    entries = load_profiles(path)
    assert set(entries) == {"model", "pre"}  # the second save merged into the file
    loaded = node_profile(entries, "model")
    assert loaded is not None and loaded.seed == {1: 0.002, 16: 0.006}
    assert loaded.p99(8) == profile.p99(8)
    assert node_profile(entries, "post") is None
    assert json.loads(path.read_text())["format"] == "flowserve-profile/1"


def test_missing_profile_is_empty_and_a_broken_one_says_what_to_do(tmp_path: Path) -> None:
    assert load_profiles(tmp_path / "none.profile.json") == {}
    bad = tmp_path / "bad.profile.json"
    bad.write_text("{not json")
    with pytest.raises(FlowserveError, match="rerun 'flowserve profile'"):
        load_profiles(bad)
    bad.write_text(json.dumps({"format": "flowserve-profile/1", "nodes": {"a": {"p99_s": {"x": 1}}}}))
    with pytest.raises(FlowserveError, match="node 'a'"):
        node_profile(load_profiles(bad), "a")


def test_sizes_to_profile_doubles_up_to_the_maximum() -> None:
    assert sizes_to_profile(1) == [1]
    assert sizes_to_profile(32) == [1, 2, 4, 8, 16, 32]
    assert sizes_to_profile(48) == [1, 2, 4, 8, 16, 32, 48]


@pytest.mark.parametrize(("raw", "value"), [(b"123", 123), (None, None), (b"soon", None), (b"", None)])
def test_deadline_header_never_raises(raw: bytes | None, value: int | None) -> None:
    assert deadline_of(raw) == value


# -- SLO policy: batch choice ---------------------------------------------------------------------

@pytest.mark.parametrize(("queued", "take"), [(1, 1), (5, 5), (32, 32), (100, 32)])
def test_takes_what_is_queued_up_to_max_batch_when_deadlines_are_loose(queued: int, take: int) -> None:
    policy = SLOPolicy(max_batch=32, profile=linear(), budget=EXACT)
    assert policy.plan([NOW + 10_000] * queued, NOW) == Plan(take=take)


def test_largest_batch_whose_p99_meets_the_earliest_deadline() -> None:
    policy = SLOPolicy(max_batch=64, profile=linear(), budget=EXACT)
    # a batch of b takes b ms: with 10 ms left, 10 requests fit
    plan = policy.plan([NOW + 10] * 40, NOW)
    assert plan.take == 10
    assert policy.plan([NOW + 10.5] * 40, NOW).take == 10
    assert policy.plan([NOW + 3] * 40, NOW).take == 3


def test_a_tight_request_further_back_bounds_the_batch_when_that_saves_it() -> None:
    policy = SLOPolicy(max_batch=64, profile=linear(), budget=EXACT)
    queue = [NOW + 100] * 4 + [NOW + 5.5] + [NOW + 100] * 4
    assert policy.plan(queue, NOW) == Plan(take=5)  # batch 6+ would take 6+ ms and miss the tight one


def test_a_tight_request_that_cannot_make_it_behind_older_ones_does_not_hold_back_the_batch() -> None:
    """Behind 4 older requests the one due in 4.5 ms misses however the queue is cut (at best in a batch of 5:
    5 ms); it could make it alone, so it is not refused: it is doomed (a deadline error now), and the batch
    is not shrunk for it."""
    policy = SLOPolicy(max_batch=64, profile=linear(), budget=EXACT)
    queue = [NOW + 100] * 4 + [NOW + 4.5] + [NOW + 100] * 4
    plan = policy.plan(queue, NOW)
    assert (plan.take, plan.refuse, list(plan.doomed)) == (8, {}, [4])


def test_none_deadline_never_limits_a_batch() -> None:
    policy = SLOPolicy(max_batch=16, profile=linear(), budget=EXACT)
    assert policy.plan([None] * 20, NOW) == Plan(take=16)


def test_node_share_of_the_remaining_time_limits_the_batch() -> None:
    # half of the (remaining - 2 ms hop reserve) is this node's: 22 ms left -> 10 ms -> 10 requests
    policy = SLOPolicy(max_batch=64, profile=linear(), budget=Budget(share=0.5, reserve_s=0.002, downstream_s=0.0))
    assert policy.plan([NOW + 22] * 40, NOW).take == 10


# -- SLO policy: admission --------------------------------------------------------------------------

def test_refuses_requests_that_cannot_finish_even_alone() -> None:
    policy = SLOPolicy(max_batch=8, profile=ExecProfile({1: 0.005, 8: 0.010}), budget=EXACT)
    plan = policy.plan([NOW + 2, NOW + 1000, NOW + 1000], NOW)
    assert list(plan.refuse) == [0]
    assert "cannot finish before its deadline: 2.0 ms left" in plan.refuse[0]
    assert plan.take == 2  # the rest form the batch


def test_admission_counts_the_downstream_stages_fastest_path() -> None:
    budget = Budget(share=0.5, reserve_s=0.002, downstream_s=0.010)
    policy = SLOPolicy(max_batch=8, profile=ExecProfile({1: 0.005, 8: 0.010}), budget=budget)
    # 5 ms here + 2 ms hops + 10 ms downstream = 17 ms needed
    assert list(policy.plan([NOW + 16.9], NOW).refuse) == [0]
    assert policy.plan([NOW + 17.1], NOW) == Plan(take=1)
    assert "+ 12.0 ms downstream" in policy.plan([NOW + 5], NOW).refuse[0]


def test_predicted_queueing_dooms_only_what_cannot_make_it_even_at_full_batches() -> None:
    """Refusal (kind ``refused``) is for requests that could not make it even if run next; a request that
    could, but not behind the queue ahead of it even worked off in full batches at their median, is doomed
    (answered at once, kind ``deadline``): its work goes to those that can still make it (Clockwork)."""
    policy = SLOPolicy(max_batch=4, profile=ExecProfile({1: 0.010, 4: 0.010}), budget=EXACT)
    # every batch of 4 takes 10 ms; deadlines 25 ms out: the third batch ends at 30 ms at best
    plan = policy.plan([NOW + 25] * 12, NOW)
    assert (plan.take, plan.refuse, sorted(plan.doomed)) == (4, {}, [8, 9, 10, 11])
    assert "8 requests ahead" in plan.doomed[8]
    # 30 ms left: the third batch can still make it, so nothing is doomed
    assert policy.plan([NOW + 30] * 12, NOW) == Plan(take=4)
    # at the head with less than a batch-1 time left: refused, not doomed
    plan = policy.plan([NOW + 9.9] * 4, NOW)
    assert plan.take == 0 and sorted(plan.refuse) == [0, 1, 2, 3] and not plan.doomed


def test_grows_to_a_full_batch_when_the_queue_behind_would_lose_more() -> None:
    # batching is cheap: b takes 1 + (b-1)/31 ms; two tight requests (1.5 ms) head a long queue (4.5 ms)
    profile = ExecProfile({1: 0.001, 32: 0.002})
    policy = SLOPolicy(max_batch=32, profile=profile, budget=EXACT)
    queue = [NOW + 1.5] * 2 + [NOW + 4.5] * 62
    # batch 16 saves the 2 tight ones but then 32 + 16 more end at ~5 ms: 16 misses; a full batch loses 2
    assert policy.plan(queue, NOW) == Plan(take=32)
    # with a short queue behind, the tight ones are saved by the smaller batch
    assert policy.plan(queue[:20], NOW) == Plan(take=16)
    # two full batches queued (a backlog) always take a full batch, even where the estimate says otherwise
    tight = [NOW + 1.5] * 20 + [NOW + 100] * 12
    plan = policy.plan(tight, NOW)  # 16 tight ones fit in 1.48 ms; the 17th to 20th cannot make it behind them
    assert (plan.take, sorted(plan.doomed)) == (16, [16, 17, 18, 19])
    # ... the doomed set aside, two full batches still queued (a backlog): a full batch
    assert policy.plan(tight + [NOW + 100] * 36, NOW).take == 32


def test_queued_batches_are_predicted_at_their_p50_the_chosen_one_at_its_p99() -> None:
    # p99 of a full batch 4 ms, its median 1.5 ms; the head is due in 2 ms: the largest prefix meeting it
    # at p99 is 11 (1.97 ms). Behind it 40 requests due in 5 ms.
    profile = ExecProfile({1: 0.001, 32: 0.004}, seed_p50={1: 0.0005, 32: 0.0015})
    policy = SLOPolicy(max_batch=32, profile=profile, budget=EXACT)
    queue = [NOW + 2.0] + [NOW + 5.0] * 40
    # 11 at p99 (1.97 ms), then 30 at p50 (~1.4 ms): all in time. Summing p99s (1.97 + 3.8 ms) would have
    # predicted 30 misses and sacrificed the head to a full batch.
    assert policy.plan(queue, NOW).take == 11
    assert profile.p50(32) == pytest.approx(0.0015) and profile.p99(32) == pytest.approx(0.004)


def test_a_plan_looks_only_at_its_window_of_the_queue() -> None:
    policy = SLOPolicy(max_batch=8, profile=linear(10.0), budget=EXACT, lookahead=4)
    assert policy.window == 32
    plan = policy.plan([NOW + 1] * 1000, NOW)  # hopeless, all of them: only the window's are judged now
    assert sorted(plan.refuse) == list(range(32)) and plan.take == 0


def test_everything_refused_means_nothing_to_take() -> None:
    policy = SLOPolicy(max_batch=4, profile=linear(10.0), budget=EXACT)
    plan = policy.plan([NOW + 1] * 3, NOW)
    assert plan.take == 0 and sorted(plan.refuse) == [0, 1, 2]


def test_an_old_request_is_never_starved_by_new_ones() -> None:
    """Batches are prefixes of the FIFO queue: new arrivals, however urgent, never go before the head."""
    policy = SLOPolicy(max_batch=8, profile=linear(), budget=EXACT)
    clock = NOW
    queue: list[tuple[str, float]] = [("old", clock + 500)]
    served: list[str] = []
    for round_ in range(5):
        queue += [(f"new{round_}-{i}", clock + 6) for i in range(20)]  # a burst of urgent requests
        plan = policy.plan([d for _, d in queue], clock)
        queue = [q for i, q in enumerate(queue) if i not in plan.refuse]
        batch, queue = queue[: plan.take], queue[plan.take:]
        served += [name for name, _ in batch]
        clock += plan.take  # the batch took take ms
    assert served[0] == "old"


# -- SLO policy: AIMD without a profile ----------------------------------------------------------------

def test_aimd_grows_additively_while_under_90_percent_of_the_budget() -> None:
    policy = SLOPolicy(max_batch=64, budget=EXACT)
    assert policy.mode == "aimd"
    sizes = []
    for _ in range(5):
        plan = policy.plan([NOW + 100] * 50, NOW)  # 100 ms budget
        sizes.append(plan.take)
        policy.observe(plan.take, 0.010)  # 10 ms < 90 ms
    assert sizes == [1, 2, 3, 4, 5]


def test_aimd_backs_off_multiplicatively_on_a_violation() -> None:
    policy = SLOPolicy(max_batch=64, budget=EXACT, aimd_size=20)
    plan = policy.plan([NOW + 100] * 50, NOW)
    policy.observe(plan.take, 0.150)  # 150 ms > 100 ms budget
    assert policy.aimd_size == 18
    policy.plan([NOW + 100] * 50, NOW)
    policy.observe(18, 0.095)  # between 90% and 100%: hold
    assert policy.aimd_size == 18


def test_aimd_does_not_grow_on_partial_batches_and_stays_within_bounds() -> None:
    policy = SLOPolicy(max_batch=3, budget=EXACT, aimd_size=2)
    policy.plan([NOW + 100], NOW)  # only 1 queued: a partial batch says nothing about size 3
    policy.observe(1, 0.001)
    assert policy.aimd_size == 2
    for _ in range(5):
        policy.plan([NOW + 100] * 10, NOW)
        policy.observe(policy.aimd_size, 0.001)
    assert policy.aimd_size == 3
    small = SLOPolicy(max_batch=3, budget=EXACT, aimd_size=1)
    small.plan([NOW + 100] * 10, NOW)
    small.observe(1, 1.0)
    assert small.aimd_size == 1


def test_aimd_refuses_only_the_already_impossible() -> None:
    policy = SLOPolicy(max_batch=8, budget=Budget(share=1.0, reserve_s=0.002, downstream_s=0.0))
    plan = policy.plan([NOW + 1, NOW + 100], NOW)
    assert list(plan.refuse) == [0] and plan.take == 1


def test_switches_from_aimd_to_the_profile_once_two_sizes_are_measured() -> None:
    policy = SLOPolicy(max_batch=64, budget=EXACT)
    for _ in range(10):
        policy.profile.observe(1, 0.001)
        policy.profile.observe(2, 0.002)
    assert policy.mode == "profile"
    assert policy.plan([NOW + 10] * 40, NOW).take == 10  # linear extrapolation: 1 ms per request


# -- other policies and wiring ---------------------------------------------------------------------------

def test_timeout_policy_waits_for_a_full_batch() -> None:
    policy = TimeoutPolicy(max_batch=32, max_wait_ms=10)
    assert policy.next_size(1) == 32 and policy.max_wait_ms == 10
    assert policy.plan([NOW] * 40, NOW) == Plan(take=32)


def test_baselines_plan_fixed_chunks() -> None:
    assert FixedPolicy(8).plan([None] * 20, NOW) == Plan(take=8)
    assert LagPolicy(16).plan([None] * 20, NOW) == Plan(take=16)


def test_every_policy_declares_what_the_worker_reads() -> None:
    """The worker reads max_wait_ms, window and profile of any policy without probing for them."""
    policies: list[BatchPolicy] = [LagPolicy(8), FixedPolicy(4), TimeoutPolicy(16, 5.0),
                                   SLOPolicy(max_batch=8, profile=ExecProfile({1: 0.001}))]
    assert [p.max_wait_ms for p in policies] == [0.0, 0.0, 5.0, 0.0]
    assert [p.window for p in policies] == [0, 0, 0, 32]
    assert [p.profile is not None for p in policies] == [False, False, False, True]


CHAIN = """
name: chain
nodes:
  a: {component: fs_testkit:AddOne, inputs: {x: input.x}, max_batch: 32}
  b: {component: fs_testkit:AddOne, inputs: {x: a.x}, batching: {policy: lag}}
  c: {component: fs_testkit:AddOne, inputs: {x: b.x}, batching: {policy: fixed, size: 4}}
  d: {component: fs_testkit:AddOne, inputs: {x: a.x}, batching: {policy: timeout, size: 16, max_wait_ms: 5}}
outputs: {y: c.x, z: d.x}
"""


def test_budget_splits_the_remaining_time_by_profiled_batch_one_times() -> None:
    topology = load_topology_text(CHAIN)
    profiles = {"a": ExecProfile({1: 0.002}), "b": ExecProfile({1: 0.006}), "c": ExecProfile({1: 0.002}),
                "d": ExecProfile({1: 0.001})}
    budget = budget_for(topology, "a", profiles, hop_ms=1.0)
    # critical path after a: b + c = 8 ms (d: 1 ms); a's share = 2 / (2 + 8)
    assert budget.share == pytest.approx(0.2)
    assert budget.downstream_s == pytest.approx(0.008)
    assert budget.reserve_s == pytest.approx(0.004)  # hops: a->b, b->c, c->outputs (Collect), outputs topic
    last = budget_for(topology, "outputs", profiles, hop_ms=1.0)
    assert last.share == 1.0 and last.downstream_s == 0.0 and last.reserve_s == pytest.approx(0.001)


def test_without_profiles_every_stage_weighs_the_same() -> None:
    topology = load_topology_text(CHAIN)
    budget = budget_for(topology, "a", {}, hop_ms=2.0)
    assert budget.share == pytest.approx(1 / 4)  # a, then b, c, outputs on the longest path


def test_make_policy_follows_the_node_batching_entry() -> None:
    topology = load_topology_text(CHAIN)
    slo = make_policy(topology, "a", ExecProfile({1: 0.001}))
    assert isinstance(slo, SLOPolicy) and slo.max_batch == 32 and slo.mode == "profile"
    assert isinstance(make_policy(topology, "b"), LagPolicy)
    fixed = make_policy(topology, "c")
    assert isinstance(fixed, FixedPolicy) and fixed.size == 4
    assert fixed.next_size(1) == 4 and fixed.next_size(10_000) == 4 * 1024  # fetch more, process 4 at a time
    assert fixed.plan([None] * 100, NOW) == Plan(take=4)
    timeout = make_policy(topology, "d")
    assert isinstance(timeout, TimeoutPolicy) and (timeout.max_batch, timeout.max_wait_ms) == (16, 5)


def test_unknown_batching_policy_is_refused_at_load_time() -> None:
    from flowserve.errors import TopologyError

    with pytest.raises(TopologyError, match="batching.policy"):
        load_topology_text(CHAIN.replace("policy: lag", "policy: greedy"))


def test_p50_comes_from_the_live_window_or_the_seeded_medians_else_the_p99_figure(tmp_path: Path) -> None:
    profile = ExecProfile({1: 0.004, 8: 0.010}, seed_p50={1: 0.002}, min_live=3)
    assert profile.p50(1) == pytest.approx(0.002)
    assert profile.p50(8) == pytest.approx(0.010)  # no median seeded at 8: the p99 figure
    for seconds in (0.003, 0.003, 0.009):
        profile.observe(8, seconds)
    assert profile.p50(8) == pytest.approx(0.003) and profile.p99(8) == pytest.approx(0.00888)
    path = tmp_path / "m.profile.json"
    save_profiles(path, {"m": ExecProfile({1: 0.004}, seed_p50={1: 0.002}).to_dict()}, topology="m", device="cpu")
    loaded = node_profile(load_profiles(path), "m")
    assert loaded is not None and loaded.seed_p50 == {1: 0.002} and loaded.p50(1) == pytest.approx(0.002)


def test_a_noisy_spike_at_one_size_is_not_carried_to_every_larger_size() -> None:
    profile = ExecProfile({1: 0.002, 32: 0.008}, min_live=10)
    for _ in range(10):
        profile.observe(7, 0.040)  # a burst of contention while size 7 ran
    for _ in range(40):
        profile.observe(32, 0.008)
    assert profile.p99(32) == pytest.approx((0.008 * 40 + 0.040 * 10) / 50)  # pooled, weighted by runs
    assert profile.p99(32) < 0.015
    profile.observe(9, 0.500)  # a size seen once live does not set a figure while better ones exist
    assert profile.p99(9) < 0.015


def test_admission_uses_the_typical_batch_one_time() -> None:
    # batch 1: p99 20 ms, median 2 ms; a request due in 10 ms could still make it when run next: admitted
    profile = ExecProfile({1: 0.020, 8: 0.030}, seed_p50={1: 0.002, 8: 0.005})
    policy = SLOPolicy(max_batch=8, profile=profile, budget=EXACT)
    assert policy.plan([NOW + 10], NOW) == Plan(take=1)
    assert list(policy.plan([NOW + 1.5], NOW).refuse) == [0]


def test_without_deadlines_aimd_takes_what_is_queued() -> None:
    from flowserve.runtime.batching import SLOPolicy

    policy = SLOPolicy(max_batch=64)
    plan = policy.plan([None] * 100, 0.0)
    assert plan.take == 64 and not plan.refuse
    assert policy.plan([None] * 10, 0.0).take == 10


def test_seeds_move_with_the_live_runs_at_sizes_not_run_live() -> None:
    """A profile taken while the machine was 10x slower: once sizes 1 and 2 run live at a tenth of their
    seeds, the seeded size 64 is predicted at a tenth too, not kept at its stale figure."""
    profile = ExecProfile({1: 0.010, 2: 0.012, 64: 0.100}, min_live=10)
    for _ in range(10):
        profile.observe(1, 0.001)
        profile.observe(2, 0.0012)
    assert profile.p99(64) == pytest.approx(0.010)
    assert profile.p99(1) == pytest.approx(0.001)
    assert profile.p50(64) == pytest.approx(0.010)


def test_a_larger_batch_is_never_predicted_dearer_per_request() -> None:
    """A sweep disturbed at batch 32 (6 ms a request there, 1 ms alone) must not make the policy believe
    that 32 requests take 190 ms: they could run as 32 batches of one."""
    profile = ExecProfile({1: 0.001, 32: 0.190, 256: 0.500})
    assert profile.p99(32) == pytest.approx(0.032)
    assert profile.p99(256) == pytest.approx(0.256)
    assert profile.p99(16) <= 16 * profile.p99(1)
