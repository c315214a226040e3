"""``flowserve plan --plot`` (flowserve.tuning.plot_plan): the arrival envelope against the planned curves."""

from pathlib import Path

import numpy as np
import pytest

from flowserve.tuning import curves
from flowserve.tuning.plot_plan import plot_plan

pytest.importorskip("matplotlib")


def test_the_plan_plot_draws_the_envelope_against_the_planned_curves(tmp_path: Path) -> None:
    arrivals = np.sort(np.random.default_rng(1).uniform(0, 60, 1800))
    stages = {"pre": curves.service_curve(1, 1, 0.001), "model": curves.service_curve(2, 8, 0.040)}
    path = tmp_path / "plan.png"
    fig = plot_plan(curves.envelope(arrivals, 0.001), stages, 0.25, path, title="t:")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (ax,) = fig.axes
    assert ax.get_xlabel() and ax.get_ylabel() and "delay bound" in ax.get_title()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(label.startswith("end to end: R=400/s") for label in labels) and "SLO 250 ms" in labels
