"""``flowserve bench models``: thousands of models on a few workers, SIMULATED: emulated T4 workers in the
discrete-event simulation of :mod:`flowserve.models.simulate`, not live workers on a broker.

Cells: models (1,000, 4,000) x Zipf s (0.9, 1.2) x workers (2, 4), each worker with device memory for 5% of
the catalogue's bytes (warm: the hottest of its models that fit are resident at the start), Poisson arrivals
at 50%, 70% and 90% of **capacity**: the highest rate at which the same workers with every model resident
(no loads at all) still answer >= 99% of requests within the SLO, found by bisection per models x s x
workers on the cells' own popularity (the same seed: the same hot models, of the same architectures, on
the same workers). Past it even unbounded memory cannot keep up, so it is the ceiling that compute alone sets.

Contenders on the same arrivals: **flowserve** (:class:`~flowserve.models.scheduler.Scheduler`),
**lru** (:class:`~flowserve.models.baseline.LruServer`: load on demand, LRU, arrival order), both on
the same placement and two-lane workers, equally warm (flowserve's predictions start from the shares
placement was given; LRU has none); **one model per worker**: how many dedicated workers the same
arrivals would need (per model, enough workers that each runs batches no longer than half the SLO).
Every action's time is its mean times a gamma jitter (CV 5%); the schedulers plan with the jitter's p99.
Each cell also gets two **ceilings** (:mod:`flowserve_bench.models_bound`): the most requests answered in
time with each copy lane scheduled offline, keeping the hottest models (the best an online scheduler can
keep) or evicting as Belady's rule does (knowing every arrival), and so the most goodput over LRU's a
scheduler could show; per models x s x workers, the highest load at which each still reaches 99.9%.
The accounting and targets are :mod:`flowserve_bench.models_account`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from rich.table import Table

from flowserve.models import (
    Catalogue,
    LruServer,
    Placement,
    Scheduler,
    Workload,
    jitter_margin,
    poisson_zipf,
    run,
    zipf,
)
from flowserve.models.simulate import Outcome
from flowserve_bench.common import console
from flowserve_bench.models_account import ATTAINMENT, FLOWSERVE, LRU, models_targets, row, slices_of
from flowserve_bench.models_bound import EVICTIONS, Eviction, bound

SLO_S = 0.1
JITTER_CV = 0.05
MEMORY_SHARE = 0.05
#: the bisection's bar for capacity (all models resident)
CAPACITY_ATTAINMENT = 0.99
MAX_BATCH = 16


def serve(catalogue: Catalogue, workload: Workload, workers: int, memory: int, contender: str, *,
          seed: int = 0) -> Outcome:
    """``workload`` on ``workers`` workers of ``memory`` bytes each, run by ``contender``'s policy, placed by
    the workload's popularity and warm (each worker's hottest models resident at the start)."""
    placement = Placement(workers)
    holders = placement.place(workload.shares(catalogue))
    margin = jitter_margin(JITTER_CV)
    policy = {FLOWSERVE: Scheduler, LRU: LruServer}[contender]
    policies = [policy(catalogue, memory, max_batch=MAX_BATCH, margin=margin) for _ in range(workers)]
    hottest = np.argsort(-workload.popularity, kind="stable")
    rate = workload.arrivals.size / max(float(workload.arrivals[-1]), 1e-9) if workload.arrivals.size else 0.0
    for k, p in enumerate(policies):
        p.preload([catalogue[int(i)].name for i in hottest if k in holders[catalogue[int(i)].name]])
        if isinstance(p, Scheduler):  # its predictions start from the shares placement was given (LRU has none)
            p.expect({name: share * rate / len(holders[name]) for name, share in workload.shares(catalogue).items()
                      if k in holders[name]})
    return run(workload, catalogue, placement, policies, slo_s=SLO_S, jitter_cv=JITTER_CV, seed=seed)


def capacity(catalogue: Catalogue, s: float, workers: int, *, seconds: float, seed: int = 0,
             steps: int = 8) -> float:
    """The highest Poisson rate at which ``workers`` workers holding every model answer
    :data:`CAPACITY_ATTAINMENT` of requests within the SLO (bisection; requests per second)."""
    mean_one = float(np.mean([spec.batch_s(1) for spec in catalogue]))
    lo, hi = 0.25 * workers / mean_one, 4.0 * workers / mean_one  # around the batch-of-one ceiling
    for _ in range(steps):
        mid = (lo + hi) / 2
        wl = poisson_zipf(len(catalogue), rate=mid, seconds=seconds, s=s, seed=seed)
        out = serve(catalogue, wl, workers, catalogue.total_bytes, FLOWSERVE, seed=seed)
        lo, hi = (mid, hi) if out.within().mean() >= CAPACITY_ATTAINMENT else (lo, mid)
    return lo


def _highest_share(catalogue: Catalogue, s: float, cap: float, meets: Callable[[Workload], bool], *,
                   seconds: float, seed: int, steps: int) -> float:
    """The highest share of ``cap`` (bisection between 10% and 100%) whose Poisson-Zipf arrivals ``meets``
    accepts."""
    lo, hi = 0.1, 1.0
    for _ in range(steps):
        mid = (lo + hi) / 2
        wl = poisson_zipf(len(catalogue), rate=mid * cap, seconds=seconds, s=s, seed=seed)
        lo, hi = (mid, hi) if meets(wl) else (lo, mid)
    return lo


def highest_rate(catalogue: Catalogue, s: float, workers: int, contender: str, cap: float, *, seconds: float,
                 seed: int = 0, steps: int = 6) -> float:
    """The highest share of ``cap`` at which ``contender`` with memory for :data:`MEMORY_SHARE` of the
    models answers the issue's 99.9% within the SLO (bisection between 10% and 100%)."""
    memory = int(MEMORY_SHARE * catalogue.total_bytes)
    return _highest_share(
        catalogue, s, cap,
        lambda wl: bool(serve(catalogue, wl, workers, memory, contender, seed=seed).within().mean() >= ATTAINMENT),
        seconds=seconds, seed=seed, steps=steps)


