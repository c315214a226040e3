"""A discrete-event simulation of a pipeline of batching stages fed by an arrival trace.

It models what the workers do, per stage: the topology's ``P`` partitions are spread over the stage's
consumers as Kafka's range assignor does; a request keeps its partition through the pipeline (results go
to their input's partition); an idle consumer takes what is queued on its partitions, up to ``max_batch``
(the ``lag`` batch policy a plan configures), holds its device for the batch's service time (the table's
figure, linear between listed sizes, times a seeded gamma jitter), then emits the batch downstream. Every
edge (client -> first stage, stage -> stage, last stage -> client) costs ``hop_s``, the per-hop Kafka
latency measured on this machine: a constant, or an array of measured hop times to draw each hop from
(a broker whose fetches wait makes hop times spread widely). Each batch also holds its consumer for
``overhead_s`` beyond the device: what a worker spends per batch besides ``process`` (fetching, decoding,
encoding and producing its records, with the CPU shared among the processes on the machine), measured
at saturation (``flowserve bench tuner`` measures it), again a constant or measured samples to draw
from. A node with several inputs joins per request (``inner``: all of them, ``any``: the first); a
routing node sends a request down each output port with that port's share.

How it runs: because a request keeps its partition and a partition has one consumer per stage, a stage
is a set of independent FIFO batch servers, and what a stage does depends only on when requests reach
it. So the stages are simulated one after another in topological order, each over every request at once:
a request's arrival at a stage is its upstream departure plus a hop (the latest input for an inner join,
the earliest for an any-join), and each consumer's queue is one pass over its requests in arrival order
(compiled with numba when it is installed: about a million requests through four stages in a second;
plain Python otherwise). A consumer that frees at ``t`` takes what reached it at or before ``t``; a request
that finds its consumer idle is served alone at once.

Not modelled here: rebalance pauses and consumers that change over time (a static plan has neither;
:mod:`flowserve.tuning.cluster` runs the same stages with both, through :func:`_serve_epochs`), fetch batching
beyond ``hop_s``, and CPU contention between stages beyond what ``overhead_s`` averages.

>>> from flowserve.tuning.simulate import SimStage, simulate
>>> stage = SimStage("m", {1: 0.01}, inputs=[(None, "x")], consumers=1, max_batch=1, output=True)
>>> r = simulate([stage], [0.0, 0.005], partitions=1, hop_s=0.0, jitter=0.0)
>>> [round(x, 4) for x in r.latency_s]
[0.01, 0.015]
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowserve.errors import FlowserveError

_KERNEL: list[Callable[..., Any]] = []


def kernel() -> Callable[..., Any]:
    """The per-consumer kernel, compiled with numba on first use where numba is installed (``pip install
    'flowserve[sim]'``), else the same code as plain Python, ~100x slower. numba is imported here, not at
    import time: it takes most of a second, and ``flowserve run --plan`` imports this module."""
    if not _KERNEL:
        try:
            import numba
        except ImportError:
            _KERNEL.append(_serve)
        else:
            _KERNEL.append(numba.njit(cache=True, nogil=True)(_serve))
    return _KERNEL[0]


def epoch_kernel() -> Callable[..., Any]:
    """:func:`_serve_epochs`, compiled as :func:`kernel` is (the time-varying cluster of
    :mod:`flowserve.tuning.cluster` runs it)."""
    if len(_KERNEL) < 2:
        k = kernel()
        _KERNEL.append(_serve_epochs if k is _serve else _compile(_serve_epochs))
    return _KERNEL[1]


def _compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    import numba

    return numba.njit(cache=True, nogil=True)(fn)


def compiled() -> bool:
    """Whether the kernel runs compiled (``flowserve bench tuner --part planner`` reports it)."""
    return kernel() is not _serve


@dataclass
class SimStage:
    """One node as the simulator sees it."""

    id: str
    #: batch size -> mean service seconds of one batch on one device
    table: dict[int, float]
    #: (upstream node or None for the topology's inputs, its port) per input edge
    inputs: list[tuple[str | None, str]]
    consumers: int = 1
    max_batch: int = 1
    join: str = "inner"
    #: output port -> share of requests emitted there (absent: all)
    fractions: dict[str, float] = field(default_factory=dict)
    #: this node writes (part of) the topology's outputs
    output: bool = False


@dataclass
class StageStats:
    utilisation: float
    mean_batch: float
    mean_wait_s: float
    p99_wait_s: float
    batches: int


@dataclass
class SimResult:
    latency_s: np.ndarray  # per request, inf when it never completed
    stages: dict[str, StageStats]

    def percentile(self, q: float) -> float:
        # "higher": no interpolation, which would turn inf - inf (requests never completed) into NaN
        return float(np.percentile(self.latency_s, q, method="higher")) if self.latency_s.size else 0.0

    def attainment(self, slo_s: float) -> float:
        return float(np.mean(self.latency_s <= slo_s)) if self.latency_s.size else 1.0


def batch_time(table: dict[int, float], n: int) -> float:
    """Mean seconds for a batch of ``n``: linear between listed sizes, the last per-item slope beyond.

    >>> batch_time({1: 1.0, 4: 2.5}, 2), batch_time({1: 1.0, 4: 2.5}, 8)
    (1.5, 4.5)
    """
    sizes = sorted(table)
    if n <= sizes[0]:
        return table[sizes[0]] * (n / sizes[0] if sizes[0] > 1 else 1.0)
    for lo, hi in zip(sizes, sizes[1:], strict=False):
        if n <= hi:
            return table[lo] + (table[hi] - table[lo]) * (n - lo) / (hi - lo)
    if len(sizes) == 1:
        return table[sizes[0]] * n / sizes[0]
    lo, hi = sizes[-2], sizes[-1]
    return table[hi] + (table[hi] - table[lo]) / (hi - lo) * (n - hi)


def range_assignment(partitions: int, consumers: int) -> list[int]:
    """Partition -> consumer index, as Kafka's range assignor spreads ``partitions`` over ``consumers``."""
    c = max(1, min(consumers, partitions))
    per, extra = divmod(partitions, c)
    owner = []
    for k in range(c):
        owner += [k] * (per + (1 if k < extra else 0))
    return owner


