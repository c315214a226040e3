"""``flowserve bench --plot``: each workload's figure is written, and every axis says what it shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowserve.bench.plot import DRAWERS, plot_result
from flowserve.cli import build_parser

pytest.importorskip("matplotlib")

CELLS = {"poisson@0.5": 1.0, "poisson@0.8": 0.999, "bursty@0.5": 0.98, "bursty@0.8": None}
RESULTS = {
    "batching": {"workload": "batching", "slo_ms": 50, "policies": {
        p: {"max_rps": 900.0, "attainment": CELLS, "p99_ms": {k: 20.0 for k in CELLS}, "throughput_rps": {}}
        for p in ("adaptive", "static-8", "static-32")}},
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
        for t in ("steady", "step") for i, c in enumerate(("static", "reactive", "tuner"))],
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
    "other": {"workload": "other", "a": 1.0, "b": 2},
}


@pytest.mark.parametrize("workload", sorted(RESULTS))
def test_each_bench_plot_is_written_with_labelled_axes(workload: str, tmp_path: Path) -> None:
    path = tmp_path / f"{workload}.png"
    fig = plot_result(RESULTS[workload], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5_000
    assert fig.axes
    for ax in fig.axes:
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title(), (workload, ax)
    if workload in ("batching", "gateway"):
        assert all(ax.get_legend() is not None for ax in fig.axes)


def test_every_bench_workload_has_its_plot_and_takes_plot() -> None:
    parser = build_parser()
    sub = next(a for a in parser._subparsers._group_actions if a.dest == "command")  # noqa: SLF001
    workloads = next(a for a in sub.choices["bench"]._actions if a.dest == "workload").choices
    assert set(workloads) <= set(DRAWERS)
    assert parser.parse_args(["bench", "latency", "--plot", "x.png"]).plot == "x.png"


def test_the_plan_plot_draws_the_envelope_against_the_planned_curves(tmp_path: Path) -> None:
    import numpy as np

    from flowserve.bench.plot import plot_plan
    from flowserve.tuning import curves

    arrivals = np.sort(np.random.default_rng(1).uniform(0, 60, 1800))
    stages = {"pre": curves.service_curve(1, 1, 0.001), "model": curves.service_curve(2, 8, 0.040)}
    path = tmp_path / "plan.png"
    fig = plot_plan(curves.envelope(arrivals, 0.001), stages, 0.25, path, title="t:")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (ax,) = fig.axes
    assert ax.get_xlabel() and ax.get_ylabel() and "delay bound" in ax.get_title()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(label.startswith("end to end: R=400/s") for label in labels) and "SLO 250 ms" in labels
