"""The planner's search: the cheapest per-stage configuration whose simulated p99 meets the SLO.

InferLine's low-frequency planner, from two starts:

1. **feasible start**: every stage on its fastest hardware at batch 1 (InferLine's start), and every stage at
   the hardware and batch that serve a request for the least money when busy, its batch time within a
   quarter of the SLO; each with the fewest consumers the bounds allow (:class:`Bounds`); while the
   simulated p99 misses the SLO, grow the busiest stage by a quarter (up to MAX_CONSUMERS);
2. **greedy cost reduction** from each: for every stage, the families of cheaper variants
   (:func:`cheaper_families`), each at the fewest consumers that meet the SLO (bisected); take the
   cheapest; repeat until no family is cheaper. The cheaper of the two ends is the plan.

One start is not enough: a move changes one stage, and the SLO's time is shared, so a greedy descent stops
where two stages would have to change together. From batch 1 on the fastest hardware, video-monitoring
at 1,000 req/s ended at $3.84/h where the search with energy's prices, taking another path, found a plan
of $3.33/h (``flowserve bench plan-objectives``).

**Pruning**: the trace's arrival curve against a stage's maximum service curve bounds from below how
many requests miss (network calculus's lower delay bound); a candidate the bound refuses is not
simulated, and a family whose fewest allowed consumers already cost more than the best found is skipped.
The bound holds for the simulator itself, so pruning changes the time taken, not the plan.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from flowserve.errors import FlowserveError
from flowserve.tuning.bounds import Bounds
from flowserve.tuning.simulate import SimResult, batch_time, simulate
from flowserve.tuning.stages import StageConfig, StageOptions, cost, partitions_for, sim_stages

MAX_BATCH = 64
#: per stage: a cluster's worth (the search bisects, so the cap costs a few simulations, not a thousand)
MAX_CONSUMERS = 1000
#: the second start's batch: the largest whose batch time is within this share of the SLO
START_BATCH_SHARE = 0.25

Config = dict[str, StageConfig]


def search(options: Sequence[StageOptions], arrivals: np.ndarray, slo_s: float, *, prices: dict[str, float],
           hop_s: float, overhead_s: float = 0.0, seed: int = 0, jitter: float = 0.05, percentile: float = 99.0,
           min_partitions: int = 1, headroom: float = 2.0, prune: bool = True,
           max_consumers: int = MAX_CONSUMERS, log: Callable[[str], None] | None = None,
           counts: dict[str, int] | None = None) -> tuple[Config, SimResult]:
    """The cheapest feasible config found (see the module docstring).
    ``prune=False`` simulates what the bounds would rule out (the same answer, slower: tests compare);
    ``counts`` receives how many configurations were simulated and how many the bounds ruled out."""
    tally = counts if counts is not None else {}
    tally.update(simulated=0, pruned=0)
    arrivals = np.sort(np.asarray(arrivals, dtype=float))
    bounds = Bounds(options, arrivals, slo_s, percentile=percentile, hop_s=hop_s, overhead_s=overhead_s,
                    jitter=jitter, seed=seed)
    cache: dict[tuple[tuple[str, str, int, int], ...], SimResult] = {}

    def run(config: Config) -> SimResult:
        key = tuple(sorted((k, v.hardware, v.max_batch, v.consumers) for k, v in config.items()))
        if key not in cache:
            tally["simulated"] += 1
            cache[key] = simulate(sim_stages(options, config), arrivals,
                                  partitions=partitions_for(config, min_partitions, headroom),
                                  hop_s=hop_s, jitter=jitter, seed=seed, overhead_s=overhead_s)
        return cache[key]

    def ok(result: SimResult) -> bool:
        return result.percentile(percentile) <= slo_s

    def meets(config: Config) -> SimResult | None:
        if prune and bounds.rules_out(config):
            tally["pruned"] += 1
            return None
        result = run(config)
        return result if ok(result) else None

    def grow(config: Config) -> tuple[Config, SimResult]:
        """Grow the busiest stage by a quarter until the SLO is met."""
        result = run(config)
        while not ok(result):
            busiest = max((s for s in options if config[s.id].consumers < max_consumers),
                          key=lambda s: result.stages[s.id].utilisation + result.stages[s.id].mean_wait_s,
                          default=None)
            if busiest is None:
                raise FlowserveError(f"no configuration meets p{percentile:g} <= {slo_s * 1000:.0f} ms even with "
                                     f"{max_consumers} consumers per stage on the fastest hardware; relax the SLO")
            now = config[busiest.id].consumers
            grown = min(max_consumers, now + max(1, now // 4))
            config = {**config, busiest.id: replace(config[busiest.id], consumers=grown)}
            result = run(config)
            if log:
                log(f"feasible start: {busiest.id} x{grown} -> p99 {result.percentile(percentile) * 1000:.1f} ms")
        return config, result

    def descend(config: Config, result: SimResult) -> tuple[Config, SimResult]:
        """Greedy cost reduction: the cheapest one-stage move that still meets the SLO, until none is cheaper."""
        answers: dict[tuple[str, str, int], int] = {}  # (stage, hardware, batch) -> its fewest, last time
        while True:
            current = cost(config, prices)
            best: tuple[float, float, Config, SimResult] | None = None
            # each family's cheapest conceivable cost: the fewest consumers the bounds allow
            floors = {(sid, kind, batch, most): current - config[sid].consumers * prices[config[sid].hardware]
                      + max(1, bounds.fewest(sid, kind, batch)) * prices[kind]
                      for sid, kind, batch, most in cheaper_families(options, config, prices, max_consumers)}
            for family in sorted(floors, key=floors.__getitem__):
                if best is not None and prune and floors[family] > best[0] + 1e-12:
                    break  # no family from here on can beat the best found
                found = _fewest_feasible(config, family, meets, answers.get(family[:3]))
                if found is not None:
                    trial, r = found
                    answers[family[:3]] = trial[family[0]].consumers
                    c, p = cost(trial, prices), r.percentile(percentile)
                    if best is None or (c, p) < (best[0], best[1]):
                        best = (c, p, trial, r)
            if best is None:
                return config, result
            config, result = best[2], best[3]
            if log:
                log(f"cheaper: ${best[0]:.3f}/h, p99 {best[1] * 1000:.1f} ms")

    ends = []
    for i, start in enumerate(starts(options, bounds, slo_s, prices, max_consumers)):
        try:
            ends.append(descend(*grow(start)))
        except FlowserveError:
            if i == 0:  # the fastest start is the one that decides whether the SLO can be met at all
                raise
    return min(ends, key=lambda end: (cost(end[0], prices), end[1].percentile(percentile)))


def starts(options: Sequence[StageOptions], bounds: Bounds, slo_s: float, prices: dict[str, float],
           max_consumers: int) -> list[Config]:
    """The search's starting points (module docstring): every stage on its fastest hardware at batch 1;
    and every stage at the (hardware, batch) of least price per request served busy, its batch time within
    :data:`START_BATCH_SHARE` of the SLO. Each at the fewest consumers the bounds allow."""

    def batch_one(o: StageOptions, kind: str) -> float:
        return o.tables[kind][min(o.tables[kind])]

    def thrifty(o: StageOptions) -> tuple[str, int]:
        sizes = [2 ** i for i in range(int(math.log2(MAX_BATCH)) + 1)]
        fits = [(kind, b) for kind in o.tables for b in sizes
                if batch_time(o.tables[kind], b) <= START_BATCH_SHARE * slo_s]
        return min(fits or [(min(o.tables, key=functools.partial(batch_one, o)), 1)],
                   key=lambda kb: (prices[kb[0]] * batch_time(o.tables[kb[0]], kb[1]) / kb[1], -kb[1]))

    out = []
    for pick in (lambda o: (min(o.tables, key=functools.partial(batch_one, o)), 1), thrifty):
        config = {}
        for o in options:
            kind, batch = pick(o)
            config[o.id] = StageConfig(kind, batch, min(max_consumers, max(1, bounds.fewest(o.id, kind, batch))))
        if config not in out:
            out.append(config)
    return out


def cheaper_families(options: Sequence[StageOptions], config: dict[str, StageConfig], prices: dict[str, float],
              max_consumers: int) -> list[tuple[str, str, int, int]]:
    """The cheaper variants of each stage as (stage, hardware, max batch, most consumers that keep it
    cheaper): its hardware with fewer consumers, or any other kind it can run on with fewer consumers than
    would cost as much as it does now; the batch as it is or doubled up to MAX_BATCH (cost does not depend
    on the batch).

    Dearer kinds count too: a stage the search moved early to many small consumers (cheap at batch 1) is
    cheaper again on a few large ones at a large batch. Offering only cheaper kinds left video-monitoring's
    ``vehicles`` at 22 gpu-small consumers ($11.6/h) where 2 gpu-large at batch 32 meet the SLO ($6.1/h),
    and the cost plan dearer than the energy plan (``flowserve bench plan-objectives``, 3,000 req/s)."""
    out = []
    for o in options:
        cfg = config[o.id]
        batches = [cfg.max_batch]
        while batches[-1] < MAX_BATCH:
            batches.append(min(MAX_BATCH, batches[-1] * 2))
        now = cfg.consumers * prices[cfg.hardware]
        kinds = [(cfg.hardware, cfg.consumers - 1)]
        kinds += [(k, min(max_consumers, math.ceil(now / prices[k]) - 1)) for k in o.tables if k != cfg.hardware]
        out += [(o.id, kind, b, most) for kind, most in kinds if most >= 1 for b in batches]
    return out


def _fewest_feasible(config: dict[str, StageConfig], family: tuple[str, str, int, int],
                     meets: Callable[[dict[str, StageConfig]], SimResult | None], hint: int | None = None
                     ) -> tuple[dict[str, StageConfig], SimResult] | None:
    """The fewest consumers in ``family`` that meet the SLO (latency falls as consumers grow): galloping
    out from ``hint`` (this family's answer in the previous round: one stage changed since, so the answer
    moved little), then bisecting; plain bisection of [1, most] without a hint. The probes depend only on
    the answers, so the bounds answering some of them change nothing but the time taken."""
    sid, kind, batch, most = family
    results: dict[int, SimResult | None] = {}

    def feasible(c: int) -> bool:
        if c not in results:
            results[c] = meets({**config, sid: StageConfig(kind, batch, c)})
        return results[c] is not None

    # lo: the fewest not known to fail; hi: the fewest known to meet the SLO (most + 1: none known)
    lo, hi = 1, most + 1
    if hint is not None:
        h = min(max(hint, 1), most)
        step = 1
        if feasible(h):
            hi = h
            while hi - step >= 1 and feasible(hi - step):
                hi, step = hi - step, step * 2
            lo = max(1, hi - step + 1)
        else:
            lo = h + 1
            while lo + step - 1 <= most and not feasible(lo + step - 1):
                lo, step = lo + step, step * 2
            hi = min(most + 1, lo + step - 1)
    while lo < hi:
        mid = (lo + hi) // 2
        if feasible(mid):
            hi = mid
        else:
            lo = mid + 1
    if hi > most or not feasible(hi):
        return None
    found = results[hi]
    assert found is not None  # noqa: S101 - feasible(hi) holds
    return {**config, sid: StageConfig(kind, batch, hi)}, found


