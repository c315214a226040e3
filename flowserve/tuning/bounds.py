"""The planner's lower bounds (network calculus): fewer consumers than these cannot meet the SLO.

:class:`Bounds` answers, per stage, hardware and max batch, the fewest consumers below which the simulated
percentile cannot meet the SLO, from the trace's arrival curve (:func:`flowserve.tuning.curves.fewest_servers`);
the planner (:mod:`flowserve.tuning.plan`) skips what they rule out without simulating it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from flowserve.tuning import curves
from flowserve.tuning.simulate import batch_time, jitter_floor
from flowserve.tuning.stages import StageConfig, StageOptions


def required_stages(options: Sequence[StageOptions]) -> set[str]:
    """The stages every completed request passes through: the outputs and, up from them, every input of a
    single-input or inner-join stage and what all inputs of an any-join share (a routed branch is not)."""
    by_id = {o.id: o for o in options}
    memo: dict[str, set[str]] = {}

    def through(sid: str) -> set[str]:
        if sid not in memo:
            o = by_id[sid]
            ups = [through(src) if src is not None else set() for src, _ in o.inputs]
            shared = set.intersection(*ups) if o.join == "any" and ups else set().union(*ups)
            memo[sid] = {sid} | shared
        return memo[sid]

    return set().union(*(through(o.id) for o in options if o.output))


class Bounds:
    """Lower bounds from the trace's arrival curve (:func:`curves.fewest_servers`): per stage, hardware
    and max batch, the fewest consumers below which the simulated percentile cannot meet the SLO. They
    hold for the simulator itself (its smallest jitter draw, the smallest hop and overhead), so pruning
    with them never drops a configuration the simulation would accept."""

    def __init__(self, options: Sequence[StageOptions], arrivals: np.ndarray, slo_s: float, *,
                 percentile: float, hop_s: float | np.ndarray, overhead_s: float | np.ndarray, jitter: float,
                 seed: int) -> None:
        a = np.sort(np.asarray(arrivals, dtype=float))
        n = a.size
        # numpy's "higher" percentile is the sorted value at this index: this many late requests exceed it
        self.late = n - math.ceil(percentile / 100 * (n - 1)) if n else 1
        span = float(a[-1] - a[0]) if n > 1 else 1.0
        self.windows, self.counts = curves.window_counts(a, 1e-3, max(span, 2e-3))
        # a request reaches a stage at least one hop after it arrives and leaves the pipeline a hop after it
        self.slack = slo_s - 2 * float(np.min(hop_s))
        self.overhead = float(np.min(overhead_s))
        self.required = required_stages(options)
        self.options = {o.id: o for o in options}
        self.floor = {o.id: jitter_floor(seed, i, n, jitter) for i, o in enumerate(options)}
        self._fewest: dict[tuple[str, str, int], int] = {}

    def fewest(self, stage: str, kind: str, batch: int) -> int:
        key = (stage, kind, batch)
        if key not in self._fewest:
            if stage not in self.required:
                self._fewest[key] = 1  # a routed branch sees an unknown share of the trace
            else:
                table = self.options[stage].tables[kind]
                per_item = min((batch_time(table, b) * self.floor[stage] + self.overhead) / b
                               for b in range(1, batch + 1))
                self._fewest[key] = curves.fewest_servers(self.windows, self.counts, per_item, self.slack, self.late)
        return self._fewest[key]

    def rules_out(self, config: dict[str, StageConfig]) -> bool:
        return any(c.consumers < self.fewest(sid, c.hardware, c.max_batch) for sid, c in config.items())
