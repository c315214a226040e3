"""The drift detectors' Kolmogorov-Smirnov test, vectorised over features (see :func:`ks_feature_scores`).

alibi-detect's ``KSDrift`` tests one feature at a time; :func:`ks_detector` gives it this test instead,
with the same results.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np


def ks_feature_scores(x_ref: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided two-sample Kolmogorov-Smirnov test of every feature (column) at once: p-values and
    statistics equal to ``scipy.stats.ks_2samp(..., method="asymp")`` per column, which is what
    alibi-detect's ``KSDrift`` calls in a loop, one feature at a time, sorting the reference each time.
    For digits (64 features, 1000 reference rows, windows of 100) that loop costs ~40 ms of CPU per
    window; this ~1 ms.

    Both samples are sorted together per column; the empirical CDFs are compared at the last position
    of each run of equal values (where ``searchsorted(side="right")`` evaluates them), so ties, common
    in pixel data, count as scipy counts them.
    """
    n_ref, n = len(x_ref), len(x)
    both = np.concatenate([x_ref, x])
    order = np.argsort(both, axis=0, kind="stable")
    values = np.take_along_axis(both, order, axis=0)
    from_ref = order < n_ref
    gap = np.abs(np.cumsum(from_ref, axis=0) / n_ref - np.cumsum(~from_ref, axis=0) / n)
    last = np.ones(values.shape, dtype=bool)
    last[:-1] = values[1:] != values[:-1]
    dist = np.where(last, gap, 0.0).max(axis=0)
    big, small = max(n_ref, n), min(n_ref, n)
    p_val = np.clip(_kstwo_sf(dist, float(np.round(big * small / (big + small)))), 0, 1)
    return p_val.astype(np.float32), dist.astype(np.float32)


_SF: dict[tuple[float, float], float] = {}


def _kstwo_sf(dist: np.ndarray, n: float) -> np.ndarray:
    """``scipy.stats.kstwo.sf(dist, n)``, remembered. scipy computes the exact distribution in Python
    loops, ~0.5 ms a value; but statistics of samples of fixed sizes fall on a lattice (multiples of
    1 / lcm(sizes)), so a detector sees the same few hundred values again and again."""
    from scipy.stats import kstwo

    keys = np.round(dist, 12).tolist()
    missing = sorted({k for k in keys if (k, n) not in _SF})
    if missing:
        if len(_SF) > 100_000:
            _SF.clear()
        _SF.update(zip(((k, n) for k in missing), kstwo.sf(np.asarray(missing), n).tolist(), strict=True))
    return np.asarray([_SF[(k, n)] for k in keys])


@functools.cache
def ks_detector(cd: Any) -> type:
    """alibi-detect's ``KSDrift`` with :func:`ks_feature_scores` in place of its per-feature loop; the
    rest (correction, threshold, the result's format) is alibi-detect's own. ``cd``: ``alibi_detect.cd``,
    imported by the caller (lazily)."""

    class KSDrift(cd.KSDrift):
        def feature_score(self, x_ref: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            if self.alternative != "two-sided":
                return super().feature_score(x_ref, x)
            return ks_feature_scores(x_ref.reshape(len(x_ref), -1), x.reshape(len(x), -1))

    return KSDrift
