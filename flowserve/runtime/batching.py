"""SLO-aware batching: execution-time profiles, the deadline-driven policy, the timeout batcher.

**Profiles** (Clockwork's estimator). Execution time per batch size is predictable, so a node keeps,
per batch size, a sliding window of the last measured ``process`` times and predicts the next one as
their 99th percentile. ``flowserve profile TOPOLOGY`` seeds the profile by sweeping batch sizes
1, 2, 4, ... offline and saves it beside the topology (``<topology>.profile.json``); the worker loads it
at start and keeps it live with every batch it runs. Between profiled sizes the prediction is linear;
beyond the largest it grows with the per-item cost of the largest (pessimistic: batching is sublinear).
Predictions never decrease with the batch size: figures that disagree are pooled (weighted isotonic
regression), so a noisy spike at one size is not carried to every larger one; a size measured fewer than
``MIN_LIVE`` times live keeps its seeded figure (or none).

**Deadline budget.** A request's remaining time is split between this node and the stages after it:
first ``hop_ms`` per Kafka hop still ahead (the hops to each downstream stage and to the outputs topic)
is set aside, then the node gets the share ``p1(node) / (p1(node) + p1(critical downstream path))`` of
the rest, where ``p1`` is a node's profiled p99 at batch 1 and the critical path is the downstream chain
with the largest sum of ``p1``. A node without a profile weighs as much as this one (the implicit
``outputs`` join weighs nothing once others are profiled); without any profile every stage weighs the same.

**SLOPolicy.** Per step the worker hands the policy the deadlines of the fetched requests in FIFO order
(at most ``window`` of them: planning costs O(window) per batch, never O(queue) per request).

* *Admission*: a request is refused at once only when it is infeasible even if it ran next, alone:
  ``now + p50(1)`` (its typical time alone) plus the hops and the fastest downstream path ends past its
  deadline (Clockwork: refuse rather than finish late). Nothing that could still make it is refused on
  predicted queueing.
* *Batch*: the largest batch ``b``, no larger than what is queued and the node's maximum, whose predicted
  **p99** lets the earliest node-deadline in it be met. When that is smaller than a full batch and more is
  queued, a full batch is taken when two full batches are queued (a backlog), and otherwise considered:
  both are scored by the misses they predict over the window,
  the chosen batch at its p99 and the batches queued behind it at their **p50** (summing p99s over
  several batches is far too pessimistic); the full batch wins ties (under load throughput is what
  drains the queue and so helps the later deadlines). Only the first batch runs; the worker re-plans with
  the real clock after it. Batches are prefixes of the queue, so a new request never overtakes an old one.

Until the profile knows two batch sizes the policy falls back to Clipper's AIMD: grow the batch by one
while a full batch takes under 90% of its budget, multiply it by 0.9 on a violation.

Policies are plain objects with a fake-clock-friendly API: ``plan(deadlines_ms, now_ms)``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowserve.errors import FlowserveError
from flowserve.runtime.policy import BatchPolicy, FixedPolicy, LagPolicy, Plan
from flowserve.wire.envelope import deadline_of  # re-exported: batching callers read deadlines

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
                 min_live: int = MIN_LIVE, seed_p50: dict[int, float] | None = None) -> None:
        self.window = window
        self.min_live = min_live
        self.seed: dict[int, float] = _positive(seed)
        #: seeded medians (``p50_s`` of a profile file); a size without one uses its p99 figure.
        self.seed_p50: dict[int, float] = _positive(seed_p50)
        self._runs: dict[int, deque[float]] = {}
        self._tables: dict[int, tuple[list[int], list[float]]] = {}
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
            self._tables = {}
            self._pct.pop((size, 99), None)
            self._pct.pop((size, 50), None)

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
        for size, runs in list(self._runs.items()):
            if not runs:
                continue
            if len(runs) >= self.min_live:
                out[size] = (self._percentile_of(size, q, runs), len(runs))
            elif size not in out:
                sparse[size] = (self._percentile_of(size, q, runs), len(runs))
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
        table = self._tables.get(q)
        if table is None:
            with self._lock:
                figures = self._figures(q)
                sizes = sorted(figures)
                # A larger batch never takes less time than a smaller one: where the figures disagree, the
                # noise is pooled (weighted isotonic regression), not a spike carried to every larger size.
                values = _isotonic([figures[s][0] for s in sizes], [figures[s][1] for s in sizes])
                table = self._tables[q] = (sizes, values)
        return table

    def p99(self, size: int) -> float | None:
        """Predicted p99 execution time (seconds) of a batch of ``size``; None when nothing is known."""
        return self._predict(99, size)

    def p50(self, size: int) -> float | None:
        """Predicted median execution time (seconds) of a batch of ``size``; None when nothing is known."""
        return self._predict(50, size)

    def _predict(self, q: int, size: int) -> float | None:
        sizes, values = self._build(q)
        if not sizes:
            return None
        if size <= sizes[0]:
            return values[0]
        if size >= sizes[-1]:
            return values[-1] * size / sizes[-1]
        lo = _bisect(sizes, size)
        s0, s1, v0, v1 = sizes[lo], sizes[lo + 1], values[lo], values[lo + 1]
        return v0 + (v1 - v0) * (size - s0) / (s1 - s0)

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


# -- deadline budget ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Budget:
    """How much of a request's remaining time this node may spend (see the module docstring).

    ``share``: fraction of the remaining time (after the hop allowance) that is this node's.
    ``reserve_s``: time set aside for the Kafka hops still ahead.
    ``downstream_s``: the fastest the stages after this node can be (p1 along the critical path).
    """

    share: float = 1.0
    reserve_s: float = 0.002
    downstream_s: float = 0.0

    def node_deadline(self, deadline_ms: float, now_ms: float) -> float:
        """The time (ms) by which this node should have finished a request due at ``deadline_ms``."""
        left = deadline_ms - now_ms - self.reserve_s * 1000
        return now_ms + self.share * left

    def latest_finish(self, deadline_ms: float) -> float:
        """After this time (ms) the request cannot make its deadline even with downstream at its fastest."""
        return deadline_ms - (self.reserve_s + self.downstream_s) * 1000


def budget_for(topology: Topology, node_id: str, profiles: dict[str, ExecProfile | None],
               hop_ms: float = 2.0) -> Budget:
    """The :class:`Budget` of ``node_id``: its p1 against the critical downstream path's."""
    children: dict[str, set[str]] = {n: set() for n in topology.nodes}
    for n, node in topology.nodes.items():
        for src in node.sources:
            if src.node is not None and src.node in children:
                children[src.node].add(n)

    from flowserve.topology.graph import Collect

    def p1(n: str) -> float | None:
        prof = profiles.get(n)
        if prof is None and isinstance(topology.nodes[n].component, Collect) and profiles:
            return 0.0  # the implicit outputs join costs next to nothing once other stages are profiled
        return prof.p99(1) if prof is not None else None

    own = p1(node_id)
    known = [v for v in (p1(n) for n in topology.nodes) if v is not None]
    default = own if own is not None else (sum(known) / len(known) if known else 1.0)

    def longest(n: str, seen: frozenset[str]) -> tuple[float, int, float]:
        """(sum of p1 weights, hops, sum of known p1 seconds) along the heaviest path after ``n``."""
        best = (0.0, 0, 0.0)
        for m in children[n]:
            if m in seen:
                continue
            w, hops, secs = longest(m, seen | {m})
            v = p1(m)
            cand = (w + (v if v is not None else default), hops + 1, secs + (v or 0.0))
            if cand > best:
                best = cand
        return best

    weight, hops, downstream = longest(node_id, frozenset({node_id}))
    mine = own if own is not None else default
    share = mine / (mine + weight) if mine + weight > 0 else 1.0
    return Budget(share=share, reserve_s=(hops + 1) * hop_ms / 1000, downstream_s=downstream)


