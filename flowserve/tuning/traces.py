"""Arrival traces: generate them (seeded), save and load them in one simple file format.

A trace is the arrival times of requests, in seconds from its start. The file is JSON::

    {"format": "flowserve-trace/1", "kind": "gamma", "params": {"rate": 50, "cv": 4, ...},
     "seconds": 60.0, "arrivals_s": [0.0132, 0.0199, ...]}

Generators (each takes a ``numpy`` seed, so the same arguments give the same trace):

- ``poisson``: exponential inter-arrival times at ``rate``;
- ``gamma``: gamma inter-arrival times with mean ``1 / rate`` and coefficient of variation ``cv``
  (``cv = 1`` is Poisson; InferLine's bursty traces use CV 4);
- ``step``: Poisson at ``rate``, ``factor`` times that between ``at`` and ``at + length`` (a spike);
- ``diurnal``: Poisson whose rate follows one sine period over the trace, from ``rate * low`` up to
  ``rate`` (a day compressed into ``seconds``);
- ``mmpp``: a two-state Markov-modulated Poisson process, ``rate`` and ``rate * factor``, with mean dwell
  ``dwell`` seconds in each state;
- ``spike``: a step that is short and tall: ``factor`` (default 4) times ``rate`` for ``length`` (default
  5% of the trace) from ``at`` (default the middle).

:func:`at_scale` makes the cluster-scale traces of ``flowserve bench tuner --simulated`` (an hour, peak
2,000 req/s by default), :func:`load_trace` reads any trace file (``flowserve trace record`` writes them).

>>> t = generate("poisson", rate=100, seconds=10, seed=1)
>>> len(t.arrivals) > 900, t.arrivals[0] < t.arrivals[-1] < 10
(True, True)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.errors import FlowserveError
from flowserve.tuning.documents import read_document

TRACE_FORMAT = "flowserve-trace/1"
KINDS = ("poisson", "gamma", "step", "diurnal", "mmpp", "spike")


@dataclass(frozen=True)
class Trace:
    """Sorted arrival times in seconds over ``seconds``, and how they were made."""

    arrivals: np.ndarray
    seconds: float
    kind: str = "recorded"
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Mean arrivals per second."""
        return len(self.arrivals) / self.seconds if self.seconds > 0 else 0.0

    def scaled(self, factor: float) -> Trace:
        """The same trace ``factor`` times as fast (rate times ``factor``)."""
        return Trace(self.arrivals / factor, self.seconds / factor, self.kind, {**self.params, "speed": factor})

    def window(self, start: float, end: float) -> np.ndarray:
        """Arrivals in ``[start, end)``, relative to ``start``."""
        a = self.arrivals
        return a[(a >= start) & (a < end)] - start


def _renewal(rng: np.random.Generator, gaps: Any, seconds: float, mean_gap: float) -> np.ndarray:
    n = int(seconds / mean_gap * 1.5) + 64
    times = np.cumsum(gaps(n))
    while times[-1] < seconds:  # rare with CV > 1: draw more
        times = np.concatenate([times, times[-1] + np.cumsum(gaps(n))])
    return times[times < seconds]


def _thinned(rng: np.random.Generator, rate_at: Any, peak: float, seconds: float) -> np.ndarray:
    """A non-homogeneous Poisson process by thinning a homogeneous one at ``peak``."""
    candidates = _renewal(rng, lambda n: rng.exponential(1.0 / peak, n), seconds, 1.0 / peak)
    keep = rng.random(candidates.size) < rate_at(candidates) / peak
    return candidates[keep]


