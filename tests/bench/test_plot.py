"""``flowserve bench --plot``: each workload's figure is written, and every axis says what it shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flowserve.cli import build_parser
from flowserve_bench.plot import DRAWERS, plot_result

pytest.importorskip("matplotlib")

BATCHING_POLICIES = ("static-1", "static-8", "static-32", "timeout-32/10ms", "adaptive")


def _batching_cell(arrival: str, load: float) -> dict[str, Any]:
    """One cell of ``flowserve_bench.batching``'s result (values made up)."""
    policies = {p: {"attainment": 0.99 - 0.1 * load * i, "interval": [0.98 - 0.1 * load * i, 1.0 - 0.1 * load * i],
                    "sent": 600, "outcomes": {"within": 590, "late": 10, "refused": 0, "deadline": 0, "failed": 0,
                                              "lost": 0},
                    "worker": {"refused": 0, "doomed": 0, "expired": 0, "late": 10, "batches": 80},
                    "mean_batch": 4.0 * (i + 1), "p99_ms_worst_slice": None if (i, load) == (0, 0.95) else 5.0 + i,
                    "throughput_rps": 200.0 * load}
                for i, p in enumerate(BATCHING_POLICIES)}
    diffs = {p: [0.01, -0.002, 0.02] for p in BATCHING_POLICIES[:-1]}
    return {"arrival": arrival, "load": load, "rate": 300.0 * load, "policies": policies, "best_other": "static-32",
            "diff_vs_best": diffs["static-32"], "diffs": diffs, "dominates": True}


def _learn_results() -> dict[str, dict[str, Any]]:
    """Results of the four ``learn-*`` benches, from their code (values made up)."""
    cache = {"workload": "learn-cache", "zipf_s": 1.05, "hit_rate": 0.49, "hit_rate_offline": 0.5, "capacity": 64,
             "concurrency": 8, "slice_s": 2.0, "rounds": 4,
             "table": {"cache": {"rps": 900.0, "p50_ms": 3.0, "hit_p50_ms": 0.6, "miss_p50_ms": 6.0, "p99_ms": 12.0,
                                 "cpu_ms_per_request": {"gateway": 0.3, "workers": 0.8, "loadgen": 0.2}},
                       "nocache": {"rps": 500.0, "p50_ms": 5.5, "p99_ms": 11.0,
                                   "cpu_ms_per_request": {"gateway": 0.2, "workers": 1.5, "loadgen": 0.2}}},
             "throughput_ratio": [1.8, 1.7, 1.9], "hit_p50_over_miss_p50": [0.11, 0.1, 0.12],
             "targets": {"hit_latency_le_half_miss": True, "throughput_1_6x_at_45_55pct_hits": False}}
    branches = {"mlp": "digits-mlp", "small": "digits-mlp-small", "cnn": "digits-cnn"}
    selection = {
        "workload": "learn-selection", "simulated": False, "requests": 8000, "change_at": 2000, "wave": 32,
        "gamma": 0.03, "eta": 0.1, "sigma": 0.6, "branches": branches, "degraded": "mlp",
        "branch_accuracy_before": {"mlp": 0.97, "small": 0.93, "cnn": 0.98},
        "branch_accuracy_after": {"mlp": 0.6, "small": 0.93, "cnn": 0.98},
        "branch_accuracy": {"mlp": 0.69, "small": 0.93, "cnn": 0.98}, "best_branch": "cnn",
        "selector_accuracy": 0.96, "gap_vs_best": [-0.02, -0.03, -0.01], "decisions_read_back": 8000,
        "selector_counters": {"decisions": 8000, "feedback_learned": 8000, "feedback_expired": 0, "state_records": 3},
        "windows": [{"from": lo - 2000, "to": lo + 250 - 2000, "degraded_share": 0.3 if lo < 2000 else 0.05,
                     "accuracy": 0.96} for lo in range(0, 8000, 250)],
        "degraded_share_window_ending_2000": 0.05,
        "targets": {"degraded_share_lt_10pct_within_2000": True, "accuracy_within_2pts_of_best": True}}
    ensemble = {
        "workload": "learn-ensemble",
        "config": {"rate": 10.0, "slice_s": 6.0, "passes": 2, "deadline_ms": 4000, "fraction": 0.6,
                   "stall_share": 0.05},
        "sides": {"deadline": {"sent": 900, "answered": [0.999, 0.997, 1.0], "accuracy": [0.97, 0.96, 0.98],
                               "partial": 45, "accuracy_of_answered": 0.971, "errors": {}},
                  "inner": {"sent": 900, "answered": [0.95, 0.94, 0.96], "accuracy": [0.92, 0.9, 0.94],
                            "partial": 0, "accuracy_of_answered": 0.97, "errors": {"TIMEOUT": 45}}},
        "members": {"mlp": 0.96, "cnn": 0.975, "small": 0.93}, "best_member": "cnn", "join_late": 3,
        "targets": {"answers_ge_99_9pct": True, "accuracy_ge_best_member": False}}
    phases = [("pre-drift", 0.96, "base"), ("drift", 0.7, "base"), ("feedback", 0.72, "base"), ("learn", None, "base"),
              ("shadow", 0.7, "base"), ("promote", 0.9, "base/v1"), ("post-promote", 0.95, "v1")]
    continual = {
        "workload": "learn-continual", "shift": {"kind": "brightness", "amount": 6.0},
        "timeline": [{"phase": name, "requests": 0 if acc is None else 450, "errors": 0, "accuracy": acc,
                      "accuracy_ci95": None if acc is None else [acc - 0.02, acc + 0.02], "version_live": version,
                      "p50_ms": None if acc is None else 4.0, "note": "..."} for name, acc, version in phases],
        "pre_drift_accuracy": 0.96, "drifted_accuracy": 0.7, "shadow_accuracy": 0.94, "recovered_accuracy": 0.95,
        "gap_pts": 1.0, "gap_pts_ci95": [-0.5, 2.5], "promoted": True, "requests": 3000, "errors": 0,
        "duplicate_replies": 0, "training": {"examples": 600, "fit_accuracy_before": 0.7, "fit_accuracy_after": 0.95},
        "targets": {"recovers_within_3pts": True}}
    return {"learn-cache": cache, "learn-selection": selection, "learn-ensemble": ensemble,
            "learn-continual": continual}


