"""What one consumer of a stage can take within its share of the SLO: the profile the tuner sizes from.

A Kafka consumer serves the partitions it owns alone, so a stage is as many independent queues as it
has consumers, each fed its partitions' share of the traffic. One consumer's **safe rate** is the highest
Poisson arrival rate at which the ``percentile`` of its latency (waiting for a batch plus the batch itself)
stays within the stage's share of the SLO; the tuner then asks how many consumers keep the busiest one
under it (:func:`flowserve.tuning.rules.spread`).

It is found by simulation (:func:`flowserve.tuning.simulate.simulate`, the planner's simulator), on a
bisection over the rate with one seeded draw of gaps rescaled per rate (common random numbers, so the
answer moves smoothly with its inputs). The delay bound of network calculus
(:func:`flowserve.tuning.rules.needed_consumers`) answers the same question for the worst burst of the
last minute instead of the percentile, and so provisions about twice what the percentile needs at
thousands of requests per second (docs/benchmarks.md, tuner-simulated).

>>> rate = safe_rate(((1, 0.01),), 1, 0.1)
>>> 40 < rate < 100  # 10 ms per request, one at a time: ~100/s at saturation, less to keep p99 in 100 ms
True
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from flowserve.tuning.simulate import SimStage, batch_time, simulate

#: requests per probe: enough that the 99th percentile rests on a hundred of them
SAMPLES = 20_000
#: bisection steps: the rate to within 2^-12 of one consumer's full-batch throughput
STEPS = 12


@functools.lru_cache(maxsize=256)
def safe_rate(table: Sequence[tuple[int, float]], batch: int, share_s: float, *, overhead_s: float = 0.0,
              jitter: float = 0.05, percentile: float = 99.0, seed: int = 0) -> float:
    """Requests/s one consumer (``table``: batch size -> seconds, as ``((size, seconds), ...)`` so it can
    be cached; batches up to ``batch``; ``overhead_s`` per batch) serves with its ``percentile`` latency
    within ``share_s``. 0 when a lone request already takes longer."""
    times = dict(table)
    if batch_time(times, 1) + overhead_s > share_s:
        return 0.0
    if batch_time(times, batch) + overhead_s <= 0:
        return math.inf  # a stage that takes no time (an identity node without overhead) is never the limit
    full = batch / (batch_time(times, batch) + overhead_s)
    gaps = np.random.default_rng(seed).exponential(1.0, SAMPLES)
    unit = np.cumsum(gaps)
    stage = SimStage("stage", times, inputs=[(None, "x")], consumers=1, max_batch=batch, output=True)

    def meets(rate: float) -> bool:
        result = simulate([stage], unit / rate, partitions=1, hop_s=0.0, jitter=jitter, seed=seed,
                          overhead_s=overhead_s)
        return result.percentile(percentile) <= share_s

    lo, hi = 0.0, full
    if meets(hi):
        return hi
    for _ in range(STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    # 0 only where jitter alone pushes a lone request past the share: the caller sizes to the partitions
    return lo
