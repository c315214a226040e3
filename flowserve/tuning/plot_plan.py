"""``flowserve plan --plot FILE.png``: the planned configuration drawn in network-calculus terms.

matplotlib is imported when a plan is drawn (the ``plot`` extra), never with flowserve; only its object
API is used (a ``Figure`` rendered by the Agg canvas): no pyplot state, no display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from flowserve.errors import ErrorKind, FlowserveError
from flowserve.tuning import curves


def figure(panels: int, width: float = 6.0) -> Any:
    """A matplotlib ``Figure`` of ``panels`` side by side, or an error saying how to install matplotlib."""
    try:
        from matplotlib.figure import Figure  # heavy and optional: only when a figure is drawn
    except ImportError:
        raise FlowserveError("--plot needs matplotlib: pip install 'flowserve[plot]'",
                             kind=ErrorKind.INVALID_SETTINGS) from None
    return Figure(figsize=(width * panels, 4.5), layout="constrained")


def plot_plan(family: Any, stages: dict[str, Any], slo_s: float, path: str | Path, title: str = "") -> Any:
    """``flowserve plan --plot``: the trace's arrival envelope (its token buckets and their minimum) against
    each planned stage's rate-latency service curve and the end-to-end curve they convolve to, with the
    delay bound that the planned configuration gives (network calculus: the horizontal deviation)."""
    fig = figure(1, width=8.0)
    ax = fig.subplots()
    total = curves.convolve(list(stages.values()))
    t_min = min(b.window for b in family) / 4
    ts = np.geomspace(t_min, max(b.window for b in family), 200)
    for bucket in family:
        ax.plot(ts, [bucket(t) for t in ts], color="grey", linewidth=0.5, alpha=0.5)
    ax.plot(ts, [curves.arrival_curve(family, t) for t in ts], color="C0", linewidth=2,
            label="arrival envelope (min of the token buckets)")
    for i, (name, beta) in enumerate(stages.items()):
        ax.plot(ts, [beta(t) for t in ts], color=f"C{i + 1}", linestyle="--", linewidth=1,
                label=f"{name}: R={beta.rate:.0f}/s, T={beta.latency * 1000:.1f} ms")
    ax.plot(ts, [total(t) for t in ts], color="black", linewidth=2,
            label=f"end to end: R={total.rate:.0f}/s, T={total.latency * 1000:.1f} ms")
    delay = curves.delay_bound(family, total)
    text = f"delay bound {delay * 1000:.0f} ms" if delay != float("inf") else "unstable: arrivals outrun the service"
    ax.axvline(slo_s, color="red", linestyle=":", linewidth=1, label=f"SLO {slo_s * 1000:.0f} ms")
    ax.set(xscale="log", yscale="log", xlabel="time window t (s)", ylabel="requests",
           title=f"{title} {text}".strip())
    ax.set_ylim(bottom=max(0.5, min(b.burst for b in family) / 4))
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)
    return fig
