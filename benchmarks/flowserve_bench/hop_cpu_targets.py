"""The target of ``flowserve bench hop-cpu``: issue 35's "worker CPU per record per hop <= 0.5x today's".

"Today's" is the code of the commit the issue was filed from (:data:`ISSUE_35_BEFORE`), run in the same
bench as this code (:mod:`flowserve_bench.hop_cpu`): a figure written down on another day cannot decide it,
because this machine's speed moves by 2-3x between days. The target reads the high end of the now / before
ratio's 95% interval at every level (the bound must hold however the slices are resampled); a level not
run, an unbounded ratio, or a run against another commit fails it.
"""

from __future__ import annotations

from typing import Any

#: the commit whose docs/benchmarks.md holds the figures issue 35 was filed from (2026-12-02)
ISSUE_35_BEFORE = "bb77cab"
TARGET = "worker_cpu_per_record_per_hop_le_0_5x_issue_35"
BOUND = 0.5
LEVELS = ("c1", "c8", "c32", "c128")
HIGH = 2


def met(result: dict[str, Any]) -> bool:
    """Whether the run's now / before CPU per record per hop is at most :data:`BOUND` at every level."""
    if not str((result.get("before") or {}).get("commit", "")).startswith(ISSUE_35_BEFORE):
        return False
    rows = {row["load"]: row for row in result.get("loads", [])}
    for level in LEVELS:
        ratio = (rows.get(level) or {}).get("cpu_ratio")
        if not ratio or ratio[HIGH] is None or not ratio[HIGH] <= BOUND:  # NaN and None fail
            return False
    return True


def targets(result: dict[str, Any]) -> dict[str, bool]:
    return {TARGET: met(result)}
