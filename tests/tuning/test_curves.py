"""Network calculus (flowserve.tuning.curves) against hand-made traces and the textbook closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flowserve.tuning.curves import (
    RateLatency,
    TokenBucket,
    arrival_curve,
    backlog_bound,
    convolve,
    delay_bound,
    envelope,
    max_arrivals,
    service_curve,
    windows,
)


def test_windows_double_up_to_sixty_seconds() -> None:
    assert windows(7.5) == [7.5, 15.0, 30.0, 60.0]
    assert windows(0.1)[:3] == [0.1, 0.2, 0.4] and windows(0.1)[-1] == 60.0
    with pytest.raises(ValueError):
        windows(0)


def test_max_arrivals_in_a_sliding_window() -> None:
    trace = np.array([0.0, 0.1, 0.2, 5.0, 5.05, 5.1, 5.15, 9.0])
    assert max_arrivals(trace, 0.5) == 4
    assert max_arrivals(trace, 0.2) == 4  # [5.0, 5.2) holds 5.0, 5.05, 5.1, 5.15
    assert max_arrivals(trace, 0.05) == 1
    assert max_arrivals(np.array([]), 1.0) == 0


def test_envelope_of_a_periodic_trace_is_its_rate_with_one_request_of_burst() -> None:
    trace = np.arange(0, 120, 0.125)  # 8 req/s, perfectly regular (binary fractions: exact windows)
    family = envelope(trace, service_s=0.125)
    for bucket in family:
        assert bucket.rate == pytest.approx(8.0, rel=0.01)
        assert bucket.burst == pytest.approx(1.0)
    # the curve covers every window of the trace
    for w in (0.05, 0.3, 1.0, 7.0, 59.0):
        assert arrival_curve(family, w) >= max_arrivals(trace, w)


def test_envelope_of_a_burst_keeps_the_burst_at_short_windows_and_the_mean_at_long() -> None:
    burst = np.full(50, 10.0)  # 50 requests at once at t=10
    steady = np.arange(0, 60, 1.0)  # 1 req/s
    trace = np.sort(np.concatenate([steady, burst]))
    family = envelope(trace, service_s=0.5)
    first, last = family[0], family[-1]
    assert first.window == 0.5 and max_arrivals(trace, 0.5) == 51
    assert first.burst == pytest.approx(51.0)
    assert last.window == 60.0 and last.rate == pytest.approx(110 / 60)
    for w in np.linspace(0.01, 60, 200):
        assert arrival_curve(family, float(w)) >= max_arrivals(trace, float(w)) - 1e-9


def test_service_curve_of_a_stage() -> None:
    beta = service_curve(consumers=3, batch=8, batch_seconds=0.04, fill_wait=0.01)
    assert beta.rate == pytest.approx(600.0) and beta.latency == pytest.approx(0.05)
    assert beta(0.05) == 0 and beta(0.15) == pytest.approx(60.0)


def test_single_stage_bounds_are_the_closed_forms() -> None:
    alpha = [TokenBucket(rate=40, burst=12)]
    beta = RateLatency(rate=100, latency=0.03)
    assert delay_bound(alpha, beta) == pytest.approx(0.03 + 12 / 100)  # T + b/R
    assert backlog_bound(alpha, beta) == pytest.approx(12 + 40 * 0.03)  # b + rT
    # numerically: the horizontal and vertical deviations of the two curves
    ts = np.linspace(1e-6, 2, 20001)
    vertical = max(alpha[0](t) - beta(t) for t in ts)
    assert vertical == pytest.approx(12 + 40 * 0.03, rel=1e-3)
    horizontal = max(12 / 100 + 0.03 + t * (40 / 100 - 1) for t in ts[ts < 0.001])
    assert horizontal == pytest.approx(delay_bound(alpha, beta), rel=1e-2)


def test_unstable_stage_has_no_bound() -> None:
    assert delay_bound([TokenBucket(rate=200, burst=1)], RateLatency(100, 0.01)) == math.inf
    assert backlog_bound([TokenBucket(rate=200, burst=1)], RateLatency(100, 0.01)) == math.inf


def test_the_family_bound_is_its_tightest_bucket() -> None:
    family = [TokenBucket(rate=90, burst=2), TokenBucket(rate=20, burst=30)]
    beta = RateLatency(100, 0.0)
    assert delay_bound(family, beta) == pytest.approx(0.02)


def test_convolution_pays_bursts_only_once() -> None:
    b1, b2 = RateLatency(200, 0.01), RateLatency(120, 0.05)
    chain = convolve([b1, b2])
    assert chain == RateLatency(120, pytest.approx(0.06))
    alpha = [TokenBucket(rate=50, burst=20)]
    # end to end bound T1 + T2 + b/min(R) is tighter than the sum of per-stage bounds
    assert delay_bound(alpha, chain) == pytest.approx(0.06 + 20 / 120)
    per_stage = delay_bound(alpha, b1) + delay_bound([TokenBucket(50, 20 + 50 * 0.01)], b2)
    assert delay_bound(alpha, chain) < per_stage
    # min-plus convolution numerically: (b1 ⊗ b2)(t) = inf_s b1(s) + b2(t - s)
    for t in (0.05, 0.1, 0.5):
        s = np.linspace(0, t, 5001)
        numeric = min(b1(float(x)) + b2(t - float(x)) for x in s)
        assert numeric == pytest.approx(chain(t), abs=1e-6 + 1e-3 * chain(t))