# -- policies -----------------------------------------------------------------------------------

@dataclass
class SLOPolicy:
    """The largest batch whose predicted p99 still meets the earliest deadline in it; refuse the hopeless.

    Example with a fake clock (deadlines and ``now`` in epoch milliseconds)::

        policy = SLOPolicy(max_batch=32, profile=ExecProfile({1: 0.001, 32: 0.010}))
        policy.plan([1_000_050.0] * 40, now_ms=1_000_000.0)   # Plan(take=32, refuse={})
    """

    max_batch: int = 256
    profile: ExecProfile = field(default_factory=ExecProfile)
    budget: Budget = field(default_factory=Budget)
    #: fetch and plan over up to ``lookahead * max_batch`` queued records (the planning window).
    lookahead: int = 4
    max_wait_ms: float = 0.0
    #: AIMD state (used while the profile is not ready).
    aimd_size: int = 1
    _aimd_budget_s: float | None = field(default=None, repr=False)
    _aimd_full: bool = field(default=False, repr=False)

    def next_size(self, lag: int) -> int:
        cap = self.max_batch * self.lookahead
        return max(1, min(lag, cap)) if lag > 0 else self.max_batch

    @property
    def window(self) -> int:
        """Most queued requests one ``plan`` looks at (the worker hands it no more)."""
        return max(1, self.max_batch * self.lookahead)

    @property
    def mode(self) -> str:
        return "profile" if self.profile.ready else "aimd"

    def observe(self, size: int, seconds: float) -> None:
        """AIMD feedback (Clipper); the profile itself is fed by the worker."""
        if self.profile.ready:
            return
        budget = self._aimd_budget_s
        if budget is not None and seconds > budget:
            self.aimd_size = max(1, int(self.aimd_size * 0.9))
        elif self._aimd_full and (budget is None or seconds < 0.9 * budget):
            self.aimd_size = min(self.max_batch, self.aimd_size + 1)

    def plan(self, deadlines: Sequence[float | None], now_ms: float) -> Plan:
        if not deadlines:
            return Plan(take=0)
        if self.profile.ready:
            return self._plan_profile(deadlines, now_ms)
        return self._plan_aimd(deadlines, now_ms)

    def _refusal(self, deadline: float, at_ms: float, exec_s: float, now_ms: float) -> str | None:
        """Why a request due at ``deadline`` cannot be served if its batch starts at ``at_ms`` (or None)."""
        if at_ms + exec_s * 1000 <= self.budget.latest_finish(deadline):
            return None
        after = (self.budget.reserve_s + self.budget.downstream_s) * 1000
        return (f"cannot finish before its deadline: {deadline - now_ms:.1f} ms left, predicted "
                f"{at_ms - now_ms + exec_s * 1000:.1f} ms of queueing and execution here "
                f"+ {after:.1f} ms downstream")

    def _plan_profile(self, deadlines: Sequence[float | None], now_ms: float) -> Plan:
        window = self.window
        if len(deadlines) > window:
            deadlines = deadlines[:window]
        p99 = self.profile.p99
        budget = self.budget
        # Admission: refuse only what cannot make it even if it ran next, alone, in a typical (p50) time.
        p1_ms = (self.profile.p50(1) or 0.0) * 1000
        hopeless = now_ms + p1_ms + (budget.reserve_s + budget.downstream_s) * 1000
        refuse: dict[int, str] = {}
        local: list[float] = []  # node-deadlines of the requests kept, in FIFO order
        share, keep_ms = budget.share, now_ms + budget.reserve_s * 1000
        for i, d in enumerate(deadlines):
            if d is None:
                local.append(math.inf)
            elif d < hopeless:
                refuse[i] = self._refusal(d, now_ms, p1_ms / 1000, now_ms) or "cannot finish before its deadline"
            else:
                local.append(now_ms + share * (d - keep_ms))
        n = len(local)
        if not n:
            return Plan(take=0, refuse=refuse)
        cap = min(n, self.max_batch)
        # The largest prefix whose p99 meets the earliest node-deadline in it (at least 1: FIFO).
        best, earliest = 1, local[0]
        for size in range(2, cap + 1):
            earliest = min(earliest, local[size - 1])
            if now_ms + (p99(size) or 0.0) * 1000 > earliest:
                break
            best = size
        if best < cap and (n >= 2 * self.max_batch  # a backlog: throughput is what saves the later deadlines
                           or self._misses(local, cap, now_ms) <= self._misses(local, best, now_ms)):
            best = cap  # a full batch loses no more deadlines and drains the queue faster
        return Plan(take=best, refuse=refuse)

    def _misses(self, local: list[float], first: int, now_ms: float) -> int:
        """Predicted deadline misses over ``local`` when the next batch is ``first`` requests (at its p99)
        and the rest follow in full batches (at their p50). O(len(local))."""
        p99, p50, top = self.profile.p99, self.profile.p50, self.max_batch
        t = now_ms + (p99(first) or 0.0) * 1000
        misses = sum(1 for d in local[:first] if d < t)
        pos, n = first, len(local)
        while pos < n:
            size = min(top, n - pos)
            t += (p50(size) or 0.0) * 1000
            misses += sum(1 for d in local[pos:pos + size] if d < t)
            pos += size
        return misses

    def _plan_aimd(self, deadlines: Sequence[float | None], now_ms: float) -> Plan:
        if len(deadlines) > self.window:
            deadlines = deadlines[:self.window]
        refuse: dict[int, str] = {}
        live: list[int] = []
        for i, d in enumerate(deadlines):
            if d is not None and (why := self._refusal(d, now_ms, 0.0, now_ms)) is not None:
                refuse[i] = why
            else:
                live.append(i)
        if all(d is None for d in deadlines):
            # No deadline to protect: take what is queued, as the lag policy does (throughput only).
            return Plan(take=min(len(live), self.max_batch), refuse=refuse)
        take = min(len(live), self.aimd_size, self.max_batch)
        budgets = [self.budget.node_deadline(d, now_ms) - now_ms
                   for d in (deadlines[i] for i in live[:take]) if d is not None]
        self._aimd_budget_s = min(budgets) / 1000 if budgets else None
        self._aimd_full = take >= self.aimd_size
        return Plan(take=take, refuse=refuse)


