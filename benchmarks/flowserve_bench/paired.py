"""Comparisons of configurations measured in interleaved slices, with intervals that respect the slices.

This machine's speed drifts on its own: a fixed pure-Python loop takes 15 ms for a few seconds, then 25 ms
for a few more, with nothing else running (a VM whose host is shared). A configuration measured in one
block of seconds can land on a slow stretch and another on a fast one, which showed as ±30% between runs
of the same configuration. So the benches alternate configurations in short slices (a few seconds, shorter
than those stretches), slice ``i`` of every configuration taken back to back, and compare them over all
slices. Slowness then falls on every side alike.

Intervals come from a bootstrap over slice indices, each resample keeping slice ``i`` of every side
together: latencies within a slice are not independent (a stall delays everything in flight), so
resampling single latencies would claim more certainty than the data has.

Deployments differ too: two deployments of the same configuration, side by side, kept a 5-15% difference
in throughput or p99 over minutes (how their processes happened to land). So the benches deploy afresh in
several blocks, and the intervals resample blocks, then slices within them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

RESAMPLES = 1000
T = TypeVar("T")


@dataclass(slots=True)
class Slice:
    """One slice of one configuration: requests answered, seconds taken, their latencies in ms."""

    requests: int
    seconds: float
    latencies: list[float] = field(default_factory=list)


def balanced_order(labels: Sequence[T], rounds: int) -> list[T]:
    """The order in which configurations take their slices: each label ``rounds`` times (rounded up to a
    multiple of ``len(labels) - 1``), and every label right after every other equally often.

    Rotating the order is not enough: with three, ``abc bca cab`` puts ``a`` after ``c`` twice and after
    ``b`` once, so whatever a configuration leaves behind (a detector finishing its last windows, a
    broker cleaning up) lands more on one neighbour than the other. Here, for a prime number of labels,
    the walks ``0, k, 2k, ...`` (mod n) for ``k = 1 .. n-1`` together take every ordered pair once:
    ``abc acb`` for three. For any other number, an Eulerian circuit of the complete directed graph on the
    labels does the same (one exists for every ``n``: each label has ``n - 1`` ways in and out).
    """
    n = len(labels)
    if n < 2:
        raise ValueError(f"need at least two configurations to take turns, got {n}")
    if not any(n % d == 0 for d in range(2, n)):
        period = [labels[(i * k) % n] for k in range(1, n) for i in range(n)]
    else:
        period = [labels[i] for i in _every_pair_once(n)]
    return period * -(-rounds // (n - 1))


def _every_pair_once(n: int) -> list[int]:
    """A cyclic order of ``0 .. n-1`` in which every ordered pair of distinct labels is adjacent once
    (Hierholzer's walk over the complete directed graph)."""
    unused = {v: [w for w in range(n - 1, -1, -1) if w != v] for v in range(n)}
    stack, circuit = [0], []
    while stack:
        v = stack[-1]
        if unused[v]:
            stack.append(unused[v].pop())
        else:
            circuit.append(stack.pop())
    circuit.reverse()
    return circuit[:-1]  # the walk ends where it began


def throughput(slices: Sequence[Slice]) -> float:
    """Requests per second over all slices (total requests / total time)."""
    return sum(s.requests for s in slices) / sum(s.seconds for s in slices)


def p99(latencies: Sequence[float] | np.ndarray) -> float:
    return float(np.percentile(latencies, 99))


def summary(slices: Sequence[Slice]) -> dict[str, float]:
    """Throughput over all slices, and p50/p99 of every latency in them."""
    pooled = [x for s in slices for x in s.latencies]
    return {"throughput_rps": throughput(slices), "p50_ms": float(np.percentile(pooled, 50)), "p99_ms": p99(pooled),
            "n": len(pooled), "slices": len(slices)}


def block_members(blocks: Sequence[int]) -> list[list[int]]:
    """The slice indices of each block, blocks in order (``blocks``: the block of each slice index)."""
    return [[i for i, b in enumerate(blocks) if b == block] for block in sorted(set(blocks))]


def _resamples(count: int, resamples: int, seed: int, blocks: Sequence[int] | None = None) -> list[np.ndarray]:
    """Slice indices of each bootstrap resample. With ``blocks`` (the block of each slice index), blocks
    are drawn with replacement first and then slices within each drawn block: slices of one deployment
    share whatever that deployment has (how its processes landed), which no slice-level resample sees."""
    rng = np.random.default_rng(seed)
    if blocks is None or len(set(blocks)) < 2:
        return list(rng.integers(0, count, (resamples, count)))
    if len(blocks) != count:
        raise ValueError(f"need a block for each of the {count} slices, got {len(blocks)}")
    members = [np.asarray(m) for m in block_members(blocks)]
    out = []
    for _ in range(resamples):
        picked = rng.integers(0, len(members), len(members))
        out.append(np.concatenate([rng.choice(members[b], len(members[b])) for b in picked]))
    return out


def throughput_ratio(a: Sequence[Slice], b: Sequence[Slice], *, blocks: Sequence[int] | None = None,
                     resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float, float]:
    """Throughput of ``a`` / throughput of ``b`` over paired slices, and its 95% bootstrap interval
    (over blocks, then slices, when ``blocks`` gives each slice index its block)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need the same number of slices on both sides, got {len(a)} and {len(b)}")
    return sum_ratio([s.requests for s in a], [s.seconds for s in a], [s.requests for s in b],
                     [s.seconds for s in b], blocks=blocks, resamples=resamples, seed=seed)


def sum_ratio(num_a: Sequence[float], den_a: Sequence[float], num_b: Sequence[float], den_b: Sequence[float], *,
              blocks: Sequence[int] | None = None, resamples: int = RESAMPLES,
              seed: int = 0) -> tuple[float, float, float]:
    """``(sum num_a / sum den_a) / (sum num_b / sum den_b)`` over paired slices (index ``i`` of each list is
    slice ``i``: requests and seconds for throughput, CPU seconds and records for CPU per record), and its
    95% bootstrap interval over slice pairs (over blocks, then slices, when ``blocks`` is given)."""
    x = np.array([num_a, den_a, num_b, den_b], dtype=float)
    if x.shape[1] == 0:
        raise ValueError("need at least one slice pair")
    # A slice that answered nothing is zero throughput, not a missing slice: a side that stalls in some
    # slices is slower by that much. Where ``b``'s quotient is 0 in a resample the ratio is +inf; where
    # both are undefined it is NaN and left out of the interval.
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.array([(x[0, i].sum() / x[1, i].sum()) / (x[2, i].sum() / x[3, i].sum())
                           for i in _resamples(x.shape[1], resamples, seed, blocks)])
        point = float(np.float64(x[0].sum() / x[1].sum()) / np.float64(x[2].sum() / x[3].sum()))
    low, high = _interval(ratios)
    return point, low, high


def _interval(ratios: np.ndarray) -> tuple[float, float]:
    """The 95% percentile interval of bootstrap ratios, NaN (undefined) resamples left out."""
    if np.isnan(ratios).all():
        return float("nan"), float("nan")
    # interpolating next to an infinite ratio gives NaN (inf - inf): take the nearest resample there instead
    if np.isinf(ratios).any():
        low, high = np.nanpercentile(ratios, [2.5, 97.5], method="nearest")
    else:
        low, high = np.nanpercentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def _percentile(pool: list[np.ndarray], q: float) -> float:
    """The ``q``th percentile of the pooled latencies; +inf where nothing was answered (no finite tail)."""
    pooled = np.concatenate(pool) if pool else np.empty(0)
    return float(np.percentile(pooled, q)) if pooled.size else float("inf")


def percentile_ratio(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], *, q: float = 99,
                     blocks: Sequence[int] | None = None, resamples: int = RESAMPLES,
                     seed: int = 0) -> tuple[float, float, float]:
    """The ``q``th percentile (p99 by default) of every latency in ``a`` over that of ``b`` (``a[i]``,
    ``b[i]``: slice ``i``'s latencies on each side), and its 95% bootstrap interval over slice pairs
    (over blocks, then slices, when ``blocks`` gives each slice index its block)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need the same number of slices on both sides, got {len(a)} and {len(b)}")
    xa, xb = [np.asarray(s, dtype=float) for s in a], [np.asarray(s, dtype=float) for s in b]
    ratios = np.empty(resamples)
    # a side with no latency in a resample (every slice drawn answered nothing) has an unbounded tail
    with np.errstate(divide="ignore", invalid="ignore"):
        point = float(np.float64(_percentile(xa, q)) / _percentile(xb, q))
        for k, pick in enumerate(_resamples(len(a), resamples, seed, blocks)):
            ratios[k] = np.float64(_percentile([xa[i] for i in pick], q)) / _percentile([xb[i] for i in pick], q)
    low, high = _interval(ratios)
    return point, low, high


def gap_ratio(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], *, resamples: int = RESAMPLES,
              seed: int = 0) -> tuple[float, float, float]:
    """The tail gap (p99.9 - p50) of every latency in ``a`` over that of ``b`` (``a[i]``, ``b[i]``: slice
    ``i``'s latencies on each side), and its 95% bootstrap interval over slice pairs."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need the same number of slices on both sides, got {len(a)} and {len(b)}")

    def gap(xs: Sequence[Sequence[float]], pick: Sequence[int] | np.ndarray) -> float:
        pooled = np.concatenate([np.asarray(xs[i], dtype=float) for i in pick])
        p50, p999 = np.percentile(pooled, [50, 99.9])
        return float(p999 - p50)

    everything = list(range(len(a)))
    ratios = [gap(a, pick) / max(gap(b, pick), 1e-9) for pick in _resamples(len(a), resamples, seed)]
    low, high = np.percentile(ratios, [2.5, 97.5])
    return gap(a, everything) / max(gap(b, everything), 1e-9), float(low), float(high)
