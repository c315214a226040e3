"""The simulator as a cluster: stages whose consumers change over time, with the delays that costs.

:mod:`flowserve.tuning.simulate` runs a fixed configuration. Here each stage has a :class:`Replicas`
record (the simulated scaler: a scale-up starts pods that serve only after a start delay, a scale-down
stops the newest at once), and :class:`Cluster` runs the same stages, draws and batching over it:

- **start delay** (``start_s``, a constant or samples drawn from, one per pod): ``LOCAL_START_S``, a
  ``flowserve worker`` process on this machine: 1.3 CPU-s to start, joined its group 3.5 s after the
  action with three starting beside a loaded topology on two cores (docs/benchmarks.md, 2026-12-02,
  "What a scale-out costs"): uniform over [1.3, 3.5] s. ``KUBERNETES_START_S``, a pod whose image is
  cached: Kubernetes' pod startup SLO is <= 5 s at the 99th percentile from creation to running for
  stateless pods, image pulls excluded (kubernetes/community sig-scalability/slos/pod_startup_latency.md),
  plus the worker's own 1.3 s on the pod's CPU: uniform over [2.3, 6.3] s;
- **rebalance pause** (``pause_s``): whenever a stage's ready consumers change, its group rebalances
  (eager, the range assignor): no consumer of the stage begins a batch until the pause is over (batches
  in progress finish). ``PAUSE_S``: uniform over [0.1, 1.0] s: a member learns of a rebalance at its next
  heartbeat (``heartbeat_interval_ms`` 1000, flowserve.kafka.settings) and the group resumes once the last
  has rejoined; measured here, adding 3 consumers to 4 or 2 to 2 left every request under 320 ms with no
  stall visible (docs/benchmarks.md, same section), the low end of that range, and plain consumers held
  every record within 0.26 s of its send through a join and 0.35 s through a leave (``flowserve bench
  tuner --part rebalance``, which also shows KIP-848's consumer protocol pausing moved partitions longer);
- **partitions as a cap**: a stage serves with at most ``partitions`` consumers; more cost but idle;
- **deadlines** (``deadline_s``, none by default): a request carrying one is refused at a stage whose
  consumer comes to it too late to make it even alone (the worker's SLO batch policy answers it with a
  ``deadline`` error at once and spends no device time on it); it counts as a miss;
- at a change, each partition's queue continues on its new owner after the pause (Kafka resumes from the
  committed offset; a request keeps its place in its partition).

How it runs: in windows. :meth:`Cluster.advance` to ``t`` simulates every batch that begins before ``t``
(stage by stage, each window one compiled pass, :func:`flowserve.tuning.simulate._serve_epochs`), so a
closed-loop controller (KEDA reads the lag) advances to its next sync, reads :meth:`Cluster.lag`, and
scales: its changes take effect at or after ``t``, which is not yet simulated. An open-loop controller
(the tuner reads arrivals only) scales first and runs one window to the end. With constant consumers,
no jitter and constant hops and overheads it gives exactly what :func:`~flowserve.tuning.simulate.simulate`
gives (tests).

>>> from flowserve.tuning.simulate import SimStage
>>> stage = SimStage("m", {1: 0.01}, inputs=[(None, "x")], consumers=1, max_batch=1, output=True)
>>> c = Cluster([stage], [0.0, 0.005], partitions=1, hop_s=0.0, jitter=0.0)
>>> [round(x, 4) for x in c.result().latency_s]
[0.01, 0.015]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from flowserve.errors import ErrorKind, FlowserveError
from flowserve.tuning import simulate as sim
from flowserve.tuning.simulate import SimResult, SimStage, StageStats

LOCAL_START_S = np.linspace(1.3, 3.5, 23)
KUBERNETES_START_S = np.linspace(2.3, 6.3, 41)
PAUSE_S = np.linspace(0.1, 1.0, 10)
START_S = {"local": LOCAL_START_S, "kubernetes": KUBERNETES_START_S}
_START, _PAUSE = 8, 9  # purposes of a stage's draws, beside simulate's


@dataclass
class _Pod:
    requested: float
    ready: float
    stopped: float = math.inf


class Replicas:
    """One stage's consumers over time (the simulated scaler). ``initial`` pods are ready at ``t=0``."""

    def __init__(self, initial: int, start_s: float | np.ndarray = 0.0, rng: np.random.Generator | None = None):
        self.pods = [_Pod(0.0, 0.0) for _ in range(max(1, initial))]
        self.start_s = start_s
        self.rng = rng or np.random.default_rng(0)

    def spec(self) -> int:
        """Pods asked for and not stopped (a Deployment's ``spec.replicas``; LocalScaler's ``current``)."""
        return sum(1 for p in self.pods if p.stopped == math.inf)

    def ready(self, t: float) -> int:
        """Pods serving at ``t`` (``status.readyReplicas``)."""
        return sum(1 for p in self.pods if p.ready <= t < p.stopped)

    def scale(self, now: float, n: int) -> None:
        """Ask for ``n`` pods at ``now``: new ones serve after a start delay; fewer stop the newest first
        (a ReplicaSet deletes pods not yet ready first)."""
        alive = [p for p in self.pods if p.stopped == math.inf]
        for _ in range(n - len(alive)):
            delay = sim.draws(self.start_s, self.rng, 1)
            self.pods.append(_Pod(now, now + float(np.asarray(delay).reshape(-1)[0])))
        for p in sorted(alive, key=lambda p: (p.ready > now, p.requested), reverse=True)[:max(0, len(alive) - n)]:
            p.stopped = now

    def changes(self) -> list[tuple[float, int]]:
        """(time, ready pods from then on) at each time the ready count changes, from ``t=0``."""
        events: dict[float, int] = {}
        for p in self.pods:
            if p.ready < p.stopped:
                events[p.ready] = events.get(p.ready, 0) + 1
                if p.stopped < math.inf:
                    events[p.stopped] = events.get(p.stopped, 0) - 1
        out: list[tuple[float, int]] = []
        count = 0
        for t in sorted(events):
            count += events[t]
            if events[t] and (not out or out[-1][1] != count):
                out.append((t, count))
        return out or [(0.0, 0)]

    def pod_seconds(self, end: float) -> float:
        """Pod-seconds paid up to ``end``: from the request (a starting pod is paid) to its stop."""
        return sum(max(0.0, min(p.stopped, end) - p.requested) for p in self.pods)