def topological(stages: Sequence[SimStage]) -> list[SimStage]:
    """``stages`` with every stage after the stages it reads (a loop or an unknown upstream is refused)."""
    by_id = {s.id: s for s in stages}
    for s in stages:
        for src, _ in s.inputs:
            if src is not None and src not in by_id:
                raise FlowserveError(f"stage '{s.id}' reads unknown stage '{src}'")
    done: dict[str, SimStage] = {}
    while len(done) < len(stages):
        ready = [s for s in stages if s.id not in done and all(src is None or src in done for src, _ in s.inputs)]
        if not ready:
            raise FlowserveError(f"the stages form a loop: {', '.join(s.id for s in stages if s.id not in done)}")
        done.update((s.id, s) for s in ready)
    return list(done.values())


def _serve(reach: np.ndarray, order: np.ndarray, owner: np.ndarray, width: int, times: np.ndarray,
           factors: np.ndarray, overheads: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, int, int]:
    """One stage: per request its departure (inf when it never reached the stage) and its wait; the
    device-busy seconds, batches and requests batched. ``order`` sorts ``reach`` (ties in request order);
    ``times[b]`` is a batch of ``b``'s mean service
    time; ``factors`` and ``overheads`` hold one draw per batch (a stage has at most one batch per request)."""
    n = reach.size
    top = times.size - 1
    departs = np.full(n, np.inf)
    waits = np.full(n, np.nan)
    # counting sort by consumer, keeping arrival order within each
    starts = np.zeros(width + 1, dtype=np.int64)
    reached = 0
    for i in range(n):
        r = order[i]
        if reach[r] < np.inf:
            starts[owner[r] + 1] += 1
            reached += 1
    for k in range(width):
        starts[k + 1] += starts[k]
    fill = starts.copy()
    queue = np.empty(reached, dtype=np.int64)
    for i in range(reached):
        r = order[i]
        queue[fill[owner[r]]] = r
        fill[owner[r]] += 1
    busy = 0.0
    batches = 0
    for k in range(width):
        free = -np.inf
        i = starts[k]
        end = starts[k + 1]
        while i < end:
            first = reach[queue[i]]
            j = i + 1
            if first > free:  # idle: served alone, at once
                begin = first
            else:  # busy: when it frees, it takes what is queued, up to the max batch
                begin = free
                while j < end and j - i < top and reach[queue[j]] <= free:
                    j += 1
            service = times[j - i] * factors[batches]
            finish = begin + service + overheads[batches]
            for m in range(i, j):
                r = queue[m]
                departs[r] = finish
                waits[r] = begin - reach[r]
            busy += service
            batches += 1
            free = finish
            i = j
    return departs, waits, busy, batches, reached


