"""SLO attainment over interleaved slices: each policy's share of requests answered within the SLO, and
paired differences between policies, with 95% bootstrap intervals over slice indices.

A cell's slices are taken in :func:`~flowserve_bench.paired.balanced_order`, and slice ``i`` of every
policy replays the same arrival trace (same seed), so slice ``i`` of two policies form a pair: the
bootstrap resamples slice indices and keeps each pair together, as :mod:`flowserve_bench.paired` does for
throughput. Attainment pools requests over the resampled slices (sum within / sum sent), so a slice with
more requests weighs more, as it does in the point estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000


@dataclass(frozen=True, slots=True)
class Tally:
    """One slice of one policy: requests sent, and how many were answered without error within the SLO."""

    sent: int
    within: int


def _arrays(slices: Sequence[Tally]) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([s.sent for s in slices], dtype=float), np.array([s.within for s in slices], dtype=float))


def _picks(count: int, resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, count, (resamples, count))


def attainment(slices: Sequence[Tally], *, resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float, float]:
    """Pooled attainment (within / sent over all slices) and its 95% bootstrap interval over slices."""
    if not slices:
        raise ValueError("need at least one slice")
    sent, within = _arrays(slices)
    if sent.sum() == 0:
        return 1.0, 1.0, 1.0
    picks = _picks(len(slices), resamples, seed)
    boot = within[picks].sum(axis=1) / np.maximum(sent[picks].sum(axis=1), 1)
    low, high = np.percentile(boot, [2.5, 97.5])
    return float(within.sum() / sent.sum()), float(low), float(high)


def difference(a: Sequence[Tally], b: Sequence[Tally], *, resamples: int = RESAMPLES,
               seed: int = 0) -> tuple[float, float, float]:
    """Attainment of ``a`` minus that of ``b`` over paired slices (``a[i]``, ``b[i]``: the same trace), and
    its 95% bootstrap interval; each resample draws slice indices and keeps the pairs together."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need the same number of slices on both sides, got {len(a)} and {len(b)}")
    sa, wa = _arrays(a)
    sb, wb = _arrays(b)
    picks = _picks(len(a), resamples, seed)
    boot = (wa[picks].sum(axis=1) / np.maximum(sa[picks].sum(axis=1), 1)
            - wb[picks].sum(axis=1) / np.maximum(sb[picks].sum(axis=1), 1))
    low, high = np.percentile(boot, [2.5, 97.5])
    point = wa.sum() / max(sa.sum(), 1) - wb.sum() / max(sb.sum(), 1)
    return float(point), float(low), float(high)
