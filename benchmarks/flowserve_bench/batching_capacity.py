"""The capacity the batching bench's load cells are fractions of: the highest open-loop Poisson rate the best
static policy keeps up with, probed over repeated, interleaved slices.

A policy keeps up at a rate when every request is answered and the p99 is within the SLO. One 2-s probe
per rate let one stall of a shared machine (or one lucky quiet stretch) set the capacity, so each policy
takes ``repeats`` probes per rate, the policies taking turns, and keeps up when its median probe does
(more than half of its probes keep up). Every static policy is probed, not one chosen beforehand: the
cells' loads are then fractions of what the strongest fixed batch sustains, so adaptive is not compared at
loads that only a weak baseline finds heavy. A policy leaves the ramp at the first rate it does not keep
up with; the ramp ends when none is left.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

#: probes per policy and rate; a policy keeps up at a rate when more than half of them do (the median)
REPEATS = 3
#: the ramp's step between probed rates
STEP = 1.2
#: the most rates probed (ramp and steps down), before the bisection step
MAX_RATES = 16

#: (policy, rate, seed) -> the probe's cell (``sent``, ``ok``, ``errors``, ``p99_ms``); the probes of one
#: rate and repeat get the same seed, so the policies replay the same arrival trace
Probe = Callable[[str, float, int], Awaitable[dict[str, Any]]]


def probe_keeps_up(cell: dict[str, Any], slo_ms: float) -> bool:
    """One probe kept up: every request answered without error, p99 within the SLO."""
    return bool(cell["errors"] == 0 and cell["ok"] == cell["sent"] and cell["p99_ms"] is not None
                and cell["p99_ms"] <= slo_ms)


def keeps_up(cells: Sequence[dict[str, Any]], slo_ms: float) -> bool:
    """A policy keeps up at a rate when its median probe does: more than half of its repeated probes."""
    return 2 * sum(probe_keeps_up(c, slo_ms) for c in cells) > len(cells)


def median_p99(cells: Sequence[dict[str, Any]]) -> float | None:
    """The median over probes of each probe's p99 (a probe that answered nothing counts as unbounded)."""
    if not cells:
        return None
    value = float(np.median([np.inf if c["p99_ms"] is None else c["p99_ms"] for c in cells]))
    return value if np.isfinite(value) else None


async def probe_rate(probe: Probe, labels: Sequence[str], rate: float, seed: int,
                     repeats: int = REPEATS) -> dict[str, list[dict[str, Any]]]:
    """``repeats`` probes of each policy at ``rate``, taking turns (the order rotated every repeat, so no
    policy always follows the same one); repeat ``r`` of every policy gets seed ``seed + r``."""
    cells: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
    for r in range(repeats):
        turn = r % len(labels) if labels else 0
        for label in [*labels[turn:], *labels[:turn]]:
            cells[label].append(await probe(label, rate, seed + r))
    return cells


async def sustainable_rates(probe: Probe, labels: Sequence[str], slo_ms: float, start: float, ceiling: float,
                            *, repeats: int = REPEATS,
                            log: Callable[[str], None] = lambda _: None) -> dict[str, float]:
    """Per policy, the highest probed rate it keeps up with (0: none).

    From ``start`` the rate rises by :data:`STEP` while any policy keeps up, and halves while none has kept
    up yet; it stops above 1.5x ``ceiling`` (a backlog's drain rate: no open loop sustains more). Then one
    bisection step (the geometric middle) between the best policies' last good and first bad rates.
    """
    good = dict.fromkeys(labels, 0.0)
    bad: dict[str, float] = {}
    alive, rate = list(labels), start
    for k in range(MAX_RATES):
        verdicts = await _verdicts(probe, alive, rate, 500 + 10 * k, slo_ms, repeats, log)
        for label, ok in verdicts.items():
            if ok:
                good[label] = rate
            else:  # the rate at which it leaves the ramp (after a step down, the lower one)
                bad[label] = rate
        if not any(good.values()):  # even the first rate is too much for all of them: step down
            rate *= 0.5
            continue
        alive = [label for label in alive if verdicts[label]]
        if not alive or rate >= 1.5 * ceiling:
            break
        rate *= STEP
    top = max(good.values(), default=0.0)
    best = [label for label in labels if top > 0 and good[label] == top and label in bad]
    if best:
        mid = (top * min(bad[label] for label in best)) ** 0.5
        if mid > top * 1.05:
            verdicts = await _verdicts(probe, best, mid, 700, slo_ms, repeats, log)
            good.update({label: mid for label, ok in verdicts.items() if ok})
    return good


async def _verdicts(probe: Probe, labels: Sequence[str], rate: float, seed: int, slo_ms: float, repeats: int,
                    log: Callable[[str], None]) -> dict[str, bool]:
    cells = await probe_rate(probe, labels, rate, seed, repeats)
    verdicts = {label: keeps_up(cs, slo_ms) for label, cs in cells.items()}
    for label, cs in cells.items():
        kept = sum(probe_keeps_up(c, slo_ms) for c in cs)
        log(f"  probe {rate:>6.0f}/s {label:<11} median p99 {median_p99(cs)} ms, {kept}/{len(cs)} probes kept up "
            f"-> {'keeps up' if verdicts[label] else 'falls behind'}")
    return verdicts