def _serve_epochs(reach: np.ndarray, part: np.ndarray, starts: np.ndarray, serve_from: np.ndarray,
                  widths: np.ndarray, owners: np.ndarray, width_before: int, free: np.ndarray, t_end: float,
                  times: np.ndarray, factors: np.ndarray, overheads: np.ndarray, nbatch: int, latest: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, int]:
    """One stage over one window of a cluster whose group changes (:mod:`flowserve.tuning.cluster`).

    ``reach`` (sorted) is the stage's pool: requests carried from the last window, then those reaching it
    before ``t_end``; ``part`` their partitions. Epoch ``e`` runs from ``starts[e]`` to the next start
    (``t_end`` at most): its ``widths[e]`` consumers own the partitions as ``owners[e]`` says and begin no
    batch before ``serve_from[e]`` (the rebalance pause). A consumer index new to an epoch (past the
    width before it) is idle; ``free[k]`` (updated in place) is when consumer ``k`` finishes its batch.
    What is not begun within an epoch stays on its partition for the next one's owner. Returns, per pool
    entry, its batch's start and its departure (NaN: not begun before ``t_end``), the pool entries carried
    on (in reach order), the device-busy seconds and the batch counter (it indexes ``factors`` and
    ``overheads``). A pool entry whose ``latest`` start has passed when its consumer comes to it is refused
    (begun then, departing at inf: flowserve's worker answers it with a ``deadline`` error at once)."""
    n = reach.size
    top = times.size - 1
    begins = np.full(n, np.nan)
    departs = np.full(n, np.nan)
    pend = np.empty(n, dtype=np.int64)
    npend = 0
    nxt = 0
    busy = 0.0
    before = width_before
    for e in range(starts.size):
        hi = starts[e + 1] if e + 1 < starts.size else np.inf
        hi = min(hi, t_end)
        m = nxt
        while m < n and reach[m] < hi:
            m += 1
        # carried entries reached before this epoch, new ones within it: the pool order is kept
        items = np.empty(npend + m - nxt, dtype=np.int64)
        items[:npend] = pend[:npend]
        for i in range(nxt, m):
            items[npend + i - nxt] = i
        nxt = m
        width = widths[e]
        for k in range(before, width):
            free[k] = -np.inf
        before = width
        npend = 0
        if width == 0:
            for i in range(items.size):
                pend[npend] = items[i]
                npend += 1
            continue
        starts_k = np.zeros(width + 1, dtype=np.int64)
        for i in range(items.size):
            starts_k[owners[e, part[items[i]]] + 1] += 1
        for k in range(width):
            starts_k[k + 1] += starts_k[k]
        fill = starts_k.copy()
        queue = np.empty(items.size, dtype=np.int64)
        for i in range(items.size):
            k = owners[e, part[items[i]]]
            queue[fill[k]] = items[i]
            fill[k] += 1
        for k in range(width):
            i = starts_k[k]
            end = starts_k[k + 1]
            while i < end:
                first = reach[queue[i]]
                avail = max(free[k], serve_from[e])
                begin = first if first > avail else avail  # idle: served alone, at once; else when it can
                if begin >= hi:
                    break
                if latest[queue[i]] < begin:  # refused: it cannot make its deadline even alone (no device time)
                    begins[queue[i]] = begin
                    departs[queue[i]] = np.inf
                    i += 1
                    continue
                j = i + 1
                if first <= avail:  # it takes what is queued, up to the max batch
                    while j < end and j - i < top and reach[queue[j]] <= avail:
                        j += 1
                service = times[j - i] * factors[nbatch]
                finish = begin + service + overheads[nbatch]
                for q in range(i, j):
                    begins[queue[q]] = begin
                    departs[queue[q]] = finish
                busy += service
                nbatch += 1
                free[k] = finish
                i = j
            while i < end:
                pend[npend] = queue[i]
                npend += 1
                i += 1
        pend[:npend] = np.sort(pend[:npend])
    # entries past the last epoch's end (reached at or after t_end) are carried too
    out = np.empty(npend + n - nxt, dtype=np.int64)
    out[:npend] = pend[:npend]
    for i in range(nxt, n):
        out[npend + i - nxt] = i
    return begins, departs, out, busy, nbatch