LEARN = _learn_results()
RESULTS = {
    "batching": {"workload": "batching", "capacity_rps": 300.0, "slo_ms": 50.0, "lone_latency_ms": 5.0,
                 "per_request_ms_batch1": 1.0, "per_request_ms_batch32": 0.1, "cell_seconds": 3.0, "rounds": 4,
                 "max_rps": {p: 900.0 for p in BATCHING_POLICIES},
                 "adaptive_max_rps_ratio_to_best_static": [1.0, 0.95, 1.05],
                 "cells": [_batching_cell(a, load) for a in ("poisson", "bursty") for load in (0.1, 0.5, 0.8, 0.95)],
                 "not_dominated_in": [], "targets": {}, "drain_rps_static32": 900.0, "capacity_method": "..."},
    "broker": {"workload": "broker", "topology": "digits-fused", "slice_seconds": 2.0, "rounds": 4, "brokers": {
        label: {"kind": kind, "start_s": 3.0, "start_cpu_s": 5.0, "rss_mb_at_end": 400.0,
                "levels": {str(lvl): {"rps": (50.0 - 10 * i) * lvl, "p50_ms": 2.0, "p99_ms": 5.0,
                                      "broker_cpu_us_per_request": 90, "failed": 0} for lvl in (1, 8, 32, 128)},
                "history": {"history_batches": 10000,
                            "before": {"done": 300, "of": 300, "p50_ms": 1.0, "p99_ms": 3.0,
                                       "broker_cpu_us_per_record": 80},
                            "after": {"done": 20, "of": 300, "p50_ms": None, "p99_ms": None,
                                      "broker_cpu_us_per_record": 900}}}
        for i, (label, kind) in enumerate((("default", "kafka-dev"), ("kafka", "kafka"), ("tansu", "tansu")))},
        "throughput_over_kafka": {label: {str(lvl): [r, r - 0.05, r + 0.05] for lvl in (1, 8, 32, 128)}
                                  for label, r in (("default", 0.95), ("tansu", 0.6))},
        "targets": {"default_ge_0_8x_kafka": True}},
    **LEARN,
    # ``flowserve bench learn`` (flowserve_bench._learn): each part under its key, its targets taken out
    "learn": {"workload": "learn", "targets": {}} | {
        part: {k: v for k, v in LEARN[f"learn-{part}"].items() if k != "targets"}
        for part in ("cache", "selection", "ensemble", "continual")},
    "gateway": {"workload": "gateway", "topologies": {
        t: {c: {str(lvl): {"rps": 100.0 * lvl, "p50_ms": 2.0, "p99_ms": 5.0 + lvl, "errors": 0}
                for lvl in (1, 8, 64)} for c in ("gateway", "async")} for t in ("digits", "ensemble")}},
    "latency": {"workload": "latency", "rate": 50.0, "raw_hop_p50_ms": 1.0, "raw_hop_p99_ms": 3.0,
                "flowserve_hop_p50_ms": 1.2, "flowserve_hop_p99_ms": 3.5},
    "passthrough": {"workload": "passthrough", "records": 1000, "value_bytes": 100, "a_raw_send": 5000,
                    "b_raw_batch": 50000, "c_flowserve": 40000},
    "capture": {"workload": "capture", "ratios": {"throughput_100pct_vs_off": {"ratio": 0.9, "95ci": [0.85, 0.95]},
                                                  "p99_detector_vs_none": {"ratio": 1.02, "95ci": [0.97, 1.08]}}},
    "tuner": {"workload": "tuner", "hop_ms": 5.0, "tuner": [
        {"trace": t, "contender": c, "attainment": 0.9 + 0.01 * i, "cost_dollars": 0.01 * (i + 1)}
        for t in ("steady", "step") for i, c in enumerate(("static", "keda", "tuner"))],
        "simulate": [{"pipeline": "image-processing", "sim_p99_ms": 90.0, "live_p99_ms": 100.0},
                     {"pipeline": "cascade", "error": "no plan meets the SLO"}]},
    "simulate": {"workload": "tuner", "hop_ms": 5.0, "tuner": [],
                 "simulate": [{"pipeline": "social-media", "sim_p99_ms": 190.0, "live_p99_ms": 200.0}]},
    "parity": {"workload": "parity", "scenarios": {
        s: {c: {"p50_ms": 30.0 + i, "p99_ms": 100.0, "p99_9_ms": 150.0 * (i + 1), "gap_ms": 120.0 * (i + 1)}
            for i, c in enumerate(("none", "replicas", "parity"))} | {"p50_ratio_parity_over_none": 1.0}
        for s in ("clean", "stalls", "stopped")}},
    "scale": {"workload": "scale", "cpu": {"consumers_1": {"throughput_rps": 100.0},
                                           "consumers_2": {"throughput_rps": 180.0},
                                           "ratio_2_over_1": {"point": 1.8, "low": 1.7, "high": 1.9}}},
    "chaos": {"workload": "chaos", "seconds": 600.0, "lost": 0,
              "faults": [{"at_s": 12.5, "kind": "kill-worker", "target": "model#0", "note": ""},
                         {"at_s": 40.1, "kind": "stop-worker", "target": "pre#0", "note": "3.0 s"}],
              "http": {"sent": 100, "ok": 95, "error": 0, "failed": 5, "unanswered": 0},
              "async": {"sent": 100, "ok": 100, "error": 0, "lost": 0, "duplicates_dropped": 2}},
    "other": {"workload": "other", "a": 1.0, "b": 2},
    "tuner-simulated": {"workload": "tuner", "part": "simulated", "seconds": 600.0,
                        "rates_per_minute": {t: [100.0 * (i % 3 + 1) for i in range(10)] for t in ("spike", "mmpp")},
                        "timelines": [{"pipeline": p, "trace": t, "contender": c,
                                       "consumers": [[0.0, 2], [120.0, 2 + i]]}
                                      for p in ("image-processing", "social-media") for t in ("spike", "mmpp")
                                      for i, c in enumerate(("static", "keda", "tuner", "oracle"))]},
}


@pytest.mark.parametrize("workload", sorted(RESULTS))
def test_each_bench_plot_is_written_with_labelled_axes(workload: str, tmp_path: Path) -> None:
    path = tmp_path / f"{workload}.png"
    fig = plot_result(RESULTS[workload], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5_000
    assert fig.axes
    for ax in fig.axes:
        if not ax.xaxis.get_visible():  # a twin axis (a second quantity over the same x): its y says what
            assert ax.get_ylabel(), (workload, ax)
            continue
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title(), (workload, ax)
    if workload in ("batching", "gateway"):
        assert all(ax.get_legend() is not None for ax in fig.axes)


def test_every_bench_workload_has_its_plot_and_takes_plot() -> None:
    parser = build_parser()
    sub = next(a for a in parser._subparsers._group_actions if a.dest == "command")  # noqa: SLF001
    workloads = next(a for a in sub.choices["bench"]._actions if a.dest == "workload").choices
    assert set(workloads) <= set(DRAWERS)
    assert parser.parse_args(["bench", "latency", "--plot", "x.png"]).plot == "x.png"
