"""A discrete-event simulation of many-model workers: Poisson arrivals over Zipf-popular models, placed on
workers (:class:`~flowserve.models.placement.Placement`), each worker run by a policy (the
:class:`~flowserve.models.scheduler.Scheduler`, or the :class:`~flowserve.models.baseline.LruServer`).

Events are arrivals, the ends of actions and the policies' wake-ups, in time order. An action's actual
duration is its mean (the catalogue's load time or batch time) times a gamma draw of mean 1 and coefficient
of variation ``jitter_cv`` (seeded); the policies plan with the mean times ``margin`` (see
:func:`jitter_margin`), so a late answer is a draw past that percentile, as a live worker's would be. A
request's latency runs from its arrival at its worker to the end of its batch (with ``intake``, the live
hook's granularity, it waits for its worker's previous intake first): hops, decoding and queueing in Kafka
are not modelled (they add the same few milliseconds to every contender).

>>> from flowserve.models.catalogue import Catalogue
>>> from flowserve.models.placement import Placement
>>> from flowserve.models.scheduler import Scheduler
>>> cat = Catalogue.emulated(20)
>>> w = poisson_zipf(20, rate=100.0, seconds=2.0, s=1.2, seed=1)
>>> out = run(w, cat, Placement(1), [Scheduler(cat, cat.total_bytes)], slo_s=0.1)
>>> int(out.answered().sum() + out.refused.sum()) == len(w.arrivals)
True
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from flowserve.models.catalogue import Catalogue
from flowserve.models.placement import Placement
from flowserve.models.scheduler import Action, ActionKind, Step


class Policy(Protocol):
    """One worker's policy, as the driver (and later a worker's hook) calls it."""

    def submit(self, rid: int, model: str, *, deadline: float, now: float) -> None: ...

    def step(self, now: float) -> Step: ...

    def finished(self, action: Action, now: float) -> None: ...


@dataclass(frozen=True)
class Workload:
    """Requests: arrival times (seconds, sorted) and the catalogue index of each one's model."""

    arrivals: np.ndarray
    models: np.ndarray
    #: each model's probability (the popularity the arrivals were drawn from)
    popularity: np.ndarray

    def shares(self, catalogue: Catalogue) -> dict[str, float]:
        return {spec.name: float(p) for spec, p in zip(catalogue, self.popularity, strict=True)}


def zipf(models: int, s: float, *, seed: int = 0) -> np.ndarray:
    """Zipf popularity over ``models`` models (rank ``r`` weighs ``r ** -s``), ranks shuffled over the
    catalogue with ``seed`` so that popularity is independent of a model's architecture."""
    weights = np.arange(1, models + 1, dtype=float) ** -s
    return np.random.default_rng(seed).permutation(weights / weights.sum())


def poisson_zipf(models: int, *, rate: float, seconds: float, s: float, seed: int = 0) -> Workload:
    """Poisson arrivals at ``rate`` per second for ``seconds``, each for a model drawn from :func:`zipf`."""
    rng = np.random.default_rng(seed + 1)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, int(rate * seconds * 1.2) + 100))
    arrivals = arrivals[arrivals < seconds]
    popularity = zipf(models, s, seed=seed)
    return Workload(arrivals, rng.choice(models, size=arrivals.size, p=popularity), popularity)


def jitter_margin(cv: float, q: float = 0.99, *, seed: int = 0) -> float:
    """The ``q`` quantile of the gamma jitter of mean 1 and coefficient ``cv``: a profile's p99 over its
    mean, the margin a scheduler plans with (Clockwork predicts from each batch size's p99)."""
    if cv <= 0:
        return 1.0
    shape = 1.0 / cv**2
    draws = np.random.default_rng(seed).gamma(shape, 1.0 / shape, 200_000)
    return float(np.quantile(draws, q))


@dataclass
class Outcome:
    """Per request: its deadline, when it was answered (NaN: not) and whether it was refused; per worker:
    loads, evictions, batches and requests in them, and the seconds each lane was busy."""

    arrival: np.ndarray
    deadline: np.ndarray
    finish: np.ndarray
    refused: np.ndarray
    worker: np.ndarray
    loads: list[int]
    evictions: list[int]
    batches: list[int]
    batched: list[int]
    copy_busy_s: list[float]
    compute_busy_s: list[float]
    #: when each request reached its worker's policy (its arrival, or with an intake its intake's start)
    taken: np.ndarray | None = None

    def answered(self) -> np.ndarray:
        return ~np.isnan(self.finish)

    def within(self) -> np.ndarray:
        """Answered by its deadline."""
        return self.answered() & (self.finish <= self.deadline)

    def late(self) -> np.ndarray:
        return self.answered() & (self.finish > self.deadline)


