"""Execution-time profiles per batch size, and the profile file beside a topology.

**Profiles** (Clockwork's estimator). Execution time per batch size is predictable, so a node keeps,
per batch size, a sliding window of the last measured ``process`` times and predicts the next one as
their 99th percentile. ``flowserve profile TOPOLOGY`` seeds the profile by sweeping batch sizes
1, 2, 4, ... offline and saves it beside the topology (``<topology>.profile.json``); the worker loads it
at start and keeps it live with every batch it runs. Between profiled sizes the prediction is linear;
beyond the largest it grows with the per-item cost of the largest (pessimistic: batching is sublinear).
Predictions never decrease with the batch size: figures that disagree are pooled (weighted isotonic
regression), so a noisy spike at one size is not carried to every larger one; nor do they grow faster
than the batch (a larger batch never costs more per request than a smaller one); a size measured fewer than
``MIN_LIVE`` times live keeps its seeded figure (or none), scaled by how the live runs compare with the
seeds (a profile taken on a busier or quieter machine than the one serving).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowserve.errors import FlowserveError

if TYPE_CHECKING:
    from flowserve.topology.graph import Topology

PROFILE_FORMAT = "flowserve-profile/1"
#: Measurements kept per batch size (Clockwork keeps a short window of recent runs).
WINDOW = 100
#: Live samples at a batch size before they replace the seeded figure for it.
MIN_LIVE = 10


class ExecProfile:
    """Execution time per batch size: a sliding window of measurements, its p99 and p50, plus seeded figures.

    >>> p = ExecProfile(seed={1: 0.002, 8: 0.004})
    >>> round(p.p99(4) * 1000, 3)  # linear between profiled sizes
    3.143
    """

    def __init__(self, seed: dict[int, float] | None = None, *, window: int = WINDOW,
                 min_live: int = MIN_LIVE, seed_p50: dict[int, float] | None = None,
                 refresh_s: float = 0.0) -> None:
        self.window = window
        self.min_live = min_live
        #: predictions may lag the newest measurements by this long. A worker observes every batch and
        #: plans every step: rebuilding the tables (percentiles, isotonic fit) after each observation was a
        #: large share of a small stage's step, and a window of ``window`` runs barely moves in 50 ms.
        self.refresh_s = refresh_s
        self.seed: dict[int, float] = _positive(seed)
        #: seeded medians (``p50_s`` of a profile file); a size without one uses its p99 figure.
        self.seed_p50: dict[int, float] = _positive(seed_p50)
        self._runs: dict[int, deque[float]] = {}
        self._tables: dict[int, tuple[list[int], list[float]]] = {}
        #: q -> predictions by batch size (index = size), extended as planning asks; rebuilt with the tables
        self._curves: dict[int, list[float]] = {}
        self._built_at = 0.0  # time.monotonic() of the tables' build
        self._stale = False  # measurements arrived since the tables were built (see _build)
        self._pct: dict[tuple[int, int], float] = {}  # (size, q) -> percentile of that size's window
        self._lock = threading.Lock()

    # -- measurements ----------------------------------------------------------------------------

    def observe(self, size: int, seconds: float) -> None:
        """Record one batch of ``size`` requests that took ``seconds``."""
        if size <= 0 or not math.isfinite(seconds) or seconds < 0:
            return
        with self._lock:
            runs = self._runs.get(size)
            if runs is None:
                runs = self._runs[size] = deque(maxlen=self.window)
            runs.append(seconds)
            self._pct.pop((size, 99), None)
            self._pct.pop((size, 50), None)
            self._stale = True

    def samples(self, size: int) -> int:
        return len(self._runs.get(size, ()))

    def measured_p99(self, size: int) -> float | None:
        """p99 of the live window at exactly ``size`` (None without measurements)."""
        runs = self._runs.get(size)
        if not runs:
            return None
        return _percentile(list(runs), 99)

    # -- prediction ------------------------------------------------------------------------------

    def known(self, q: int = 99) -> dict[int, float]:
        """Per batch size, the figure predictions use: the live ``q``-th percentile once it has ``min_live``
        runs, else the seed (for p50: the seeded median, else the p99 figure). A size seen only a few times
        live is used only while nothing better is known (one noisy run must not set a figure)."""
        return {size: v for size, (v, _) in self._figures(q).items()}

    def _figures(self, q: int) -> dict[int, tuple[float, int]]:
        """size -> (figure, weight): weight = live runs behind it, or ``min_live`` for a seeded figure."""
        out = {size: (v, self.min_live) for size, v in self.seed.items()}
        if q != 99:
            out.update({size: (v, self.min_live) for size, v in self.seed_p50.items()})
        sparse: dict[int, tuple[float, int]] = {}
        live: dict[int, tuple[float, int]] = {}
        for size, runs in list(self._runs.items()):
            if not runs:
                continue
            if len(runs) >= self.min_live:
                live[size] = (self._percentile_of(size, q, runs), len(runs))
            elif size not in out:
                sparse[size] = (self._percentile_of(size, q, runs), len(runs))
        if live and out:
            # Seeds are a shape; the live runs say the level. A profile taken on a busier (or quieter)
            # machine than the one serving would otherwise keep its figures at every size not yet run
            # live, so the seeds move by the typical live/seeded ratio (median weighted by runs).
            scale = _calibration(out, live)
            out = {size: (v * scale, w) for size, (v, w) in out.items()}
        out.update(live)
        if not out:
            return sparse
        return out

    def _percentile_of(self, size: int, q: int, runs: deque[float]) -> float:
        value = self._pct.get((size, q))
        if value is None:
            value = self._pct[(size, q)] = _percentile(list(runs), q)
        return value

    @property
    def ready(self) -> bool:
        """Seeded from a profile file, or measured at two batch sizes at least ``min_live`` times each."""
        return bool(self.seed) or sum(len(r) >= self.min_live for r in self._runs.values()) >= 2

    def _build(self, q: int) -> tuple[list[int], list[float]]:
        if self._stale and time.monotonic() - self._built_at >= self.refresh_s:
            self._stale, self._tables, self._curves = False, {}, {}
        table = self._tables.get(q)
        if table is None:
            with self._lock:
                if not self._tables:
                    self._built_at = time.monotonic()
                figures = self._figures(q)
                sizes = sorted(figures)
                # A larger batch never takes less time than a smaller one: where the figures disagree, the
                # noise is pooled (weighted isotonic regression), not a spike carried to every larger size.
                values = _isotonic([figures[s][0] for s in sizes], [figures[s][1] for s in sizes])
                # Nor does it cost more per request than a smaller one: b requests can always run as
                # b / a batches of a. A sweep taken while something else held the CPU says otherwise.
                for i in range(1, len(sizes)):
                    values[i] = min(values[i], values[i - 1] * sizes[i] / sizes[i - 1])
                table = self._tables[q] = (sizes, values)
        return table

    def p99(self, size: int) -> float | None:
        """Predicted p99 execution time (seconds) of a batch of ``size``; None when nothing is known."""
        return self._predict(99, size)

    def p50(self, size: int) -> float | None:
        """Predicted median execution time (seconds) of a batch of ``size``; None when nothing is known."""
        return self._predict(50, size)

    def curve(self, q: int, upto: int) -> list[float]:
        """Predicted ``q``-th percentile seconds for every batch size from 0 to ``upto`` (index = size; 0.0
        where nothing is known). The batch planner reads a prediction per candidate size on every step:
        interpolating each one was a tenth of a small stage's worker CPU at high load (flowserve bench
        hop-cpu), where a list lookup costs next to nothing."""
        sizes, values = self._build(q)  # first: a rebuild drops the curves
        curve = self._curves.get(q)
        if curve is None:
            curve = self._curves[q] = [0.0]
        if len(curve) <= upto:
            curve.extend(_interpolate(sizes, values, b) if sizes else 0.0 for b in range(len(curve), upto + 1))
        return curve

    def _predict(self, q: int, size: int) -> float | None:
        sizes, values = self._build(q)
        if not sizes:
            return None
        return _interpolate(sizes, values, size)

    # -- persistence -----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        known, median = self.known(), self.known(50)
        return {"p99_s": {str(k): known[k] for k in sorted(known)},
                "p50_s": {str(k): median[k] for k in sorted(median)},
                "samples": {str(k): len(v) for k, v in sorted(self._runs.items())}}

    @classmethod
    def from_dict(cls, data: dict[str, Any], **kwargs: Any) -> ExecProfile:
        raw = data.get("p99_s")
        if not isinstance(raw, dict):
            raise ValueError("a node profile needs a 'p99_s' mapping of batch size -> seconds")
        medians = data.get("p50_s") or {}
        try:
            seed = {int(k): float(v) for k, v in raw.items()}
            seed_p50 = {int(k): float(v) for k, v in medians.items()}
        except (TypeError, ValueError, AttributeError):
            raise ValueError("'p99_s'/'p50_s' keys must be batch sizes and values seconds") from None
        return cls(seed, seed_p50=seed_p50, **kwargs)


def _calibration(seeded: dict[int, tuple[float, int]], live: dict[int, tuple[float, int]]) -> float:
    """The weighted median of live figure / seeded prediction over the sizes run live (1.0: no change)."""
    sizes = sorted(seeded)
    values = [seeded[s][0] for s in sizes]
    ratios: list[tuple[float, int]] = []
    for size, (figure, runs) in live.items():
        expected = _interpolate(sizes, values, size)
        if expected > 0:
            ratios.append((figure / expected, runs))
    if not ratios:
        return 1.0
    ratios.sort()
    half, seen = sum(w for _, w in ratios) / 2, 0
    for ratio, weight in ratios:
        seen += weight
        if seen >= half:
            return ratio
    return ratios[-1][0]


def _interpolate(sizes: list[int], values: list[float], size: int) -> float:
    """Linear between known sizes, the per-item cost of the largest beyond it (``sizes`` sorted, non-empty)."""
    if size <= sizes[0]:
        return values[0]
    if size >= sizes[-1]:
        return values[-1] * size / sizes[-1]
    lo = _bisect(sizes, size)
    s0, s1, v0, v1 = sizes[lo], sizes[lo + 1], values[lo], values[lo + 1]
    return v0 + (v1 - v0) * (size - s0) / (s1 - s0)


def _positive(seed: dict[int, float] | None) -> dict[int, float]:
    return {int(k): float(v) for k, v in (seed or {}).items() if v > 0 and int(k) > 0}


def _isotonic(values: list[float], weights: list[int]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, float(max(w, 1)), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    out: list[float] = []
    for mean, _, count in blocks:
        out.extend([mean] * int(count))
    return out


def _bisect(sizes: list[int], size: int) -> int:
    lo, hi = 0, len(sizes) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if sizes[mid] <= size:
            lo = mid
        else:
            hi = mid
    return lo


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), without importing numpy on the hot path."""
    values = sorted(values)
    if len(values) == 1:
        return values[0]
    pos = (len(values) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


# -- profile files ------------------------------------------------------------------------------

def profile_path(topology_source: str | Path) -> Path:
    """``topologies/digits.yaml`` -> ``topologies/digits.profile.json``."""
    path = Path(topology_source)
    return path.with_name(f"{path.stem}.profile.json")


def load_profiles(path: str | Path) -> dict[str, dict[str, Any]]:
    """The per-node entries of a profile file, or {} when there is none. Raises on a malformed file."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise FlowserveError(f"{path}: cannot read profile: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FlowserveError(f"{path}: not a JSON profile ({exc}); rerun 'flowserve profile'") from None
    if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT or not isinstance(data.get("nodes"), dict):
        raise FlowserveError(f"{path}: not a {PROFILE_FORMAT} file; rerun 'flowserve profile'")
    return data["nodes"]


def save_profiles(path: str | Path, nodes: dict[str, dict[str, Any]], *, topology: str, device: str) -> None:
    """Write (merging into an existing file) per-node profiles, atomically."""
    path = Path(path)
    merged = load_profiles(path) if path.exists() else {}
    merged.update(nodes)
    body = {"format": PROFILE_FORMAT, "topology": topology, "device": device,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "nodes": merged}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(body, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def node_profile(entries: dict[str, dict[str, Any]], node_id: str) -> ExecProfile | None:
    entry = entries.get(node_id)
    if not entry:
        return None
    try:
        return ExecProfile.from_dict(entry)
    except ValueError as exc:
        raise FlowserveError(f"profile of node '{node_id}': {exc}") from None


def load_node_profiles(topology: Topology) -> dict[str, ExecProfile | None]:
    """Every node's seeded profile from the file beside the topology ({} when there is none)."""
    entries = load_profiles(profile_path(topology.source)) if topology.source else {}
    return {n: node_profile(entries, n) for n in topology.nodes}


def sizes_to_profile(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to and including ``max_batch``."""
    out, s = [], 1
    while s < max_batch:
        out.append(s)
        s *= 2
    out.append(max_batch)
    return out
