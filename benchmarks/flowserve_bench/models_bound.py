"""The ceilings of a cell of ``flowserve bench models``, SIMULATED: how many requests the best scheduler
could answer in time on the same workers, memory and arrivals, with its copy lanes scheduled offline.

At Zipf s = 0.9 with memory for 5% of the catalogue, about 40% of requests are for models no worker holds,
so a worker's copy lane (one load at a time over the host link) is busy 70% of the time at 70% of compute
capacity. Whether a target such as "99.9% within the SLO" is out of reach for flowserve's scheduler or for
any scheduler is a question about that lane, and this module estimates the answer per cell:

- **What is resident**, two ways, each starting from the hottest of a worker's models that fit (the warm
  start the bench gives every contender):
  - ``online``: that set and no other. Requests here are independent draws from a fixed popularity, where
    keeping the most probable pages is the optimal demand-paging policy for pages of one size (Aho, Denning
    and Ullman, "Principles of optimal page replacement", JACM 18(1), 1971): no scheduler that learns of a
    request only when it arrives keeps a better set. With its copy lanes still scheduled offline, it is a
    generous ceiling for any online scheduler.
  - ``clairvoyant``: to load a model, evict as Belady's rule does, knowing the future: the resident models
    whose next request is furthest away go first. What a scheduler that knew every arrival could reach.
  Every request that finds its model not resident needs a load.
- **Relaxations**, each of which can only raise the ceiling: the compute lane is never busy; a load takes
  its mean time (no jitter); every deadline is relaxed to the arrival plus the SLO less the fastest model's
  batch of one; a load serves every request for its model that arrives within one SLO of the first.
- **Optimal schedule of each copy lane:** with one common relaxation, deadlines are in the order of release
  times (agreeable), where Kise, Ibaraki and Mine's rule finds the most jobs a single machine can finish
  by their deadlines, with release dates (Operations Research 26(1), 1978, 121-126): take jobs in release
  order; when the newest would finish late, drop the one whose removal lets the rest finish earliest. With
  agreeable deadlines preemption does not help either: preempting for a job released later never serves an
  earlier deadline.

Both are estimates, not proofs: the theorem is for pages of one size, Belady's rule is not always the fewest
bytes copied when sizes differ, and the clairvoyant ceiling counts a load its schedule drops as resident
afterwards. Both lean generous: in the 70% cells at s = 0.9, Belady's evictions need a fifth to a third
fewer loads than flowserve's scheduler, and the online set's cold requests are 2-13% fewer than its loads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from flowserve.models import Catalogue, Placement, Workload
from flowserve.models.scheduler import Lanes

#: a load: (release, relaxed deadline, seconds)
Job = tuple[float, float, float]
#: what is resident (see the module's doc)
Eviction = Literal["online", "clairvoyant"]
EVICTIONS: tuple[Eviction, ...] = ("online", "clairvoyant")


@dataclass(frozen=True, slots=True)
class Bound:
    """The offline ceiling of one cell: requests, the fewest an offline scheduler misses, and the requests
    that found their model not resident (see the module's doc)."""

    requests: int
    misses: int
    cold_requests: int

    @property
    def attainment(self) -> float:
        return 1.0 - self.misses / self.requests if self.requests else 1.0


def resident_sets(catalogue: Catalogue, popularity: np.ndarray, holders: Mapping[str, Sequence[int]],
                  workers: int, memory: int) -> list[set[int]]:
    """Per worker, the catalogue indices of the hottest of its models that fit in ``memory`` bytes: the warm
    start :func:`flowserve_bench.models.serve` gives every contender, by the same rule (:meth:`Lanes.preload`)."""
    index = {spec.name: i for i, spec in enumerate(catalogue)}
    hottest = [catalogue[int(i)].name for i in np.argsort(-popularity, kind="stable")]
    return [{index[name] for name in Lanes(catalogue, memory).preload([n for n in hottest if k in holders[n]])}
            for k in range(workers)]


def fewest_late(jobs: Sequence[Job]) -> int:
    """The fewest jobs a single machine must drop so that the rest, each started no sooner than its release,
    finish by their deadlines; ``jobs`` in release order with deadlines in the same order (agreeable), where
    Kise, Ibaraki and Mine's rule is optimal (see the module's doc)."""
    dropped = 0
    block: list[Job] = []  # the current busy period's kept jobs (an idle gap before it separates it)
    end = -np.inf
    for job in jobs:
        release, due, took = job
        if release > end:  # the machine idles before it: earlier jobs no longer affect anything
            block = []
        block.append(job)
        end = max(end, release) + took
        if end <= due + 1e-12:
            continue
        dropped += 1
        # the end of the block without job q: with A_k = r_k + (seconds of jobs k.. in the block), the end is
        # max_k A_k; dropping q lowers A_k by its seconds for k <= q and leaves the rest
        r = np.array([j[0] for j in block])
        p = np.array([j[2] for j in block])
        a = r + np.cumsum(p[::-1])[::-1]
        before = np.maximum.accumulate(a) - p
        after = np.append(np.maximum.accumulate(a[::-1])[::-1][1:], -np.inf)
        q = int(np.argmin(np.maximum(before, after)))
        block.pop(q)
        end = max(before[q], after[q]) if block else -np.inf
    return dropped


def routes(workload: Workload, catalogue: Catalogue, placement: Placement) -> np.ndarray:
    """Each request's worker, as :func:`flowserve.models.simulate.run` routes it (replicas in turn)."""
    seen = np.zeros(len(catalogue), dtype=np.int64)
    out = np.empty(workload.models.size, dtype=np.int32)
    for r, m in enumerate(map(int, workload.models)):
        out[r] = placement.route(catalogue[m].name, int(seen[m]))
        seen[m] += 1
    return out


def load_jobs(workload: Workload, catalogue: Catalogue, requests: np.ndarray, resident: set[int], memory: int,
              slo_s: float, slack_s: float, evict: Eviction) -> tuple[list[Job], int]:
    """The loads one worker needs for ``requests`` (indices into the workload, in arrival order) when it
    starts with ``resident`` and keeps it (``online``) or evicts as Belady's rule does (``clairvoyant``).
    Returns the loads and the cold requests (those that found their model not resident)."""
    models = workload.models[requests].astype(np.int64)
    times = workload.arrivals[requests]
    following = np.full(models.size, np.inf)  # per request: when its model is next asked for
    upcoming: dict[int, float] = {}
    for i in range(models.size - 1, -1, -1):
        following[i] = upcoming.get(int(models[i]), np.inf)
        upcoming[int(models[i])] = float(times[i])
    held = {m: upcoming.get(m, np.inf) for m in resident}  # resident model -> its next request
    used = sum(catalogue[m].size_bytes for m in held)
    jobs: list[Job] = []
    first: dict[int, float] = {}  # model -> arrival of the request whose load the later ones share
    cold = 0
    for i, (m, t) in enumerate(zip(map(int, models), map(float, times), strict=True)):
        if m in held:
            held[m] = following[i]
            continue
        cold += 1
        if m in first and t <= first[m] + slo_s:
            continue
        first[m] = t
        jobs.append((t, t + slack_s, catalogue[m].load_s))
        if evict == "online":
            continue
        size = catalogue[m].size_bytes
        while held and used + size > memory:
            victim = max(held, key=held.__getitem__)
            used -= catalogue[victim].size_bytes
            del held[victim]
        held[m] = following[i]
        used += size
    return jobs, cold


def bound(catalogue: Catalogue, workload: Workload, workers: int, memory: int, *, slo_s: float,
          evict: Eviction = "online") -> Bound:
    """The ceiling of serving ``workload`` on ``workers`` workers of ``memory`` bytes, placed as the bench
    places them, with ``evict``'s resident models (see the module's doc)."""
    placement = Placement(workers)
    holders = placement.place(workload.shares(catalogue))
    resident = resident_sets(catalogue, workload.popularity, holders, workers, memory)
    slack = slo_s - min(spec.batch_s(1) for spec in catalogue)
    worker_of = routes(workload, catalogue, placement)
    misses = cold = 0
    for k in range(workers):
        jobs, colds = load_jobs(workload, catalogue, np.nonzero(worker_of == k)[0], resident[k], memory, slo_s, slack,
                                  evict)
        misses += fewest_late(jobs)
        cold += colds
    return Bound(int(workload.arrivals.size), misses, cold)
