"""The accounting of the learning benches (learn-cache, learn-selection, learn-continual), fed fake runs
whose answers are known: each target must fail when what it names did not happen."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flowserve.kafka.replies import Reply
from flowserve_bench import learn_cache, learn_selection
from flowserve_bench.learn_cache import CacheSlice
from flowserve_bench.learn_continual import Phase, holdout_split, paired_gap, recovered, shadow_decision
from flowserve_bench.learn_selection import NO_ANSWER, NOT_READ

# --- learn-cache -----------------------------------------------------------------------------------------


def _cache_slice(hits: int, misses: int, hit_ms: float = 0.5, miss_ms: float = 5.0) -> CacheSlice:
    return CacheSlice(1.0, hit=[hit_ms] * hits, miss=[miss_ms] * misses)


def _plain_slice(answers: int, ms: float = 5.0) -> CacheSlice:
    return CacheSlice(1.0, unmarked=[ms] * answers)


def test_cache_at_half_hits_and_1_8x_meets_both_targets() -> None:
    cache = [_cache_slice(90, 90, hit_ms=0.5 + i / 10) for i in range(4)]
    plain = [_plain_slice(100) for _ in range(4)]
    got = learn_cache.account(cache, plain)
    assert got["hit_rate"] == 0.5 and got["hits"] == 360 and got["misses"] == 360
    assert got["throughput_ratio"] == [1.8, 1.8, 1.8]
    assert got["targets"] == {"hit_latency_le_half_miss": True, "throughput_1_6x_at_45_55pct_hits": True}


def test_a_20pct_hit_rate_fails_the_cache_target_even_with_a_high_ratio() -> None:
    cache = [_cache_slice(60, 240) for _ in range(4)]  # 300 answers a slice: 3x the plain gateway's
    plain = [_plain_slice(100) for _ in range(4)]
    got = learn_cache.account(cache, plain)
    assert got["hit_rate"] == 0.2
    assert got["throughput_ratio"][1] == pytest.approx(3.0)
    assert got["targets"]["throughput_1_6x_at_45_55pct_hits"] is False


def test_the_cache_throughput_target_is_decided_on_the_interval_lower_end() -> None:
    # three slices at 2x and one at 1x: 1.75x over all of them, but a resample of the slow slice is below 1.6
    cache = [_cache_slice(100, 100), _cache_slice(100, 100), _cache_slice(100, 100), _cache_slice(50, 50)]
    plain = [_plain_slice(100) for _ in range(4)]
    got = learn_cache.account(cache, plain)
    assert got["hit_rate"] == 0.5
    assert got["throughput_ratio"][0] == pytest.approx(1.75)
    assert got["throughput_ratio"][1] < 1.6
    assert got["targets"]["throughput_1_6x_at_45_55pct_hits"] is False


def test_cache_hits_are_compared_with_misses_of_the_same_gateway_not_the_plain_one() -> None:
    # hits at 2 ms are a fifth of the plain gateway's 10 ms, but two thirds of the caching gateway's misses
    cache = [_cache_slice(100, 100, hit_ms=2.0, miss_ms=3.0) for _ in range(4)]
    plain = [_plain_slice(100, ms=10.0) for _ in range(4)]
    got = learn_cache.account(cache, plain)
    assert got["hit_p50_over_miss_p50"][0] == pytest.approx(2 / 3, abs=1e-3)
    assert got["targets"]["hit_latency_le_half_miss"] is False


def test_cache_answers_the_gateway_did_not_mark_are_not_hits() -> None:
    cache = [_plain_slice(200, ms=0.5) for _ in range(4)]
    plain = [_plain_slice(100) for _ in range(4)]
    got = learn_cache.account(cache, plain)
    assert got["hit_rate"] == 0.0 and got["unmarked"] == 800
    assert all(math.isnan(x) for x in got["hit_p50_over_miss_p50"])
    assert got["targets"] == {"hit_latency_le_half_miss": False, "throughput_1_6x_at_45_55pct_hits": False}


def test_cache_failed_requests_are_counted_and_add_no_throughput() -> None:
    cache = [CacheSlice(1.0, hit=[0.5] * 90, miss=[5.0] * 90, errors=20) for _ in range(4)]
    plain = [CacheSlice(1.0, unmarked=[5.0] * 100, errors=3) for _ in range(4)]
    got = learn_cache.account(cache, plain)
    assert got["errors"] == {"cache": 80, "nocache": 12}
    assert got["throughput_ratio"][0] == pytest.approx(1.8)


# --- learn-selection -------------------------------------------------------------------------------------

REQUESTS, CHANGE = 4000, 2000
DEGRADED = list(learn_selection.BRANCHES).index(learn_selection.DEGRADED)
BEST = list(learn_selection.BRANCHES).index("cnn")


def _selection_run() -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """A selector that moves every request off the degraded branch at the change and answers right."""
    truth = np.arange(REQUESTS) % 10
    arms = np.where(np.arange(REQUESTS) < CHANGE, DEGRADED, BEST)
    degraded_right = np.arange(REQUESTS) < CHANGE
    branch_correct = {"mlp": degraded_right, "small": np.ones(REQUESTS, bool), "cnn": np.ones(REQUESTS, bool)}
    return arms, truth.copy(), truth, branch_correct


def test_selection_that_read_back_every_decision_meets_its_targets() -> None:
    arms, answered, truth, correct = _selection_run()
    got = learn_selection.account(arms, answered, truth, correct, CHANGE)
    assert got["decisions_read_back"] == REQUESTS
    assert got["degraded_share_window_ending_2000"] == 0.0
    assert got["targets"] == {"decisions_read_back": True, "degraded_share_lt_10pct_within_2000": True,
                              "accuracy_within_2pts_of_best": True}


def test_an_unread_decision_fails_decisions_read_back_and_counts_as_degraded() -> None:
    arms, answered, truth, correct = _selection_run()
    arms[CHANGE + 1750 : CHANGE + 2000] = NOT_READ  # the target's window: nothing read back
    got = learn_selection.account(arms, answered, truth, correct, CHANGE)
    assert got["decisions_read_back"] == REQUESTS - 250
    window = next(w for w in got["windows"] if w["to"] == 2000)
    assert window["not_read_back"] == 250 and window["degraded_share"] == 1.0
    assert got["targets"]["decisions_read_back"] is False
    assert got["targets"]["degraded_share_lt_10pct_within_2000"] is False


def test_selection_with_no_decision_read_back_passes_nothing_on_share() -> None:
    arms, answered, truth, correct = _selection_run()
    got = learn_selection.account(np.full(REQUESTS, NOT_READ), answered, truth, correct, CHANGE)
    assert got["decisions_read_back"] == 0
    assert {w["degraded_share"] for w in got["windows"]} == {1.0}
    assert got["targets"]["decisions_read_back"] is False
    assert got["targets"]["degraded_share_lt_10pct_within_2000"] is False


def test_selection_failed_requests_count_wrong() -> None:
    arms, answered, truth, correct = _selection_run()
    answered[:200] = NO_ANSWER  # 5% failed
    got = learn_selection.account(arms, answered, truth, correct, CHANGE)
    assert got["failed_requests"] == 200
    assert got["selector_accuracy"] == 0.95
    assert got["gap_vs_best"][0] == -0.05
    assert got["targets"]["accuracy_within_2pts_of_best"] is False


def test_selection_too_short_to_have_the_target_window_fails_the_share_target() -> None:
    arms, answered, truth, correct = _selection_run()
    n = CHANGE + 1000
    got = learn_selection.account(arms[:n], answered[:n], truth[:n], {b: c[:n] for b, c in correct.items()},
                                  CHANGE)
    assert got["degraded_share_window_ending_2000"] is None
    assert got["targets"]["degraded_share_lt_10pct_within_2000"] is False


# --- learn-continual -------------------------------------------------------------------------------------


def _reply(label: int | None) -> Reply:
    """A reply answering ``label``, or a failure (None)."""
    if label is None:
        return Reply("r", {}, "deadline passed", {}, 0, received_ms=10)
    return Reply("r", {"label": np.array([label])}, None, {}, 0, received_ms=10)


def _phase(answers: dict[int, int | None], labels: dict[int, int]) -> Phase:
    phase = Phase("p")
    for image, answer in answers.items():
        phase.score(f"p-{image}", image, labels[image], _reply(answer), 0.0)
    return phase


def test_continual_errors_count_as_wrong() -> None:
    phase = _phase({0: 1, 1: 2, 2: None, 3: 9}, {0: 1, 1: 2, 2: 3, 3: 4})
    assert phase.errors == 1 and len(phase.ids) == 4
    assert phase.accuracy == 0.5  # 2 right of 4 sent: the failure is one of the wrong ones
    assert phase.row()["accuracy"] == 0.5 and phase.row()["requests"] == 4


def test_continual_gap_pairs_images_by_id_not_by_position() -> None:
    labels = {i: i % 10 for i in range(20)}
    answers = {i: (labels[i] if i % 4 else labels[i] + 1) for i in range(20)}  # images 0, 4, 8, ... wrong
    pre = _phase(answers, labels)
    post = _phase(dict(reversed(answers.items())), labels)  # the same answers, sent in the reverse order
    # by position the rows would disagree (pre[0] wrong, post[0] right); by image they agree: no gap at all
    assert paired_gap(pre.by_image(), post.by_image()) == (0.0, 0.0, 0.0)


def test_continual_gap_counts_an_image_missing_on_one_side_as_wrong_there() -> None:
    gap, low, high = paired_gap({0: True, 1: True}, {0: True})
    assert gap == 0.5 and high == 1.0 and low == 0.0


def test_continual_shadow_answers_never_read_back_count_wrong() -> None:
    live = _phase({i: (i if i < 6 else None) for i in range(10)}, {i: i for i in range(10)})  # 6 of 10
    assert live.accuracy == 0.6
    seven = {f"p-{i}": True for i in range(7)}  # the rest never read back
    assert shadow_decision(live, seven) == (0.7, True)
    five = {f"p-{i}": True for i in range(5)}  # all right, but half missing: 0.5, not 1.0
    assert shadow_decision(live, five) == (0.5, False)


def test_continual_holdout_split_is_disjoint_and_covers_the_held_out_set() -> None:
    select, evaluate = holdout_split(450, 100)
    assert len(select) == 100 and len(evaluate) == 350
    assert not set(select.tolist()) & set(evaluate.tolist())
    assert sorted([*select.tolist(), *evaluate.tolist()]) == list(range(450))
    with pytest.raises(ValueError, match="select_n"):
        holdout_split(450, 450)


def test_continual_target_needs_promotion_and_the_upper_end_within_3pts() -> None:
    assert recovered(True, 0.03)
    assert not recovered(True, 0.031)
    assert not recovered(False, 0.0)
    assert recovered(True, -0.01)  # post-promote better than pre-drift
