"""Trace generators (seeded, with the asked-for rate and variability) and the trace file format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flowserve.errors import FlowserveError
from flowserve.tuning.traces import from_timestamps, generate, load_trace, save_trace


def _cv(trace_arrivals: np.ndarray) -> float:
    gaps = np.diff(trace_arrivals)
    return float(gaps.std() / gaps.mean())


def test_same_seed_same_trace_and_the_asked_rate() -> None:
    a = generate("poisson", rate=200, seconds=60, seed=3)
    b = generate("poisson", rate=200, seconds=60, seed=3)
    assert np.array_equal(a.arrivals, b.arrivals)
    assert a.rate == pytest.approx(200, rel=0.03)
    assert _cv(a.arrivals) == pytest.approx(1.0, abs=0.05)
    assert not np.array_equal(a.arrivals, generate("poisson", rate=200, seconds=60, seed=4).arrivals)


def test_gamma_trace_has_the_chosen_cv() -> None:
    t = generate("gamma", rate=100, seconds=600, cv=4, seed=1)
    assert t.rate == pytest.approx(100, rel=0.15)
    assert _cv(t.arrivals) == pytest.approx(4.0, rel=0.15)


def test_step_trace_doubles_the_rate_inside_the_spike() -> None:
    t = generate("step", rate=100, seconds=90, factor=2, seed=2)
    before, spike, after = (len(t.window(s, s + 30)) / 30 for s in (0, 30, 60))
    assert before == pytest.approx(100, rel=0.1) and after == pytest.approx(100, rel=0.1)
    assert spike == pytest.approx(200, rel=0.1)


def test_diurnal_trace_peaks_in_the_middle() -> None:
    t = generate("diurnal", rate=200, seconds=100, low=0.25, seed=5)
    edge = len(t.window(0, 10)) / 10
    middle = len(t.window(45, 55)) / 10
    assert middle == pytest.approx(200, rel=0.1)
    assert edge < 0.5 * middle


def test_mmpp_switches_between_two_rates() -> None:
    t = generate("mmpp", rate=50, factor=4, dwell=5, seconds=600, seed=6)
    per_second = np.histogram(t.arrivals, bins=600, range=(0, 600))[0]
    assert per_second.mean() == pytest.approx(125, rel=0.25)  # half the time at each rate, on average
    assert per_second.std() > 3 * np.sqrt(per_second.mean())  # far burstier than Poisson


def test_file_round_trip_and_refusals(tmp_path: Path) -> None:
    t = generate("gamma", rate=20, seconds=5, cv=2, seed=0)
    back = load_trace(save_trace(t, tmp_path / "t.json"))
    assert np.allclose(back.arrivals, t.arrivals, atol=1e-6)
    assert (back.kind, back.seconds, back.params["cv"]) == ("gamma", 5.0, 2)
    (tmp_path / "bad.json").write_text('{"arrivals_s": [1]}')
    with pytest.raises(FlowserveError, match="not a flowserve trace"):
        load_trace(tmp_path / "bad.json")
    with pytest.raises(FlowserveError, match="unknown trace kind"):
        generate("zipf", rate=1, seconds=1)


def test_recorded_timestamps_become_relative_arrivals() -> None:
    t = from_timestamps([1_000_500, 1_000_000, 1_002_000])
    assert t.arrivals.tolist() == [0.0, 0.5, 2.0]
