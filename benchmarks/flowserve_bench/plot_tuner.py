"""``flowserve bench tuner --simulated --plot FILE.png``: each contender's consumers over time against
the arrival rate, one panel per pipeline x trace (read from the result's ``timelines`` and
``rates_per_minute``, so a saved result can be drawn again)."""

from __future__ import annotations

import math
from typing import Any

#: contenders drawn, in this order (the bound and relative rules are in the table, not the figure)
SHOWN = ("static", "keda", "keda-tuned", "tuner", "oracle")


def panels(result: dict[str, Any]) -> tuple[int, int]:
    """(rows, columns) of the figure: a row per pipeline, a column per trace."""
    pairs = {(t["pipeline"], t["trace"]) for t in result.get("timelines") or []}
    pipelines = {p for p, _ in pairs} or {""}
    return len(pipelines), max(1, math.ceil(len(pairs) / len(pipelines)))


def simulated(fig: Any, result: dict[str, Any]) -> None:
    timelines = result.get("timelines") or []
    pipelines = list(dict.fromkeys(t["pipeline"] for t in timelines))
    traces = list(dict.fromkeys(t["trace"] for t in timelines))
    axes = fig.subplots(max(1, len(pipelines)), max(1, len(traces)), squeeze=False)
    rates = result.get("rates_per_minute") or {}
    for i, pipeline in enumerate(pipelines):
        for j, trace in enumerate(traces):
            ax = axes[i][j]
            for k, name in enumerate(SHOWN):
                line = next((t["consumers"] for t in timelines
                             if (t["pipeline"], t["trace"], t["contender"]) == (pipeline, trace, name)), None)
                if not line:
                    continue
                end = result.get("seconds", line[-1][0]) / 60
                xs = [at / 60 for at, _ in line] + [end]
                ax.step(xs, [c for _, c in line] + [line[-1][1]], where="post", color=f"C{k}", label=name,
                        linewidth=1.2 if name == "tuner" else 0.8)
            ax.set(title=f"{pipeline} / {trace}", xlabel="minute", ylabel="consumers (all stages)")
            if trace in rates:
                twin = ax.twinx()
                twin.plot(range(len(rates[trace])), rates[trace], color="grey", linestyle=":", linewidth=1)
                twin.set_ylabel("arrivals/s (dotted)")
            if i == 0 and j == 0:
                ax.legend(fontsize=7, loc="upper left")