def _stream(seed: int, index: int, purpose: int) -> np.random.Generator:
    """The generator of one stage's draws for one purpose: a stage draws the same numbers whatever the
    other stages' configurations (common random numbers: the planner compares candidates, not noise)."""
    return np.random.default_rng([seed, index, purpose])


@functools.lru_cache(maxsize=16)
def _jitter(seed: int, index: int, n: int, shape: float) -> np.ndarray:
    """Gamma factors of mean 1, one per possible batch (cached: the planner simulates one trace many times)."""
    out = _stream(seed, index, _JITTER).gamma(shape, 1.0 / shape, n)
    out.flags.writeable = False
    return out


def jitter_floor(seed: int, index: int, n: int, jitter: float) -> float:
    """The smallest jitter factor stage ``index`` of a simulation of ``n`` requests can draw: no batch of
    it takes less than this share of its table's time (the planner's lower bounds rest on it)."""
    return float(_jitter(seed, index, n, 1.0 / (jitter * jitter)).min()) if jitter > 0 and n else 1.0


def jitter_factors(seed: int, index: int, n: int, jitter: float) -> np.ndarray:
    """Stage ``index``'s jitter factors, one per possible batch (ones without jitter)."""
    return _jitter(seed, index, n, 1.0 / (jitter * jitter)) if jitter > 0 else np.ones(n)


