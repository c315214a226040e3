"""The accounting of ``flowserve bench models`` (:mod:`flowserve_bench.models`): a run's answers turned into
figures with 95% intervals, and the issue's targets decided on each interval's conservative end. Pure: it
takes per-slice tallies, so a unit test can feed it a known bad run.

A cell (models x Zipf s x workers x load) is served once per contender on the same arrivals, cut into
``slices`` consecutive spans of arrivals; slice ``i`` of two contenders holds the same requests, so the
bootstrap resamples slice indices and keeps pairs together (:mod:`flowserve_bench.attainment`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowserve_bench.attainment import RESAMPLES, Tally, attainment

FLOWSERVE, LRU = "flowserve", "lru"
#: the issue's bars
ATTAINMENT = 0.999
LATE = 0.0001
GOODPUT_RATIO = 2.0


@dataclass(frozen=True, slots=True)
class Slice:
    """One span of one contender's run: requests sent, answered within the SLO, answered late, refused
    early (kind ``deadline``); the rest (``lost``) were never answered nor refused."""

    sent: int
    within: int
    late: int
    refused: int

    @property
    def lost(self) -> int:
        return self.sent - self.within - self.late - self.refused


def slices_of(arrival: np.ndarray, within: np.ndarray, late: np.ndarray, refused: np.ndarray,
              count: int) -> list[Slice]:
    """Per-request outcomes cut into ``count`` spans of equal numbers of arrivals (in arrival order)."""
    order = np.argsort(arrival, kind="stable")
    return [Slice(int(part.size), int(within[part].sum()), int(late[part].sum()), int(refused[part].sum()))
            for part in np.array_split(order, count)]


def figures(mine: Sequence[Slice], seconds: float) -> dict[str, Any]:
    """One contender's figures: attainment, late and refused shares (each with its 95% interval), goodput."""
    def share(field: str) -> list[float]:
        return list(attainment([Tally(s.sent, getattr(s, field)) for s in mine]))

    sent = sum(s.sent for s in mine)
    return {"sent": sent, "within": sum(s.within for s in mine), "late": sum(s.late for s in mine),
            "refused": sum(s.refused for s in mine), "lost": sum(s.lost for s in mine),
            "attainment": share("within"), "late_share": share("late"), "refused_share": share("refused"),
            "goodput_rps": sum(s.within for s in mine) / seconds if seconds > 0 else 0.0}


def goodput_ratio(mine: Sequence[Slice], theirs: Sequence[Slice], *, resamples: int = RESAMPLES,
                  seed: int = 0) -> list[float]:
    """Answers within the SLO of ``mine`` over ``theirs`` on the same arrivals (so the same seconds), and
    its 95% bootstrap interval over paired slices; inf where the other answered none in time."""
    if len(mine) != len(theirs) or not mine:
        raise ValueError(f"need the same number of slices on both sides, got {len(mine)} and {len(theirs)}")
    a = np.array([s.within for s in mine], dtype=float)
    b = np.array([s.within for s in theirs], dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(a), (resamples, len(a)))
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = a[picks].sum(axis=1) / b[picks].sum(axis=1)
        point = a.sum() / b.sum() if b.sum() else np.inf
    boot = np.nan_to_num(boot, nan=0.0, posinf=np.inf)
    # no interpolation: between two infinite resamples it would be NaN
    low, high = np.quantile(boot, [0.025, 0.975], method="inverted_cdf")
    return [float(point), float(low), float(high)]


def _key(row: dict[str, Any]) -> tuple[int, float, int, float]:
    return row["models"], row["s"], row["workers"], row["load"]


def models_targets(rows: Sequence[dict[str, Any]]) -> dict[str, bool]:
    """The issue's targets from the cells' rows (each: models, s, workers, load, and per contender its
    figures; flowserve's with ``goodput_vs_lru``). Each is decided on every Zipf s the run has, on the
    interval's conservative end; a target whose cells did not run is False."""

    def cells(models: int, workers: int, load: float) -> list[dict[str, Any]]:
        return [r for r in rows if _key(r)[0] == models and _key(r)[2] == workers and abs(r["load"] - load) < 1e-9]

    def attains(models: int, workers: int, load: float) -> bool:
        chosen = cells(models, workers, load)
        return bool(chosen) and all(r[FLOWSERVE]["attainment"][1] >= ATTAINMENT for r in chosen)

    def late_ok(models: int, workers: int, load: float) -> bool:
        chosen = cells(models, workers, load)
        return bool(chosen) and all(r[FLOWSERVE]["late_share"][2] <= LATE for r in chosen)

    def rest_refused(models: int, workers: int, load: float) -> bool:
        chosen = cells(models, workers, load)
        return bool(chosen) and all(r[FLOWSERVE]["lost"] == 0 for r in chosen)

    at70 = [r for r in rows if abs(r["load"] - 0.7) < 1e-9]
    return {"1000_models_2_workers_70pct_attainment_ge_99.9pct": attains(1000, 2, 0.7),
            "1000_models_2_workers_70pct_late_le_0.01pct": late_ok(1000, 2, 0.7),
            "1000_models_2_workers_70pct_rest_refused_early_deadline": rest_refused(1000, 2, 0.7),
            "goodput_ge_2x_lru_at_70pct": bool(at70) and all(r[FLOWSERVE]["goodput_vs_lru"][1] >= GOODPUT_RATIO
                                                             for r in at70),
            "4000_models_4_workers_50pct_attainment_ge_99.9pct": attains(4000, 4, 0.5)}


def row(models: int, s: float, workers: int, load: float, rate: float, seconds: float,
        by_contender: Mapping[str, Sequence[Slice]]) -> dict[str, Any]:
    """One cell's row: each contender's :func:`figures`, flowserve's goodput over LRU's."""
    out: dict[str, Any] = {"models": models, "s": s, "workers": workers, "load": load, "rate": rate}
    for name, mine in by_contender.items():
        out[name] = figures(mine, seconds)
    if FLOWSERVE in by_contender and LRU in by_contender:
        out[FLOWSERVE]["goodput_vs_lru"] = goodput_ratio(by_contender[FLOWSERVE], by_contender[LRU])
    return out
