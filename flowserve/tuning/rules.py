"""How the tuner sizes a stage: given what it knows of the stage and the live arrivals, how many consumers.

Three rules (``flowserve tune --rule``), each a pure function of a :class:`StageTarget`:

- ``profile`` (the default), **on the stage's measured capacity**: the live rate (the busiest window of at
  least ``RATE_WINDOW_S`` in the horizon, so a step shows within a second or two), scaled by the stage's
  share of the traffic, against one consumer's safe rate (:mod:`flowserve.tuning.capacity`: the most it
  serves with its p99 within its SLO share, found by the planner's simulator), spread over partitions
  (:func:`spread`); plus, where the caller reads it, the stage's lag drained within ``DRAIN_S``.
- ``bound``, **on the delay bound**: the live token-bucket envelope against the stage's rate-latency
  service curve ``R = c n / l(n)``, ``T = l(n)``: the fewest ``c`` whose delay bound ``T + b / R`` stays
  within the stage's SLO share and whose ``R`` covers every window's rate. The bound is the worst case of
  every burst of the last minute, so it provisions for more than a p99 needs (about twice the profile
  rule at thousands of requests per second: docs/benchmarks.md, tuner-simulated).
- ``relative``, **to the plan** (plans made by ``flowserve plan`` keep the envelope of their trace): the
  plan meets the SLO for that trace, so a stage needs its planned consumers times the most by which the
  live envelope exceeds the planned one; windows where the plan's trace had fewer than ``MIN_COUNT``
  arrivals are noise and left out. This is InferLine's trigger: act when the workload leaves the sample
  the plan was made for. The plan's envelope holds its own sample's noise, so it under-reacts to a change
  of rate and over-reacts to noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from flowserve.tuning.curves import TokenBucket, max_arrivals

#: how the controller sizes a stage (see the module docstring); the first is the default
RULES = ("profile", "bound", "relative")
#: a window where the plan's trace had fewer arrivals than this is left out of the ratio: 3 against 2 is noise
MIN_COUNT = 5
#: the profile rule's rate: the busiest window at least this long (shorter ones hold a batch's noise)
RATE_WINDOW_S = 1.0
#: the profile rule drains a stage's lag within this many seconds, on top of its arrivals
DRAIN_S = 10.0


@dataclass(frozen=True)
class StageTarget:
    """What the controller knows of a stage: its batch, batch time, SLO share and traffic share."""

    id: str
    batch: int
    batch_s: float
    slo_share_s: float
    traffic_share: float = 1.0
    max_consumers: int = 64
    #: the plan's consumers: what the plan's trace needs (the relative rule scales from it)
    consumers: int = 1
    #: requests/s one consumer serves within its SLO share at the p99 (:mod:`flowserve.tuning.capacity`);
    #: 0: not profiled, the profile rule uses the full-batch throughput
    safe_rate: float = 0.0


def needed_consumers(family: Sequence[TokenBucket], target: StageTarget, scale: float = 1.0) -> tuple[int, str]:
    """Consumers for the stage to bound its delay within its SLO share under ``family`` (times ``scale``)."""
    slack = target.slo_share_s - target.batch_s
    per_consumer = target.batch / target.batch_s
    if not family:
        return 1, "no arrivals"
    # alpha is the minimum of the buckets, so each bucket's bound holds: the tightest one decides
    worst, why = math.inf, ""
    for b in family:
        rate, burst = b.rate * scale * target.traffic_share, b.burst * scale * target.traffic_share
        need = max(rate, burst / slack) if slack > 0 else math.inf
        if need < worst:
            worst, why = need, f"window {b.window:.3g} s: rate {rate:.1f}/s, burst {burst:.1f}"
    if math.isinf(worst):
        return target.max_consumers, f"batch time {target.batch_s * 1000:.1f} ms exceeds the SLO share"
    c = spread(worst, per_consumer, target.max_consumers)
    return c, f"{why} -> needs {worst:.1f}/s of {per_consumer:.1f}/s per consumer"


def spread(rate: float, per_consumer: float, partitions: int) -> int:
    """The fewest consumers (at most ``partitions``) whose busiest one keeps up with its share of ``rate``.

    Kafka gives a consumer whole partitions: with ``c`` consumers on ``P`` partitions the busiest holds
    ``ceil(P / c)`` of them, so it carries ``rate * ceil(P / c) / P``, more than ``rate / c`` where ``c``
    does not divide ``P``. Sizing on the mean left 8 consumers on 10 partitions with two at 98% of
    their capacity, whose backlog from a spike never drained (docs/benchmarks.md, tuner-simulated); and
    8 consumers there serve no better than 5, which also hold two partitions at most."""
    partitions = max(1, partitions)
    for c in range(max(1, math.ceil(rate / per_consumer - 1e-9)), partitions + 1):
        if rate * math.ceil(partitions / c) / partitions <= per_consumer * (1 + 1e-9):
            return c
    return partitions


def plan_excess(arrivals: np.ndarray, planned: Sequence[tuple[float, int]],
                count: Callable[[np.ndarray, float], int] = max_arrivals) -> tuple[float, str]:
    """The most by which the live envelope exceeds the plan's at any window (0 without arrivals), and where.
    The same for every stage: the relative rule computes it once per decision. ``count`` is
    :func:`~flowserve.tuning.curves.max_arrivals` (a simulated clock passes an indexed equivalent)."""
    if arrivals.size == 0:
        return 0.0, "no arrivals"
    counted = [(w, n) for w, n in planned if n >= MIN_COUNT] or list(planned)
    factor, why = 0.0, ""
    for w, n in counted:
        live = count(arrivals, w)
        if live / max(n, 1) > factor:
            factor = live / max(n, 1)
            why = f"window {w:.3g} s: {live} arrivals where the plan's trace had {n}"
    return factor, why


def relative_consumers(excess: tuple[float, str], target: StageTarget, scale: float = 1.0) -> tuple[int, str]:
    """InferLine's rule: the plan meets the SLO for its trace, so a stage needs its planned consumers times
    the plan's :func:`plan_excess` (``scale`` inflates it)."""
    factor, why = excess
    if factor == 0:
        return 1, why
    c = max(1, math.ceil(target.consumers * factor * scale - 1e-9))
    return min(c, target.max_consumers), f"{why} -> x{factor:.2f} of the plan's {target.consumers} consumer(s)"


def profiled_consumers(family: Sequence[TokenBucket], target: StageTarget, scale: float = 1.0,
                       lag: int = 0) -> tuple[int, str]:
    """The profile rule (module docstring): the busiest rate of at least ``RATE_WINDOW_S`` (times
    ``scale``) plus ``lag`` drained within ``DRAIN_S``, against one consumer's safe rate, spread."""
    per_consumer = target.safe_rate or target.batch / target.batch_s
    if not family and not lag:
        return 1, "no arrivals"
    long = [b for b in family if b.window >= RATE_WINDOW_S] or list(family)
    busiest = max(long, key=lambda b: b.rate, default=None)
    rate = busiest.rate * scale * target.traffic_share if busiest is not None else 0.0
    need = rate + lag / DRAIN_S
    why = (f"window {busiest.window:.3g} s: rate {rate:.1f}/s" if busiest is not None else "no arrivals")
    if lag:
        why += f", lag {lag} drained in {DRAIN_S:.0f} s"
    if per_consumer <= 0:
        return target.max_consumers, f"a lone batch exceeds the SLO share of {target.slo_share_s * 1000:.0f} ms"
    c = spread(need, per_consumer, target.max_consumers)
    return c, f"{why} -> {need:.1f}/s of {per_consumer:.1f}/s per consumer"