@dataclass
class TimeoutPolicy:
    """Timeout batching as Ray Serve's ``@serve.batch`` and Triton's dynamic batcher do it: once a request
    is there, wait up to ``max_wait_ms`` for ``max_batch`` of them, then run what arrived."""

    max_batch: int = 32
    max_wait_ms: float = 10.0

    def next_size(self, lag: int) -> int:
        return self.max_batch

    def observe(self, size: int, seconds: float) -> None:
        return None

    def plan(self, deadlines: Sequence[float | None], now_ms: float) -> Plan:
        return Plan(take=max(1, min(len(deadlines), self.max_batch)))


def make_policy(topology: Topology, node_id: str, profile: ExecProfile | None = None,
                profiles: dict[str, ExecProfile | None] | None = None) -> BatchPolicy:
    """The policy a node's ``batching:`` entry asks for (``slo`` by default)."""
    node = topology.nodes[node_id]
    spec = topology.spec.nodes.get(node_id)
    batching = getattr(spec, "batching", None)
    kind = batching.policy if batching is not None else "slo"
    if kind == "lag":
        return LagPolicy(node.max_batch)
    if kind == "fixed":
        size = (batching.size if batching is not None else None) or node.max_batch
        return FixedPolicy(size, fetch=max(size, 4 * node.max_batch))
    if kind == "timeout":
        size = (batching.size if batching is not None else None) or node.max_batch
        wait = batching.max_wait_ms if batching is not None and batching.max_wait_ms else 10.0
        return TimeoutPolicy(min(size, node.max_batch), wait)
    hop_ms = batching.hop_ms if batching is not None else 2.0
    profiles = dict(profiles or {})
    if profile is not None:
        profiles[node_id] = profile
    return SLOPolicy(max_batch=node.max_batch, profile=profile or ExecProfile(),
                     budget=budget_for(topology, node_id, profiles, hop_ms))


def load_node_profiles(topology: Topology) -> dict[str, ExecProfile | None]:
    """Every node's seeded profile from the file beside the topology ({} when there is none)."""
    entries = load_profiles(profile_path(topology.source)) if topology.source else {}
    return {n: node_profile(entries, n) for n in topology.nodes}


_DEVICE_LOCKS: dict[str, threading.Lock] = {}


def device_lock(device: str) -> threading.Lock | None:
    """One batch in flight per GPU (per process): the lock of ``device``, None on the CPU."""
    if not device.startswith("cuda"):
        return None
    return _DEVICE_LOCKS.setdefault(device, threading.Lock())


def sizes_to_profile(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to and including ``max_batch``."""
    out, s = [], 1
    while s < max_batch:
        out.append(s)
        s *= 2
    out.append(max_batch)
    return out


def describe(policy: object) -> str:
    if isinstance(policy, SLOPolicy):
        return f"slo({policy.mode}, share={policy.budget.share:.2f})"
    return type(policy).__name__


__all__ = ["Budget", "ExecProfile", "SLOPolicy", "TimeoutPolicy", "budget_for", "deadline_of", "device_lock",
           "load_node_profiles", "load_profiles", "make_policy", "profile_path", "save_profiles",
           "sizes_to_profile"]
