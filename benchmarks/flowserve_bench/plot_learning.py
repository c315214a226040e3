"""Figures of the learning layer's benches (``learn-cache``, ``learn-selection``, ``learn-ensemble``,
``learn-continual`` and ``learn``, which runs the four), registered in :data:`flowserve_bench.plot.DRAWERS`.

Each part draws two panels onto the axes it is handed (``_cache(left, right, result)`` and so on), so
``learn`` lays the four parts out in one figure, a row per part, and each ``learn-*`` drawer alone in its
own. They read only the result dict the bench returns (``learn`` strips each part's ``targets``, so none
of them reads those).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _share(value: float | None) -> float:
    """A share (0..1) in percent; None (no data) as NaN, which matplotlib leaves out."""
    return float("nan") if value is None else 100 * float(value)


def _errors(triples: list[list[float]]) -> tuple[list[float], list[list[float]]]:
    """``[[point, low, high], ...]`` shares -> percent points and the error-bar offsets below and above."""
    points = [_share(t[0]) for t in triples]
    below = [p - _share(t[1]) for p, t in zip(points, triples, strict=True)]
    above = [_share(t[2]) - p for p, t in zip(points, triples, strict=True)]
    return points, [below, above]


def _cache(latency: Any, tput: Any, result: dict[str, Any]) -> None:
    """p50 of the hits and of the misses through the caching gateway (their ratio: hits over misses of the
    same slices), beside the gateway without cache; throughput with and without the cache, with the
    ratio's 95% interval and the hit rate it was measured at."""
    cache, plain = result["table"]["cache"], result["table"]["nocache"]
    latency.bar(["cache: hits", "cache: misses", "no cache"],
                [cache["hit_p50_ms"], cache["miss_p50_ms"], plain["p50_ms"]], color=["C2", "C1", "#888"])
    ratio = result.get("hit_p50_over_miss_p50") or [float("nan")] * 3
    latency.set(title=f"p50 latency (hit rate {_share(result.get('hit_rate')):.0f}%; "
                      f"hit/miss {ratio[0]:.2f} [{ratio[1]:.2f}, {ratio[2]:.2f}])",
                xlabel="requests", ylabel="p50 latency (ms)")
    tput.bar(["with cache", "without cache"], [cache["rps"], plain["rps"]], color=["C2", "#888"])
    t = result.get("throughput_ratio") or [float("nan")] * 3
    tput.set(title=f"closed-loop throughput at {_share(result.get('hit_rate')):.0f}% hits: {t[0]:.2f}x "
                   f"[{t[1]:.2f}, {t[2]:.2f}]", xlabel="gateway",
             ylabel="throughput (req/s)")


def _selection(share: Any, accuracy: Any, result: dict[str, Any]) -> None:
    """Per window of requests: the share of traffic on the degraded branch and the selector's accuracy,
    the change at 0; each branch's accuracy alone before and after the change, and the selector's."""
    windows = result.get("windows") or []
    ends = [w["to"] for w in windows]
    degraded = result.get("degraded", "degraded")
    share.plot(ends, [_share(w["degraded_share"]) for w in windows], marker="o", label=f"share on '{degraded}'")
    share.plot(ends, [_share(w["accuracy"]) for w in windows], marker=".", color="C2", label="selector accuracy")
    share.axvline(0, color="red", linestyle="--", linewidth=1, label=f"'{degraded}' degrades")
    share.axhline(10, color="grey", linestyle=":", linewidth=1, label="10% share")
    share.set(title="Exp3 moving traffic off the degraded branch", xlabel="requests after the change (window end)",
              ylabel="share of the window (%)", ylim=(0, 100))
    share.legend(fontsize=7)
    branches = list(result["branch_accuracy"])
    before, after = result.get("branch_accuracy_before", {}), result.get("branch_accuracy_after", {})
    xs = range(len(branches))
    accuracy.bar([x - 0.2 for x in xs], [_share(before.get(b)) for b in branches], 0.4, label="before the change")
    accuracy.bar([x + 0.2 for x in xs], [_share(after.get(b)) for b in branches], 0.4, label="after the change")
    accuracy.axhline(_share(result["selector_accuracy"]), color="black", linewidth=1.5,
                     label=f"selector, overall ({_share(result['selector_accuracy']):.1f}%)")
    accuracy.set_xticks(list(xs), branches)
    gap = result.get("gap_vs_best") or [float("nan")] * 3
    accuracy.set(title=f"always one branch; selector - best: {100 * gap[0]:+.1f} pts "
                       f"[{100 * gap[1]:+.1f}, {100 * gap[2]:+.1f}]",
                 xlabel="branch", ylabel="accuracy (%)", ylim=(0, 125))
    accuracy.legend(fontsize=7, loc="upper left", ncols=3)


