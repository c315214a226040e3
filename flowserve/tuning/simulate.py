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
from. A node with several inputs joins per
request (``inner``: all of them, ``any``: the first); a routing node sends a request down each output
port with that port's share.

Not modelled: rebalance pauses (a static plan has none; the tuner's actions pay one live), fetch batching
beyond ``hop_s``, and CPU contention between stages beyond what ``overhead_s`` averages.

>>> from flowserve.tuning.simulate import SimStage, simulate
>>> stage = SimStage("m", {1: 0.01}, inputs=[(None, "x")], consumers=1, max_batch=1, output=True)
>>> r = simulate([stage], [0.0, 0.005], partitions=1, hop_s=0.0, jitter=0.0)
>>> [round(x, 4) for x in r.latency_s]
[0.01, 0.015]
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from flowserve.errors import FlowserveError


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


def _order(stages: Sequence[SimStage]) -> dict[str, list[tuple[str, str]]]:
    """upstream node -> [(downstream node, port it reads)]."""
    ids = {s.id for s in stages}
    down: dict[str, list[tuple[str, str]]] = {s.id: [] for s in stages}
    for s in stages:
        for src, port in s.inputs:
            if src is not None:
                if src not in ids:
                    raise FlowserveError(f"stage '{s.id}' reads unknown stage '{src}'")
                down[src].append((s.id, port))
    return down


def _sampler(value: float | np.ndarray, rng: np.random.Generator) -> Callable[[], float]:
    """A constant, or draws (in blocks: no numpy call per draw) from measured samples."""
    samples = np.asarray(value, dtype=float).reshape(-1)
    if samples.size == 1:
        constant = float(samples[0])
        return lambda: constant
    drawn: list[float] = []

    def draw() -> float:
        if not drawn:
            drawn.extend(rng.choice(samples, 4096).tolist())
        return drawn.pop()

    return draw


def simulate(stages: Sequence[SimStage], arrivals: Sequence[float] | np.ndarray, *, partitions: int,
             hop_s: float | np.ndarray = 0.002, jitter: float = 0.05, seed: int = 0,
             overhead_s: float | np.ndarray = 0.0) -> SimResult:
    """Run ``arrivals`` (seconds) through ``stages`` (topological order); per-request latency and per-stage stats."""
    arr = np.sort(np.asarray(arrivals, dtype=float))
    n = arr.size
    rng = np.random.default_rng(seed)
    by_id = {s.id: s for s in stages}
    down = _order(stages)
    owners = {s.id: range_assignment(partitions, s.consumers) for s in stages}
    width = {s.id: max(owners[s.id]) + 1 for s in stages}
    queues = {s.id: [deque() for _ in range(width[s.id])] for s in stages}  # type: ignore[var-annotated]
    busy = {s.id: [False] * width[s.id] for s in stages}
    need = {s.id: (1 if s.join == "any" else max(1, len(s.inputs))) for s in stages}
    got: dict[tuple[str, int], int] = {}
    single = {s.id: len(s.inputs) == 1 for s in stages}  # one input edge: no join to track
    outputs = [s.id for s in stages if s.output]
    remaining = np.full(n, len(outputs), dtype=np.int64)
    done_at = np.full(n, np.inf)
    busy_time = dict.fromkeys(by_id, 0.0)
    batches = dict.fromkeys(by_id, 0)
    batched = dict.fromkeys(by_id, 0)
    waits: dict[str, list[float]] = {s.id: [] for s in stages}
    # routing draws: one uniform per (request, routing stage), ports take consecutive shares of [0, 1)
    draws = {s.id: rng.random(n) for s in stages if s.fractions}
    shape = 1.0 / (jitter * jitter) if jitter > 0 else 0.0

    events: list[tuple[float, int, int, str, int, object]] = []
    seq = 0
    ARRIVE, DONE = 0, 1

    def push(t: float, kind: int, stage: str, consumer: int, payload: object) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, stage, consumer, payload))

    # precomputed: mean batch time per size, and jitter factors drawn in blocks (no numpy call per batch)
    times = {s.id: [0.0] + [batch_time(s.table, b) for b in range(1, s.max_batch + 1)] for s in stages}
    factors: list[float] = []

    def start(t: float, sid: str, k: int) -> None:
        q = queues[sid][k]
        take = min(len(q), by_id[sid].max_batch)
        batch = [q.popleft() for _ in range(take)]
        service = times[sid][take]
        if shape:
            if not factors:
                factors.extend(rng.gamma(shape, 1.0 / shape, 4096).tolist())
            service *= factors.pop()
        busy[sid][k] = True
        busy_time[sid] += service
        batches[sid] += 1
        batched[sid] += take
        for _req, enq in batch:
            waits[sid].append(t - enq)
        push(t + service + overhead(), DONE, sid, k, [req for req, _ in batch])

    def emitted(sid: str, port: str, req: int) -> bool:
        fractions = by_id[sid].fractions
        if not fractions or port not in fractions:
            return True
        lo = 0.0
        for p, share in fractions.items():
            if p == port:
                return bool(lo <= draws[sid][req] < lo + share)
            lo += share
        return False

    hop = _sampler(hop_s, rng)
    overhead = _sampler(overhead_s, rng)

    firsts = [s.id for s in stages if any(src is None for src, _ in s.inputs)]
    for req, t in enumerate(arr.tolist()):
        for sid in firsts:
            seq += 1
            events.append((t + hop(), seq, ARRIVE, sid, -1, req))
    heapq.heapify(events)
    while events:
        t, _, kind, sid, k, payload = heapq.heappop(events)
        if kind == ARRIVE:
            req = payload  # type: ignore[assignment]
            if single[sid] is False:
                key = (sid, req)
                count = got.get(key, 0) + 1
                got[key] = count
                if count != need[sid]:  # not joined yet, or a later input of an any-join (dropped)
                    continue
            k = owners[sid][req % partitions]
            queues[sid][k].append((req, t))
            if not busy[sid][k]:
                start(t, sid, k)
            continue
        busy[sid][k] = False
        for req in payload:  # type: ignore[attr-defined]
            if by_id[sid].output:
                remaining[req] -= 1
                if remaining[req] == 0:
                    done_at[req] = t + hop()
            for dst, port in down[sid]:
                if emitted(sid, port, req):
                    push(t + hop(), ARRIVE, dst, -1, req)
        if queues[sid][k]:
            start(t, sid, k)
    span = (max(float(arr[-1]), float(np.max(done_at[np.isfinite(done_at)], initial=0.0))) if n else 1.0) or 1.0
    stats = {
        s.id: StageStats(
            utilisation=busy_time[s.id] / (width[s.id] * span),
            mean_batch=batched[s.id] / batches[s.id] if batches[s.id] else 0.0,
            mean_wait_s=float(np.mean(waits[s.id])) if waits[s.id] else 0.0,
            p99_wait_s=float(np.percentile(waits[s.id], 99)) if waits[s.id] else 0.0,
            batches=batches[s.id])
        for s in stages}
    return SimResult(done_at - arr, stats)
