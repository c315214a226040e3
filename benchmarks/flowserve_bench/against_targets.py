"""The targets of ``flowserve bench gateway --against``, each read on its interval's conservative end.

A ratio is ``[point, low, high]`` over paired slices (:func:`flowserve_bench.against.comparison_row`); a
throughput target reads the low end (flowserve / the other server must reach the bound however the
slices are resampled) and a p99 target the high end. A ratio that is missing (a level not run) or
unbounded (null: a side answered nothing) fails its target.

Each target reads one topology, by the name it runs under, and is decided only where the run deployed
that topology: a run against an MLServer serving digits decides the digits targets, one against an
MLServer serving the image classifier the image target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

#: which figure of a ``[point, low, high]`` ratio a target reads: its interval's conservative end
LOW, HIGH = 1, 2
ALL_LEVELS = ("c1", "c8", "c32", "c128")


@dataclass(frozen=True, slots=True)
class RatioTarget:
    """Every ``loads`` of ``topology`` on every broker in ``brokers``: ``ratio`` >= ``bound`` (throughput,
    low end) or <= ``bound`` (p99, high end)."""

    topology: str
    ratio: Literal["throughput_ratio", "p99_ratio"]
    bound: float
    loads: tuple[str, ...] = ALL_LEVELS
    #: "all": every broker the run measured; "both": the default (or embedded) broker and Apache Kafka
    brokers: Literal["all", "both"] = "all"
    #: the run must have applied a plan that fused at least one chain (``--topology FILE:PLAN``)
    planned_fusion: bool = False


TARGETS: dict[str, RatioTarget] = {
    # issue 16
    "fused_ge_1x_mlserver_all_levels_both_brokers": RatioTarget("digits-fused", "throughput_ratio", 1.0,
                                                                brokers="both"),
    "fused_p99_at_8_le_1_5x_mlserver": RatioTarget("digits-fused", "p99_ratio", 1.5, ("c8",)),
    "three_stage_ge_1x_at_32_and_up": RatioTarget("digits", "throughput_ratio", 1.0, ("c32", "c128")),
    # issue 35
    "three_stage_ge_1x_all_levels": RatioTarget("digits", "throughput_ratio", 1.0),
    "planned_ge_1_3x_all_levels": RatioTarget("digits-planned", "throughput_ratio", 1.3, planned_fusion=True),
    "fused_ge_1_2x_all_levels": RatioTarget("digits-fused", "throughput_ratio", 1.2),
    "fused_p99_at_8_le_1_2x": RatioTarget("digits-fused", "p99_ratio", 1.2, ("c8",)),
    # issue 36
    "image_fused_ge_1x_all_levels": RatioTarget("image-classifier-fused", "throughput_ratio", 1.0),
}


def _run(runs: list[dict[str, Any]], topology: str) -> dict[str, Any] | None:
    return next((run for run in runs if run["topology"] == topology), None)


def ratio_end(run: dict[str, Any] | None, load: str, key: str, end: int) -> float | None:
    """One end of ``key``'s interval at ``load`` in ``run``; None where the run lacks it or it is unbounded."""
    for row in (run or {}).get("loads", []):
        if row["load"] == load and key in row:
            value = row[key][end]
            return None if value is None else float(value)
    return None


def _brokers(runs: dict[str, list[dict[str, Any]]], which: str) -> list[str] | None:
    """The broker runs a target reads; None where the run lacks one it needs."""
    if which == "all":
        return list(runs)
    # "Both brokers" are the one a new user meets and Apache Kafka: the default broker where this run has
    # it (Apache Kafka under DEV_JVM where Java is present), else the embedded one (Tansu).
    first = "default" if "default" in runs else "embedded"
    return [first, "kafka"] if {first, "kafka"} <= runs.keys() else None


def decide(target: RatioTarget, runs: dict[str, list[dict[str, Any]]]) -> bool:
    """Whether ``target`` is met on every broker and load it reads."""
    kinds = _brokers(runs, target.brokers)
    if not kinds:
        return False
    end = LOW if target.ratio == "throughput_ratio" else HIGH
    for kind in kinds:
        run = _run(runs[kind], target.topology)
        if run is None or (target.planned_fusion and not ((run.get("plan") or {}).get("fuse"))):
            return False
        for load in target.loads:
            value = ratio_end(run, load, target.ratio, end)
            if value is None or (value < target.bound if end == LOW else value > target.bound):
                return False
    return True


def targets(runs: dict[str, list[dict[str, Any]]]) -> dict[str, bool]:
    """Each target whose topology the run deployed (on any broker), decided (:func:`decide`)."""
    ran = {run["topology"] for kind in runs.values() for run in kind}
    return {name: decide(target, runs) for name, target in TARGETS.items() if target.topology in ran}
