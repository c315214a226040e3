"""The profile rule: one consumer's safe rate, spread over partitions, and the lag it drains."""

from __future__ import annotations

import math

from flowserve.tuning.capacity import safe_rate
from flowserve.tuning.curves import TokenBucket
from flowserve.tuning.rules import DRAIN_S, StageTarget, profiled_consumers, spread
from flowserve.tuning.tuner import Controller

# batches of up to 8 in 10 ms + 2 ms per batch: 8 / 0.012 = 667 requests/s per consumer at full batches
TABLE = ((1, 0.004), (8, 0.010))


def test_spread_counts_whole_partitions() -> None:
    # 2,000/s on 10 partitions with 451/s per consumer: 5 hold 2 partitions each (400/s) and keep up
    assert spread(2000, 451, 10) == 5
    # at 390/s per consumer 5 do not, and neither do 6-9 (the busiest still holds 2 partitions): 10
    assert spread(2000, 390, 10) == 10
    # on 20 partitions there are steps between: 7 hold 3 at most (300/s)
    assert spread(2000, 300, 20) == 7
    assert spread(0, 100, 10) == 1 and spread(1e9, 100, 10) == 10
    assert spread(50, math.inf, 10) == 1


def test_safe_rate_is_below_saturation_and_grows_with_the_share() -> None:
    full = 8 / (0.010 + 0.002)
    tight, loose = safe_rate(TABLE, 8, 0.03, overhead_s=0.002), safe_rate(TABLE, 8, 0.2, overhead_s=0.002)
    assert 0 < tight < loose <= full
    assert safe_rate(TABLE, 8, 0.005, overhead_s=0.002) == 0.0  # a lone request takes 6 ms: never within 5
    assert safe_rate(((1, 0.0),), 1, 0.01) == math.inf


def test_the_profile_rule_sizes_on_the_safe_rate_and_drains_lag() -> None:
    target = StageTarget("m", batch=8, batch_s=0.012, slo_share_s=0.05, max_consumers=12, safe_rate=100.0)
    family = [TokenBucket(rate=250.0, burst=40.0, window=0.1), TokenBucket(rate=180.0, burst=20.0, window=2.0)]
    # the 0.1-s window's burst is a batch's noise: the rate is the busiest window of at least a second
    c, why = profiled_consumers(family, target)
    assert c == 2 and "180.0/s" in why
    # 1,000 records behind, drained within DRAIN_S on top of the arrivals
    c, why = profiled_consumers(family, target, lag=1000)
    assert c == spread(180 + 1000 / DRAIN_S, 100, 12) and "lag 1000" in why
    assert profiled_consumers([], target)[0] == 1
    assert profiled_consumers(family, StageTarget("m", 8, 0.1, 0.05, max_consumers=12))[0] >= 1


def test_a_profiled_stage_keeps_scaling_up_while_it_settles() -> None:
    target = StageTarget("m", batch=8, batch_s=0.012, slo_share_s=0.05, max_consumers=20, safe_rate=100.0)
    ctl = Controller([target], hold_s=30, horizon_s=10, settle_s=5)
    step = [t / 80 for t in range(0, 800)]  # 80/s for 10 s
    ctl.observe(step)
    assert ctl.decide(10.0, {"m": 1}) == []
    ctl.observe([10 + t / 400 for t in range(400)])  # 400/s from t=10
    (first,) = ctl.decide(11.0, {"m": 1})
    # a second later the lag of the step shows: a larger need acts within the settle time
    (second,) = ctl.decide(12.0, {"m": first.after}, lags={"m": 3000})
    assert second.after > first.after
    # a smaller one does not (nor a scale-down) until the stage has settled
    assert ctl.decide(13.0, {"m": second.after}) == []


def test_a_scale_down_undone_soon_after_doubles_the_hold() -> None:
    target = StageTarget("m", batch=8, batch_s=0.012, slo_share_s=0.05, max_consumers=20, safe_rate=100.0)
    ctl = Controller([target], hold_s=10, horizon_s=2, settle_s=1)
    have, downs = 1, []

    def run(rate: float, start: int, end: int) -> None:
        nonlocal have
        for now in range(start, end):
            ctl.observe([now + i / rate for i in range(int(rate))])
            for action in ctl.decide(float(now + 1), {"m": have}):
                if action.after < have:
                    downs.append(now + 1)
                have = action.after

    # high, low, high again soon after the scale-down: the next scale-down waits twice the hold
    run(400, 0, 20)
    run(50, 20, 50)
    first = min(d for d in downs if d > 20)
    run(400, 50, 60)
    run(50, 60, 120)
    again = min(d for d in downs if d > 60)
    assert first - 20 <= 10 + 2 + 1 and again - 60 >= 2 * 10
    assert have == 1


def test_a_live_clock_a_little_late_each_tick_still_scales_down() -> None:
    target = StageTarget("m", batch=8, batch_s=0.012, slo_share_s=0.05, max_consumers=20, safe_rate=100.0)
    ctl = Controller([target], hold_s=3, horizon_s=2, settle_s=1)
    now, acts = 0.0, []
    while now < 20:  # every tick 0.51 s: no recorded need is ever exactly a hold old
        ctl.observe([now + i / 30 for i in range(15)])
        acts += ctl.decide(now + 0.51, {"m": 3})
        now += 0.51
    assert acts and acts[0].after == 1 and "below for" in acts[0].reason
