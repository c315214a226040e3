"""Network calculus for a pipeline of stages: arrival envelopes, service curves, delay and backlog bounds.

Pure functions on plain numbers (Le Boudec & Thiran, "Network Calculus", ch. 1):

- an **arrival curve** bounds the arrivals in any window of length t; a trace gives the token-bucket
  family ``(r_i, b_i)``, one bucket per window length ``w_i`` (doubling from a stage's service time up
  to 60 s): ``r_i = max count in a window of w_i / w_i`` and ``b_i`` the burst that makes
  ``b_i + r_i * t`` cover every window of length ``t`` <= ``w_i``; the curve is their minimum;
- a stage with ``c`` consumers, batch ``n`` and batch time ``l(n)`` offers the **rate-latency** service
  curve ``beta(t) = R (t - T)+`` with ``R = c n / l(n)`` and ``T = fill wait + l(n)``;
- stages in series convolve (min-plus) to rate ``min R_i`` and latency ``sum T_i``;
- the **delay bound** is the horizontal deviation of the arrival and service curves (``T + b / R`` for
  one token bucket), the **backlog bound** the vertical one (``b + r T``).

>>> round(delay_bound([TokenBucket(rate=50, burst=10)], RateLatency(rate=100, latency=0.02)), 6)
0.12
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: The longest window an envelope looks at (InferLine: 60 s).
MAX_WINDOW_S = 60.0


@dataclass(frozen=True, slots=True)
class TokenBucket:
    """``alpha(t) = burst + rate * t`` for t > 0 (and 0 at t = 0)."""

    rate: float
    burst: float
    window: float = math.inf  # the window length this bucket was measured over (informative)

    def __call__(self, t: float) -> float:
        return 0.0 if t <= 0 else self.burst + self.rate * t


@dataclass(frozen=True, slots=True)
class RateLatency:
    """``beta(t) = rate * (t - latency)+``."""

    rate: float
    latency: float

    def __call__(self, t: float) -> float:
        return self.rate * max(0.0, t - self.latency)


def windows(service_s: float, longest: float = MAX_WINDOW_S) -> list[float]:
    """Window lengths doubling from ``service_s`` up to ``longest`` (both included)."""
    if service_s <= 0:
        raise ValueError(f"the shortest window must be > 0, not {service_s}")
    out = []
    w = service_s
    while w < longest:
        out.append(w)
        w *= 2
    out.append(longest)
    return out


def max_arrivals(arrivals: np.ndarray, window: float) -> int:
    """The most arrivals in any window ``[t, t + window)`` (``arrivals`` sorted, in seconds)."""
    a = np.asarray(arrivals, dtype=float)
    if a.size == 0:
        return 0
    # the busiest window starts at an arrival: count those before start + window
    ends = np.searchsorted(a, a + window, side="left")
    return int((ends - np.arange(a.size)).max())


def envelope(arrivals: Sequence[float] | np.ndarray, service_s: float,
             longest: float = MAX_WINDOW_S) -> list[TokenBucket]:
    """The token-bucket family of a trace, one bucket per window length (see the module docstring).

    For window ``w_i`` the rate is ``N(w_i) / w_i``; the burst is the smallest ``b`` with
    ``b + r_i * w_j >= N(w_j)`` for every shorter window ``w_j`` (and ``b >= N(w_1)``, the busiest window
    as short as the service time, which the curve must admit at t -> 0+).
    """
    a = np.sort(np.asarray(arrivals, dtype=float))
    ws = windows(service_s, longest)
    return family(ws, [max_arrivals(a, w) for w in ws])


def family(ws: Sequence[float], counts: Sequence[int]) -> list[TokenBucket]:
    """The token buckets of :func:`envelope` from each window's most arrivals ``counts[i]`` in ``ws[i]``
    (for a caller that counts its windows another way, from an index over its trace)."""
    buckets = []
    for i, w in enumerate(ws):
        rate = counts[i] / w
        burst = max(counts[j] - rate * ws[j] for j in range(i + 1))
        buckets.append(TokenBucket(rate=rate, burst=max(burst, float(counts[0])), window=w))
    return buckets


def arrival_curve(family: Sequence[TokenBucket], t: float) -> float:
    """``alpha(t)``: the minimum of the family's buckets."""
    return min(b(t) for b in family)