@dataclass
class _State:
    reach: np.ndarray
    depart: np.ndarray
    begin: np.ndarray
    free: np.ndarray
    acc: np.ndarray | None = None
    cnt: np.ndarray | None = None
    partial: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    future: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    carry: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    inflight: np.ndarray = field(default_factory=lambda: np.zeros(0))
    width: int = 0
    nbatch: int = 0
    busy: float = 0.0
    pauses: dict[float, float] = field(default_factory=dict)


class Cluster:
    """``stages`` over ``arrivals`` with consumers that change (see the module docstring). ``replicas``:
    per stage its :class:`Replicas` (default: the stage's ``consumers``, fixed); they may change between
    calls to :meth:`advance`, at or after the time advanced to."""

    def __init__(self, stages: Sequence[SimStage], arrivals: Sequence[float] | np.ndarray, *, partitions: int,
                 replicas: dict[str, Replicas] | None = None, hop_s: float | np.ndarray = 0.002,
                 jitter: float = 0.05, seed: int = 0, overhead_s: float | np.ndarray = 0.0,
                 pause_s: float | np.ndarray = PAUSE_S, deadline_s: float | None = None) -> None:
        arr = np.sort(np.asarray(arrivals, dtype=float))
        self.arrivals, self.n, self.partitions = arr, arr.size, max(1, partitions)
        self.stages = sim.topological(stages)
        self.index = {s.id: i for i, s in enumerate(stages)}
        self.replicas = replicas or {s.id: Replicas(s.consumers) for s in stages}
        self.partition = np.arange(self.n) % self.partitions
        self.hops = {(s.id, e): sim.draws(hop_s, sim.stream(seed, self.index[s.id], sim.HOP + e), self.n)
                     for s in stages for e in range(len(s.inputs))}
        self.final_hop = sim.draws(hop_s, sim.stream(seed, len(stages), sim.HOP), self.n)
        self.routes = {s.id: sim.stream(seed, self.index[s.id], sim.ROUTE).random(self.n) for s in stages
                       if s.fractions}
        self.draws = {s.id: (sim.jitter_factors(seed, self.index[s.id], self.n, jitter),
                             np.ascontiguousarray(np.broadcast_to(sim.draws(
                                 overhead_s, sim.stream(seed, self.index[s.id], sim.OVERHEAD), self.n), (self.n,))),
                             np.array([0.0] + [sim.batch_time(s.table, b) for b in range(1, max(1, s.max_batch) + 1)]))
                      for s in stages}
        self.pause_s, self.seed = pause_s, seed
        self.slack = _slack(self.stages, deadline_s, hop_s, overhead_s)
        nan = np.full(self.n, np.nan)
        self.state = {s.id: _State(nan.copy(), nan.copy(), nan.copy(), np.full(self.partitions, -np.inf),
                                   nan.copy() if len(s.inputs) > 1 else None,
                                   np.zeros(self.n, dtype=np.int64) if len(s.inputs) > 1 else None)
                      for s in stages}
        self.now = -math.inf
        self._fed = 0  # arrivals handed to the first stages

    # -- running ----------------------------------------------------------------------------------

    def advance(self, t_end: float) -> None:
        """Simulate every batch that begins before ``t_end``."""
        if t_end <= self.now:
            return
        news: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        fed = int(np.searchsorted(self.arrivals, t_end, side="left")) if t_end < math.inf else self.n
        source = np.arange(self._fed, fed)
        self._fed = fed
        for s in self.stages:
            edges = []
            for e, (src, port) in enumerate(s.inputs):
                ids, values = (source, self.arrivals[source]) if src is None else news[src]
                if src is not None and src in self.routes and port in self.stage(src).fractions:
                    values = np.where(self._routed(src, port, ids), values, np.inf)
                hop = self.hops[(s.id, e)]
                edges.append((ids, values + (hop[ids] if isinstance(hop, np.ndarray) else hop)))
            news[s.id] = self._serve(s, self._known(s, edges, t_end), t_end)
        self.now = t_end

    def stage(self, sid: str) -> SimStage:
        return self.stages[[s.id for s in self.stages].index(sid)]

    def _routed(self, src: str, port: str, ids: np.ndarray) -> np.ndarray:
        lo = 0.0
        draws = self.routes[src][ids]
        for p, share in self.stage(src).fractions.items():
            if p == port:
                return (draws >= lo) & (draws < lo + share)
            lo += share
        return np.zeros(ids.size, dtype=bool)  # pragma: no cover - the port is one of the fractions

    def _known(self, s: SimStage, edges: list[tuple[np.ndarray, np.ndarray]], t_end: float
               ) -> tuple[np.ndarray, np.ndarray]:
        """The requests whose arrival at ``s`` became known: ids and times (inf: they never reach it)."""
        st = self.state[s.id]
        if len(edges) == 1:
            return edges[0]
        assert st.acc is not None and st.cnt is not None  # noqa: S101 - a join has them
        fold = np.fmin if s.join == "any" else np.fmax
        for ids, values in edges:
            st.acc[ids] = fold(st.acc[ids], values)
            st.cnt[ids] += 1
        touched = np.unique(np.concatenate([st.partial, *(ids for ids, _ in edges)]))
        touched = touched[np.isnan(st.reach[touched])]  # an any-join's request is served once
        done = st.cnt[touched] == len(edges)
        if s.join == "any":  # the first input decides once it is known: the others come at or after t_end
            done |= st.acc[touched] < t_end
        st.partial = touched[~done]
        ids = touched[done]
        return ids, st.acc[ids]

    def _serve(self, s: SimStage, known: tuple[np.ndarray, np.ndarray], t_end: float
               ) -> tuple[np.ndarray, np.ndarray]:
        st = self.state[s.id]
        ids, values = known
        finite = np.isfinite(values)
        never = ids[~finite]
        st.reach[ids] = values
        st.depart[never] = np.inf
        st.future = np.concatenate([st.future, ids[finite]])
        due = st.reach[st.future] < t_end
        new = st.future[due]
        new = new[np.lexsort((new, st.reach[new]))]  # ties in request order, as simulate's stable sort
        st.future = st.future[~due]
        pool = np.concatenate([st.carry, new])
        starts, serve_from, widths, owners = self._epochs(s.id, t_end)
        factors, overheads, times = self.draws[s.id]
        begins, departs, carried, busy, st.nbatch = sim.epoch_kernel()(
            st.reach[pool], self.partition[pool], starts, serve_from, widths, owners, st.width, st.free, t_end,
            times, factors, overheads, st.nbatch, self.arrivals[pool] + self.slack[s.id])
        st.width = int(widths[-1])
        st.busy += busy
        begun = ~np.isnan(begins)
        done_ids = pool[begun]
        st.begin[done_ids] = begins[begun]
        st.depart[done_ids] = departs[begun]
        st.carry = pool[carried]
        # a refused request (departing at inf) is answered at once: it is not in flight
        st.inflight = np.concatenate([st.inflight, departs[begun & np.isfinite(departs)]])
        st.inflight = st.inflight[st.inflight > t_end]
        return np.concatenate([done_ids, never]), np.concatenate([departs[begun], np.full(never.size, np.inf)])

    def _epochs(self, sid: str, t_end: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The stage's epochs from the one in force at the last window's end up to ``t_end``."""
        st = self.state[sid]
        changes = self.replicas[sid].changes()
        first = max(0, int(np.searchsorted([t for t, _ in changes], self.now, side="right")) - 1)
        chosen = [c for c in changes[first:] if c[0] < t_end] or [changes[first]]
        rng = sim.stream(self.seed, self.index[sid], _PAUSE)
        serve = []
        for t, _ in chosen:
            if t not in st.pauses:  # drawn once per change, whichever window sees it first
                st.pauses[t] = 0.0 if t == changes[0][0] else float(np.asarray(sim.draws(self.pause_s, rng, 1)).max())
            serve.append(t + st.pauses[t])
        widths = np.array([min(c, self.partitions) for _, c in chosen], dtype=np.int64)
        owners = np.zeros((len(chosen), self.partitions), dtype=np.int64)
        for e, w in enumerate(widths):
            if w:
                owners[e] = sim.range_assignment(self.partitions, int(w))
        return np.array([t for t, _ in chosen]), np.array(serve), widths, owners

    # -- reading ----------------------------------------------------------------------------------

    def lag(self, sid: str) -> int:
        """Records on the stage's input not yet committed at the time advanced to: queued (reached, no batch
        begun) or in a batch not finished (a worker commits after its batch)."""
        st = self.state[sid]
        return int(st.carry.size + np.count_nonzero(st.inflight > self.now))

    def result(self) -> SimResult:
        """Run to the end; per-request latency (inf: never completed) and per-stage stats."""
        self.advance(math.inf)
        outputs = [np.nan_to_num(self.state[s.id].depart, nan=np.inf, posinf=np.inf) for s in self.stages if s.output]
        done = (np.maximum.reduce(outputs) if outputs else np.full(self.n, np.inf)) + self.final_hop
        latency = done - self.arrivals
        finite = done[np.isfinite(done)]
        span = max(float(self.arrivals[-1]) if self.n else 0.0, float(finite.max(initial=0.0))) or 1.0
        stats = {}
        for s in self.stages:
            st = self.state[s.id]
            waits = (st.begin - st.reach)[~np.isnan(st.begin)]
            ready_s = _ready_seconds(self.replicas[s.id].changes(), span, self.partitions)
            stats[s.id] = StageStats(utilisation=st.busy / ready_s if ready_s else 0.0,
                                     mean_batch=waits.size / st.nbatch if st.nbatch else 0.0,
                                     mean_wait_s=float(np.mean(waits)) if waits.size else 0.0,
                                     p99_wait_s=float(np.percentile(waits, 99)) if waits.size else 0.0,
                                     batches=st.nbatch)
        return SimResult(latency, stats)


def _slack(stages: Sequence[SimStage], deadline_s: float | None, hop_s: float | np.ndarray,
           overhead_s: float | np.ndarray) -> dict[str, float]:
    """Per stage, the latest a request may begin there after its arrival and still make ``deadline_s``:
    the deadline less the stage alone (batch 1, its overhead) and the slowest downstream path at batch 1
    with its hops (the live worker's :meth:`~flowserve.runtime.budget.Budget.latest_finish`); inf
    without a deadline."""
    if deadline_s is None:
        return {s.id: math.inf for s in stages}
    hop, overhead = float(np.mean(hop_s)), float(np.mean(overhead_s))
    tail: dict[str, float] = {}
    for s in reversed(stages):  # topological: every child's tail is known before its parents'
        after = [hop + tail[c.id] for c in stages if any(src == s.id for src, _ in c.inputs)]
        tail[s.id] = sim.batch_time(s.table, 1) + overhead + max(after + ([hop] if s.output else []), default=hop)
    return {sid: deadline_s - t for sid, t in tail.items()}


def _ready_seconds(changes: list[tuple[float, int]], end: float, partitions: int) -> float:
    """Serving consumer-seconds (at most ``partitions`` at a time) from 0 to ``end``."""
    total = 0.0
    for (t, c), (t2, _) in zip(changes, [*changes[1:], (end, 0)], strict=True):
        total += max(0.0, min(t2, end) - t) * min(c, partitions)
    return total


def replicas_for(counts: dict[str, int], *, start_s: float | np.ndarray, seed: int = 0) -> dict[str, Replicas]:
    """A :class:`Replicas` per stage, each drawing its start delays from its own seeded stream."""
    if any(c < 1 for c in counts.values()):
        raise FlowserveError(f"every stage needs at least one consumer: {counts}", kind=ErrorKind.INVALID_INPUT)
    return {sid: Replicas(c, start_s, sim.stream(seed, i, _START)) for i, (sid, c) in enumerate(counts.items())}