def _ensemble(answered: Any, accuracy: Any, result: dict[str, Any]) -> None:
    """Per side (deadline join, inner join): answered within the deadline and accuracy, with 95% intervals;
    each member's accuracy alone beside them."""
    sides = result["sides"]
    names = list(sides)
    points, err = _errors([sides[s]["answered"] for s in names])
    answered.bar(names, points, yerr=err, capsize=5, color=[f"C{i}" for i in range(len(names))])
    answered.set(title="answered within the deadline, 95% intervals", xlabel="join", ylabel="answered (%)",
                 ylim=(max(0.0, min(points) - 10), 100.5))
    members = result.get("members", {})
    points, err = _errors([sides[s]["accuracy"] for s in names])
    labels = [f"ensemble ({s})" for s in names] + [f"{m} alone" for m in members]
    accuracy.bar(labels[:len(names)], points, yerr=err, capsize=5, color=[f"C{i}" for i in range(len(names))])
    accuracy.bar(labels[len(names):], [_share(v) for v in members.values()], color="#999")
    accuracy.tick_params(axis="x", labelrotation=20)
    accuracy.set(title="accuracy over every request sent (members: never stalled)", xlabel="side / member",
                 ylabel="accuracy (%)", ylim=(max(0.0, min(points + [_share(v) for v in members.values()]) - 10), 100))


def _continual(accuracy: Any, latency: Any, result: dict[str, Any]) -> None:
    """The timeline: accuracy per phase with its interval, each phase's live version(s) under its name;
    p50 latency per phase."""
    rows = result["timeline"]
    xs = list(range(len(rows)))
    scored = [(x, r) for x, r in zip(xs, rows, strict=True) if r["accuracy"] is not None]
    acc = [100 * r["accuracy"] for _, r in scored]
    err = [[a - 100 * r["accuracy_ci95"][0] for a, (_, r) in zip(acc, scored, strict=True)],
           [100 * r["accuracy_ci95"][1] - a for a, (_, r) in zip(acc, scored, strict=True)]]
    accuracy.errorbar([x for x, _ in scored], acc, yerr=err, marker="o", capsize=4, label="accuracy, 95% interval")
    if result.get("pre_drift_accuracy") is not None:
        accuracy.axhline(100 * result["pre_drift_accuracy"] - 3, color="red", linestyle=":", linewidth=1,
                         label="pre-drift - 3 pts (target)")
    ticks = [f"{r['phase']}\n[{r['version_live']}]" for r in rows]  # the version(s) live in each phase
    accuracy.set_xticks(xs, ticks, fontsize=8)
    accuracy.set(title=f"accuracy per phase [live version]; gap {result.get('gap_pts')} pts, "
                       f"{'promoted' if result.get('promoted') else 'not promoted'}",
                 xlabel="phase", ylabel="accuracy (%)")
    accuracy.legend(fontsize=7)
    latency.bar(xs, [float("nan") if r["p50_ms"] is None else r["p50_ms"] for r in rows])
    latency.set_xticks(xs, ticks, fontsize=8)
    latency.set(title="p50 latency per phase", xlabel="phase", ylabel="p50 latency (ms)")


Part = Callable[[Any, Any, dict[str, Any]], None]
PARTS: dict[str, Part] = {"cache": _cache, "selection": _selection, "ensemble": _ensemble, "continual": _continual}


def _drawer(part: str) -> Callable[[Any, dict[str, Any]], None]:
    def draw(fig: Any, result: dict[str, Any]) -> None:
        left, right = fig.subplots(1, 2)
        PARTS[part](left, right, result)

    draw.__name__ = f"learn_{part}"
    draw.__doc__ = PARTS[part].__doc__
    return draw


learn_cache = _drawer("cache")
learn_selection = _drawer("selection")
learn_ensemble = _drawer("ensemble")
learn_continual = _drawer("continual")


def learn(fig: Any, result: dict[str, Any]) -> None:
    """``flowserve bench learn``: a row of two panels per part the result holds, each part's title prefixed."""
    parts = [p for p in PARTS if isinstance(result.get(p), dict)]
    rows = fig.subplots(len(parts) or 1, 2, squeeze=False)
    for (left, right), part in zip(rows, parts, strict=False):
        PARTS[part](left, right, result[part])
        for ax in (left, right):
            ax.set_title(f"{part}: {ax.get_title()}", fontsize=9)


DRAWERS = {"learn-cache": learn_cache, "learn-selection": learn_selection, "learn-ensemble": learn_ensemble,
           "learn-continual": learn_continual, "learn": learn}
