"""The parity bench's accounting, fed runs whose answers are known: misses, the stall schedule, the targets."""

from __future__ import annotations

import numpy as np

from flowserve.kafka.replies import Reply
from flowserve.wire.envelope import H_RECONSTRUCTED
from flowserve_bench.parity import CALL_TIMEOUT_MS, SliceTally, decide_targets, scenario_figures, stall_schedule


def _reply(label: int | None, *, error: str | None = None, rebuilt: bool = False) -> Reply:
    tensors = {} if label is None else {"label": np.array([label])}
    return Reply("r", tensors, error, {H_RECONSTRUCTED: b"1"} if rebuilt else {}, 0)


def test_an_error_reply_or_a_failed_call_is_a_miss_not_a_fast_answer() -> None:
    tally = SliceTally()
    tally.add(_reply(3), 12.0, 3)
    tally.add(_reply(None, error="component failed"), 2.0, 3)
    tally.add(None, 5.0, 3)
    tally.add(_reply(4, rebuilt=True), 20.0, 3)
    assert tally.latencies == [12.0, CALL_TIMEOUT_MS, CALL_TIMEOUT_MS, 20.0]
    assert (tally.misses, tally.correct, tally.rebuilt) == (2, 1, 1)


def _tally(latencies: list[float]) -> SliceTally:
    return SliceTally(latencies=list(latencies))


def test_a_miss_drags_the_accuracy_and_the_tail() -> None:
    clean = [10.0] * 99  # p99.9 of ~200 latencies rests on the worst one
    tallies = {c: [_tally(clean + [11.0]), _tally(clean + [11.0])] for c in ("none", "replicas", "parity")}
    tallies["parity"][1].add(_reply(None, error="deadline"), 1.0, 0)
    part = scenario_figures(tallies, {})
    assert part["parity"]["misses"] == 1 and part["parity"]["accuracy"] == 0.0
    assert part["parity"]["p99_9_ms"] > 1000 > part["replicas"]["p99_9_ms"]


def test_every_contender_meets_the_same_stalls_on_the_slots_it_has() -> None:
    kw = {"seed": 0, "deployment": 2, "stall_ms": 60.0, "stall_every_ms": 600.0, "stop_s": 1.5}
    three = stall_schedule("stalls", 4.0, 3, **kw)  # replication's and parity's stage: one extra worker
    two = stall_schedule("stalls", 4.0, 2, **kw)  # no redundancy
    assert {s.slot for s in three} == {0, 1, 2}, "the extra worker is stalled too"
    assert two == [s for s in three if s.slot < 2]
    assert stall_schedule("stalls", 4.0, 3, **kw | {"deployment": 3}) != three
    for slot in range(3):  # one worker's stalls never overlap
        mine = [s for s in three if s.slot == slot]
        assert all(b.at_s >= a.at_s + a.seconds for a, b in zip(mine, mine[1:], strict=False))
    [stop] = stall_schedule("stopped", 4.0, 3, **kw)
    assert stop.seconds == 1.5 and 0 <= stop.slot < 3
    assert stall_schedule("clean", 4.0, 3, **kw) == []


def _scenarios(gap: list[float], p50: list[float] | None = None) -> dict[str, dict[str, object]]:
    p50 = p50 or [1.0, 0.95, 1.05]
    return {s: {"gap_ratio_parity_over_replicas": gap, "p50_ratio_parity_over_none_interval": p50}
            for s in ("clean", "stalls", "stopped")}


def test_a_gap_whose_interval_straddles_the_line_fails() -> None:
    targets, notes = decide_targets(_scenarios([0.22, 0.15, 0.9]), 0.2, 2, {2: 0.96})
    assert not targets["gap_le_third_of_replicas"]
    assert any("'stalls'" in n and "0.9" in n for n in notes)
    targets, notes = decide_targets(_scenarios([0.1, 0.05, 0.3]), 0.2, 2, {2: 0.96})
    assert targets == {"gap_le_third_of_replicas": True, "median_le_1.1x_none": True, "overhead_le_1/k+5%": True,
                       "degraded_accuracy_k2_ge_0.85": True}
    assert notes == []


def test_a_median_whose_interval_straddles_the_line_fails() -> None:
    targets, _ = decide_targets(_scenarios([0.1, 0.05, 0.3], [1.0, 0.9, 1.2]), 0.2, 2, {2: 0.96})
    assert not targets["median_le_1.1x_none"]


def test_a_stall_shorter_than_a_reply_is_said_to_be_out_of_parity_s_reach() -> None:
    scenarios = _scenarios([0.8, 0.6, 0.98])
    scenarios["clean"]["parity"] = {"p50_ms": 70.0}
    _, notes = decide_targets(scenarios, 0.2, 2, {2: 0.96}, stall_ms=60.0)
    assert any("cannot cut the stall tail" in n for n in notes)
    _, notes = decide_targets(scenarios, 0.2, 2, {2: 0.96}, stall_ms=320.0)
    assert not any("cannot cut the stall tail" in n for n in notes)