def run(workload: Workload, catalogue: Catalogue, placement: Placement, policies: Sequence[Policy], *,
        slo_s: float, jitter_cv: float = 0.0, seed: int = 0, intake: int = 0,
        turnaround_s: float = 0.0) -> Outcome:
    """Serve ``workload`` on ``len(policies)`` workers placed by ``placement``; every request's deadline is
    its arrival plus ``slo_s``.

    ``intake`` > 0 models the live hook's granularity (:mod:`flowserve.models.stage`): a worker takes the
    requests waiting for it (at most ``intake``, its Kafka batch) only once its previous intake is done, every
    request answered or refused and both lanes idle; each answer leaves when its batch ends (the hook answers
    in parts); ``turnaround_s``: how long after an intake's end the worker
    takes the next (it produces, is acknowledged, commits and fetches). 0: each request reaches its policy
    when it arrives and leaves when its batch ends."""
    rng = np.random.default_rng(seed + 2)
    shape = 1.0 / jitter_cv**2 if jitter_cv > 0 else 0.0
    arrivals, models = workload.arrivals, workload.models
    n, w = arrivals.size, len(policies)
    names = [spec.name for spec in catalogue]
    finish = np.full(n, np.nan)
    taken = arrivals.astype(float)
    refused = np.zeros(n, dtype=bool)
    worker = np.zeros(n, dtype=np.int32)
    loads, evictions, batches, batched = [0] * w, [0] * w, [0] * w, [0] * w
    copy_busy, compute_busy = [0.0] * w, [0.0] * w
    seen = np.zeros(len(catalogue), dtype=np.int64)  # requests per model so far (turns over its workers)
    wake = [np.inf] * w
    waiting: list[deque[int]] = [deque() for _ in range(w)]  # arrived, not yet taken (intake > 0)
    members: list[list[int]] = [[] for _ in range(w)]  # the requests of each worker's intake
    unresolved, running = [0] * w, [0] * w
    free_at = [0.0] * w  # when each worker is done with its last intake's turnaround (intake > 0)
    called = [-1.0] * w  # the wake-up already set for that time
    events: list[tuple[float, int, int, Action | None]] = []  # (time, order, worker, action; None: wake-up)
    order, i = 0, 0

    def step(k: int, t: float) -> None:
        nonlocal order
        out = policies[k].step(t)
        refused[out.refused] = True
        unresolved[k] -= len(out.refused)
        for action in out.actions:
            spec = catalogue.spec(action.model)
            if action.kind is ActionKind.LOAD:
                mean = spec.load_s
                loads[k] += 1
                evictions[k] += len(action.evicted)
            else:
                mean = spec.batch_s(len(action.requests))
                batches[k] += 1
                batched[k] += len(action.requests)
            took = mean * rng.gamma(shape, 1.0 / shape) if shape else mean
            busy = copy_busy if action.kind is ActionKind.LOAD else compute_busy
            busy[k] += took
            order += 1
            running[k] += 1
            heapq.heappush(events, (t + took, order, k, action))
        if out.wake < wake[k] or wake[k] <= t:
            if out.wake < np.inf:
                order += 1
                heapq.heappush(events, (out.wake, order, k, None))
            wake[k] = out.wake

    def take(k: int, t: float) -> None:
        """With an intake: close the worker's finished intake (its answers have left), open the next."""
        nonlocal order
        while unresolved[k] == 0 and running[k] == 0 and (members[k] or waiting[k]):
            if members[k]:
                free_at[k] = t + turnaround_s
                members[k] = []
            if t < free_at[k]:  # still producing, acknowledging and committing the last intake
                if waiting[k] and called[k] != free_at[k]:
                    called[k] = free_at[k]
                    order += 1
                    heapq.heappush(events, (free_at[k], order, k, None))
                return
            members[k] = [waiting[k].popleft() for _ in range(min(intake, len(waiting[k])))]
            taken[members[k]] = t
            for r in members[k]:
                policies[k].submit(r, names[int(models[r])], deadline=float(arrivals[r]) + slo_s, now=t)
            unresolved[k] = len(members[k])
            if members[k]:
                step(k, t)

    while i < n or events:
        if events and (i >= n or events[0][0] <= arrivals[i]):
            t, _, k, action = heapq.heappop(events)
            if action is not None:
                policies[k].finished(action, t)
                running[k] -= 1
                if action.kind is ActionKind.BATCH:
                    finish[list(action.requests)] = t
                    unresolved[k] -= len(action.requests)
        else:
            t, m = float(arrivals[i]), int(models[i])
            k = placement.route(names[m], int(seen[m]))
            seen[m] += 1
            worker[i] = k
            if intake:
                waiting[k].append(i)
            else:
                policies[k].submit(i, names[m], deadline=t + slo_s, now=t)
                unresolved[k] += 1
            i += 1
        step(k, t)
        if intake:
            take(k, t)
    return Outcome(arrivals, arrivals + slo_s, finish, refused, worker, loads, evictions, batches, batched,
                   copy_busy, compute_busy, taken)