def _draws(value: float | np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray | float:
    """``n`` draws from measured values (with replacement), or the constant itself."""
    samples = np.asarray(value, dtype=float).reshape(-1)
    return float(samples[0]) if samples.size == 1 else rng.choice(samples, n)


def stream(seed: int, index: int, purpose: int) -> np.random.Generator:
    """The seeded generator of stage ``index``'s draws for ``purpose`` (the cluster draws as this module does)."""
    return _stream(seed, index, purpose)


def draws(value: float | np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray | float:
    """``n`` draws from measured values, or the constant itself."""
    return _draws(value, rng, n)


# purposes of a stage's draws (hops: one per input edge)
JITTER, ROUTE, OVERHEAD, HOP = _JITTER, _ROUTE, _OVERHEAD, _HOP = 0, 1, 2, 3


def simulate(stages: Sequence[SimStage], arrivals: Sequence[float] | np.ndarray, *, partitions: int,
             hop_s: float | np.ndarray = 0.002, jitter: float = 0.05, seed: int = 0,
             overhead_s: float | np.ndarray = 0.0) -> SimResult:
    """Run ``arrivals`` (seconds) through ``stages``; per-request latency and per-stage stats."""
    arr = np.asarray(arrivals, dtype=float)
    if arr.size > 1 and not bool(np.all(arr[1:] >= arr[:-1])):
        arr = np.sort(arr)
    n = arr.size
    partition = np.arange(n) % max(1, partitions)
    shape = 1.0 / (jitter * jitter) if jitter > 0 else 0.0
    index = {s.id: i for i, s in enumerate(stages)}
    by_id = {s.id: s for s in stages}
    # routing draws: one uniform per (request, routing stage), ports take consecutive shares of [0, 1)
    routes = {s.id: _stream(seed, index[s.id], _ROUTE).random(n) for s in stages if s.fractions}
    departs: dict[str, np.ndarray] = {}
    stats: dict[str, tuple[float, int, int, np.ndarray]] = {}
    for s in topological(stages):
        i = index[s.id]
        edges = []
        for e, (src, port) in enumerate(s.inputs):
            start = arr if src is None else _emitted(departs[src], by_id[src].fractions, port, routes.get(src))
            edges.append(start + _draws(hop_s, _stream(seed, i, _HOP + e), n))
        if len(edges) == 1:
            reach = edges[0]
        elif s.join == "any":
            reach = np.minimum.reduce(edges)
        else:
            reach = np.maximum.reduce(edges)
        owner = np.asarray(range_assignment(partitions, s.consumers), dtype=np.int64)[partition]
        top = max(1, s.max_batch)
        times = np.array([0.0] + [batch_time(s.table, b) for b in range(1, top + 1)])
        factors = _jitter(seed, i, n, shape) if shape else np.ones(n)
        overheads = np.broadcast_to(_draws(overhead_s, _stream(seed, i, _OVERHEAD), n), (n,))
        # numpy's stable sort (timsort) is near linear on the nearly sorted times a stage sees
        order = np.argsort(reach, kind="stable")
        dep, waits, busy, batches, reached = kernel()(reach, order, owner, int(owner.max(initial=0)) + 1, times,
                                                    factors, np.ascontiguousarray(overheads))
        departs[s.id] = dep
        stats[s.id] = (busy, batches, reached, waits[np.isfinite(waits)])
    outputs = [departs[s.id] for s in stages if s.output]
    done_at = ((np.maximum.reduce(outputs) if outputs else np.full(n, np.inf))
               + _draws(hop_s, _stream(seed, len(stages), _HOP), n))
    finite = done_at[np.isfinite(done_at)]
    span = (max(float(arr[-1]), float(finite.max(initial=0.0))) if n else 1.0) or 1.0
    width = {s.id: min(max(1, s.consumers), max(1, partitions)) for s in stages}
    return SimResult(done_at - arr, {
        sid: StageStats(utilisation=busy / (width[sid] * span),
                        mean_batch=reached / batches if batches else 0.0,
                        mean_wait_s=float(np.mean(waits)) if waits.size else 0.0,
                        p99_wait_s=float(np.percentile(waits, 99)) if waits.size else 0.0,
                        batches=batches)
        for sid, (busy, batches, reached, waits) in ((s.id, stats[s.id]) for s in stages)})


def _emitted(departs: np.ndarray, fractions: dict[str, float], port: str, draws: np.ndarray | None) -> np.ndarray:
    """Departures down output ``port`` of a stage with these routing ``fractions``: inf for the requests
    routed elsewhere."""
    if draws is None or port not in fractions:
        return departs
    lo = 0.0
    for p, share in fractions.items():
        if p == port:
            return np.where((draws >= lo) & (draws < lo + share), departs, np.inf)
        lo += share
    return np.full(departs.size, np.inf)  # pragma: no cover - the port is one of the fractions