def generate(kind: str, *, rate: float, seconds: float, seed: int = 0, cv: float = 4.0, factor: float = 2.0,
             at: float | None = None, length: float | None = None, low: float = 0.25,
             dwell: float = 5.0) -> Trace:
    """A seeded trace of ``kind`` (see the module docstring for each kind's parameters)."""
    if rate <= 0 or seconds <= 0:
        raise FlowserveError(f"a trace needs rate > 0 and seconds > 0 (got rate {rate}, seconds {seconds})")
    rng = np.random.default_rng(seed)
    params: dict[str, Any] = {"rate": rate, "seed": seed}
    if kind == "poisson":
        arrivals = _renewal(rng, lambda n: rng.exponential(1.0 / rate, n), seconds, 1.0 / rate)
    elif kind == "gamma":
        if cv <= 0:
            raise FlowserveError(f"gamma trace: cv must be > 0, not {cv}")
        shape = 1.0 / (cv * cv)
        arrivals = _renewal(rng, lambda n: rng.gamma(shape, 1.0 / (rate * shape), n), seconds, 1.0 / rate)
        params["cv"] = cv
    elif kind in ("step", "spike"):
        spike = kind == "spike"
        start = (seconds / 2 if spike else seconds / 3) if at is None else at
        span = (seconds / 20 if spike else seconds / 3) if length is None else length
        factor = 4.0 if spike and factor == 2.0 else factor
        arrivals = _thinned(rng, lambda t: np.where((t >= start) & (t < start + span), rate * factor, rate),
                            rate * max(1.0, factor), seconds)
        params.update(factor=factor, at=start, length=span)
    elif kind == "diurnal":
        if not 0 < low <= 1:
            raise FlowserveError(f"diurnal trace: low must be in (0, 1], not {low}")
        # trough at the start and end, peak in the middle: one day compressed into `seconds`
        arrivals = _thinned(rng, lambda t: rate * (low + (1 - low) * 0.5 * (1 - np.cos(2 * math.pi * t / seconds))),
                            rate, seconds)
        params["low"] = low
    elif kind == "mmpp":
        arrivals = _mmpp(rng, rate, rate * factor, dwell, seconds)
        params.update(factor=factor, dwell=dwell)
    else:
        raise FlowserveError(f"unknown trace kind '{kind}' (kinds: {', '.join(KINDS)})")
    return Trace(np.asarray(arrivals, dtype=float), float(seconds), kind, params)


#: the cluster-scale traces: kind -> how each is made from its peak rate (see at_scale)
SCALE_KINDS = ("diurnal", "spike", "bursty", "mmpp")


def at_scale(name: str, *, peak: float = 2000.0, seconds: float = 3600.0, seed: int = 0) -> Trace:
    """A trace of issue 34's set, peaking at ``peak`` req/s: ``diurnal`` (trough 10% of the peak),
    ``spike`` (a quarter of the peak, 4x for 5% of the trace), ``bursty`` (gamma CV 4 at half the peak:
    its bursts pass the peak) and ``mmpp`` (a quarter of the peak and the peak, one-minute mean dwell)."""
    if name == "diurnal":
        trace = generate("diurnal", rate=peak, low=0.1, seconds=seconds, seed=seed)
    elif name == "spike":
        trace = generate("spike", rate=peak / 4, factor=4.0, length=seconds / 20, seconds=seconds, seed=seed)
    elif name == "bursty":
        trace = generate("gamma", rate=peak / 2, cv=4.0, seconds=seconds, seed=seed)
    elif name == "mmpp":
        trace = generate("mmpp", rate=peak / 4, factor=4.0, dwell=60.0, seconds=seconds, seed=seed)
    else:
        raise FlowserveError(f"unknown trace '{name}' (traces: {', '.join(SCALE_KINDS)})")
    return Trace(trace.arrivals, trace.seconds, name, {**trace.params, "kind": trace.kind, "peak": peak})


def _mmpp(rng: np.random.Generator, r0: float, r1: float, dwell: float, seconds: float) -> np.ndarray:
    parts, t, state = [], 0.0, 0
    while t < seconds:
        stay = min(rng.exponential(dwell), seconds - t)
        r = r1 if state else r0
        n = rng.poisson(r * stay)
        parts.append(t + np.sort(rng.random(n)) * stay)
        t += stay
        state ^= 1
    return np.concatenate(parts) if parts else np.zeros(0)


def save_trace(trace: Trace, path: str | Path) -> Path:
    target = Path(path)
    doc = {"format": TRACE_FORMAT, "kind": trace.kind, "params": trace.params, "seconds": trace.seconds,
           "arrivals_s": [round(float(a), 6) for a in trace.arrivals]}
    target.write_text(json.dumps(doc) + "\n")
    return target


def load_trace(path: str | Path) -> Trace:
    source = Path(path)
    doc = read_document(source, TRACE_FORMAT, "trace")
    arrivals = np.sort(np.asarray(doc.get("arrivals_s", []), dtype=float))
    if arrivals.size and (not np.isfinite(arrivals).all() or arrivals[0] < 0):
        raise FlowserveError(f"{source}: arrival times must be finite and >= 0")
    seconds = float(doc.get("seconds") or (arrivals[-1] if arrivals.size else 0.0))
    return Trace(arrivals, seconds, str(doc.get("kind", "recorded")), dict(doc.get("params") or {}))


def from_timestamps(timestamps_ms: list[int] | np.ndarray) -> Trace:
    """A trace from record timestamps (``flowserve trace record``): times relative to the first."""
    ts = np.sort(np.asarray(timestamps_ms, dtype=float)) / 1000.0
    if ts.size == 0:
        return Trace(np.zeros(0), 0.0)
    rel = ts - ts[0]
    return Trace(rel, float(rel[-1]) + 1e-3, "recorded", {})