def bound_rate(catalogue: Catalogue, s: float, workers: int, cap: float, evict: Eviction, *, seconds: float,
               seed: int = 0, steps: int = 6) -> float:
    """The highest share of ``cap`` at which ``evict``'s ceiling (:mod:`flowserve_bench.models_bound`) still
    answers 99.9% within the SLO: above it no such scheduler does."""
    memory = int(MEMORY_SHARE * catalogue.total_bytes)
    return _highest_share(
        catalogue, s, cap,
        lambda wl: bound(catalogue, wl, workers, memory, slo_s=SLO_S, evict=evict).attainment >= ATTAINMENT,
        seconds=seconds, seed=seed, steps=steps)


def dedicated_workers(catalogue: Catalogue, popularity: np.ndarray, rate: float) -> int:
    """Workers one-model-per-worker serving needs: per model, its rate over what one worker of it serves
    within the SLO (batches of at most half the SLO, back to back), at least one each."""
    need = 0
    for spec, p in zip(catalogue, popularity, strict=True):
        n = max([b for b in range(1, MAX_BATCH + 1) if spec.batch_s(b) <= SLO_S / 2] or [1])
        need += max(1, math.ceil(p * rate / (n / spec.batch_s(n))))
    return need


def models_bench(models: Sequence[int] = (1000, 4000), zipf_s: Sequence[float] = (0.9, 1.2),
                 workers: Sequence[int] = (2, 4), loads: Sequence[float] = (0.5, 0.7, 0.9), *,
                 seconds: float = 30.0, capacity_seconds: float = 10.0, slices: int = 10, seed: int = 0,
                 highest: bool = True, log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Every cell, each contender on the same arrivals; the result with its rows and targets."""
    wall = time.perf_counter()
    rows: list[dict[str, Any]] = []
    capacities = []
    for m in models:
        catalogue = Catalogue.emulated(m)
        memory = int(MEMORY_SHARE * catalogue.total_bytes)
        for s in zipf_s:
            for w in workers:
                # capacity, the 99.9% search and the cells share one seed, so one popularity: which models are
                # hot (and of which architecture) and on which worker they land move capacity by up to 40%,
                # so a capacity measured on another draw is not the capacity of the cells' workload
                cap = capacity(catalogue, s, w, seconds=capacity_seconds, seed=seed + 1)
                # the cells' placement: how many hot models it gives a second worker
                shares = dict(zip([spec.name for spec in catalogue], zipf(m, s, seed=seed + 1), strict=True))
                replicated = sum(len(h) > 1 for h in Placement(w).place(shares).values())
                found: dict[str, Any] = {"models": m, "s": s, "workers": w, "capacity_rps": cap,
                                         "replicated_models": replicated}
                if highest:  # how far below capacity each contender meets 99.9% with 5% memory
                    for name in (FLOWSERVE, LRU):
                        found[f"{name}_99.9pct_at_load"] = highest_rate(
                            catalogue, s, w, name, cap, seconds=2 * capacity_seconds, seed=seed + 1)
                    for evict in EVICTIONS:
                        found[f"{evict}_ceiling_99.9pct_at_load"] = bound_rate(
                            catalogue, s, w, cap, evict, seconds=2 * capacity_seconds, seed=seed + 1)
                capacities.append(found)
                if log:
                    log(f"{m} models, s={s}, {w} workers: capacity {cap:.0f} req/s (all resident, "
                        f"{CAPACITY_ATTAINMENT:.0%} within {SLO_S * 1000:.0f} ms)" + (
                            f"; {ATTAINMENT:.1%} within up to {found[f'{FLOWSERVE}_99.9pct_at_load']:.0%} of it "
                            f"(lru: {found[f'{LRU}_99.9pct_at_load']:.0%}; ceilings: online "
                            f"{found['online_ceiling_99.9pct_at_load']:.0%}, clairvoyant "
                            f"{found['clairvoyant_ceiling_99.9pct_at_load']:.0%})" if highest else ""))
                for load in loads:
                    rate = load * cap
                    wl = poisson_zipf(m, rate=rate, seconds=seconds, s=s, seed=seed + 1)
                    by: dict[str, list[Any]] = {}
                    extra: dict[str, dict[str, Any]] = {}
                    for name in (FLOWSERVE, LRU):
                        out = serve(catalogue, wl, w, memory, name, seed=seed + 1)
                        by[name] = slices_of(out.arrival, out.within(), out.late(), out.refused, slices)
                        span = max(seconds, float(np.nanmax(out.finish, initial=seconds)))
                        extra[name] = {"loads": sum(out.loads), "evictions": sum(out.evictions),
                                       "mean_batch": sum(out.batched) / max(1, sum(out.batches)),
                                       # the busiest worker's share of the run each lane was busy
                                       "copy_busy": max(out.copy_busy_s) / span,
                                       "compute_busy": max(out.compute_busy_s) / span}
                    r = row(m, s, w, load, rate, seconds, by)
                    for name, more in extra.items():
                        r[name].update(more)
                    r["dedicated_workers"] = dedicated_workers(catalogue, wl.popularity, rate)
                    # what the best online and clairvoyant schedulers reach on these arrivals (their goodput
                    # over LRU's: the most a scheduler could show against it)
                    r["ceilings"] = {}
                    for evict in EVICTIONS:
                        ceiling = bound(catalogue, wl, w, memory, slo_s=SLO_S, evict=evict)
                        r["ceilings"][evict] = {
                            "attainment": ceiling.attainment, "misses": ceiling.misses,
                            "cold_requests": ceiling.cold_requests,
                            "goodput_vs_lru": (ceiling.requests - ceiling.misses) / max(1, r[LRU]["within"])}
                    rows.append(r)
                    if log:
                        f, lru = r[FLOWSERVE], r[LRU]
                        log(f"  {load:.0%} ({rate:.0f} req/s): flowserve {f['attainment'][0]:.4%} within, late "
                            f"{f['late']}, refused {f['refused']}; lru {lru['attainment'][0]:.4%} within, late "
                            f"{lru['late']}; copy lane busy {f['copy_busy']:.0%} (lru {lru['copy_busy']:.0%}); "
                            f"goodput x{f['goodput_vs_lru'][0]:.2f}; ceilings: online "
                            f"{r['ceilings']['online']['attainment']:.4%}, clairvoyant "
                            f"{r['ceilings']['clairvoyant']['attainment']:.4%}; one model per worker: "
                            f"{r['dedicated_workers']} workers")
    _print(rows)
    return {"workload": "models", "simulated": True,
            "note": "simulated: emulated T4 workers (flowserve.models.simulate), not live workers",
            "slo_ms": SLO_S * 1000, "jitter_cv": JITTER_CV, "memory_share": MEMORY_SHARE, "seconds": seconds,
            "capacities": capacities, "rows": rows, "wall_s": time.perf_counter() - wall,
            "targets": models_targets(rows)}


def _print(rows: Sequence[dict[str, Any]]) -> None:
    table = Table(title=f"many models, SIMULATED emulated T4 workers: within {SLO_S * 1000:.0f} ms "
                  "(95% interval), late, refused early")
    for col in ("models", "s", "workers", "load", "req/s", "flowserve within", "late", "refused", "lru within",
                "lru late", "goodput / lru", "1 model/worker"):
        table.add_column(col, justify="right")
    for r in rows:
        f, lru = r[FLOWSERVE], r[LRU]
        table.add_row(str(r["models"]), f"{r['s']}", str(r["workers"]), f"{r['load']:.0%}", f"{r['rate']:.0f}",
                      f"{f['attainment'][0]:.3%} [{f['attainment'][1]:.3%}]", str(f["late"]), str(f["refused"]),
                      f"{lru['attainment'][0]:.2%}", str(lru["late"]), f"{f['goodput_vs_lru'][0]:.2f}x "
                      f"[{f['goodput_vs_lru'][1]:.2f}]", str(r["dedicated_workers"]))
    console.print(table)