def service_curve(consumers: int, batch: int, batch_seconds: float, fill_wait: float = 0.0) -> RateLatency:
    """The rate-latency curve of a stage: ``c`` consumers serving batches of ``n`` in ``l(n)`` each."""
    if consumers < 1 or batch < 1 or batch_seconds <= 0:
        raise ValueError("a stage needs >= 1 consumer, batch >= 1 and a positive batch time")
    return RateLatency(rate=consumers * batch / batch_seconds, latency=fill_wait + batch_seconds)


def convolve(curves: Sequence[RateLatency]) -> RateLatency:
    """Min-plus convolution of rate-latency curves in series: ``min R``, ``sum T`` (pay bursts only once)."""
    if not curves:
        raise ValueError("convolve needs at least one curve")
    return RateLatency(rate=min(c.rate for c in curves), latency=sum(c.latency for c in curves))


def delay_bound(family: Sequence[TokenBucket], beta: RateLatency) -> float:
    """Horizontal deviation of ``alpha = min(family)`` and ``beta``: the worst delay; inf when unstable.

    Against a rate-latency curve each bucket gives ``T + b / R`` (when ``r <= R``); the minimum of the
    family is bounded by each bucket, so the tightest bucket's bound holds.
    """
    bounds = [beta.latency + b.burst / beta.rate for b in family if b.rate <= beta.rate]
    return min(bounds) if bounds else math.inf


def backlog_bound(family: Sequence[TokenBucket], beta: RateLatency) -> float:
    """Vertical deviation: the most requests queued at the stage (its lag), ``b + r T``; inf when unstable."""
    bounds = [b.burst + b.rate * beta.latency for b in family if b.rate <= beta.rate]
    return min(bounds) if bounds else math.inf


# -- lower bounds: what no configuration with too few servers can avoid ---------------------------------

def window_counts(arrivals: np.ndarray, shortest: float, longest: float,
                  step: float = math.sqrt(2)) -> tuple[np.ndarray, np.ndarray]:
    """Window lengths growing by ``step`` from ``shortest`` to ``longest``, and the most arrivals in any
    window of each length (``arrivals`` sorted): the trace's arrival curve sampled finely enough to bound
    from below."""
    ws = [shortest]
    while ws[-1] * step < longest:
        ws.append(ws[-1] * step)
    ws.append(max(longest, shortest))
    return np.array(ws), np.array([max_arrivals(arrivals, w) for w in ws], dtype=float)


def fewest_servers(windows: np.ndarray, counts: np.ndarray, per_item_s: float, slack_s: float,
                   late: int) -> int:
    """The fewest servers for which a stage's maximum service curve does not already make ``late``
    requests miss their deadline.

    A server serves at most one request per ``per_item_s`` (its fastest batch's time per item). The
    ``counts[i]`` requests of the busiest window of length ``windows[i]`` all reach the stage after the
    window opens and must leave it within ``slack_s`` of the window's end; ``c`` servers serve at most
    ``c (w + slack) / per_item_s`` of them in that time, so at least ``N(w) - c (w + slack) / per_item_s``
    miss. That is the lower delay bound of network calculus (the arrival curve against the maximum service
    curve); the fewest servers are those for which it stays under ``late`` for every window.

    >>> fewest_servers(np.array([1.0]), np.array([100.0]), 0.01, 0.0, 1)  # 100 in 1 s at 10 ms each
    1
    >>> fewest_servers(np.array([1.0]), np.array([250.0]), 0.01, 0.0, 1)  # two serve 200 of them: 50 late
    3
    """
    if per_item_s <= 0:
        return 1
    # a negative slack (hops alone past the deadline) leaves the shortest windows no time at all: huge counts
    most = float(np.max((counts - late) * per_item_s / np.maximum(windows + slack_s, 1e-9)))
    return max(1, math.floor(most + 1e-9) + 1)
