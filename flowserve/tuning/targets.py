"""The SLO split into per-stage targets: what the tuner holds each stage of a plan to.

A stage's target is its plan's batch and batch time (with the per-batch overhead), its share of the traffic
(routing fractions along the graph), its share of the SLO, and one consumer's safe rate within that share.
The SLO share is the mean of the plan's own split (each stage's simulated p99 at the plan's configuration,
``stage_p99_ms``) and an even one (batch time plus the slack in equal parts and by batch time), over the
longest path a request crosses: parallel branches share the SLO's time instead of adding to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from flowserve.tuning.capacity import safe_rate
from flowserve.tuning.plan import Plan
from flowserve.tuning.rules import RATE_WINDOW_S, StageTarget
from flowserve.tuning.simulate import batch_time
from flowserve.tuning.stages import StageOptions


def targets_from_plan(options: Sequence[StageOptions], plan: Plan, *, profile: bool = True) -> list[StageTarget]:
    """Per stage: the plan's batch and its batch time, an SLO share (that batch time plus a part of what the
    SLO leaves after hops and batch times), the stage's share of the traffic, and (``profile``) one
    consumer's safe rate within its SLO share (:func:`~flowserve.tuning.capacity.safe_rate`)."""
    share: dict[str, float] = {}
    for o in options:  # topological order
        parts = []
        for src, port in o.inputs:
            if src is None:
                parts.append(1.0)
            else:
                up = next(x for x in options if x.id == src)
                parts.append(share[src] * up.fractions.get(port, 1.0))
        share[o.id] = (sum(parts) if o.join == "any" else min(parts)) if parts else 1.0
    # a batch costs its device time plus the plan's per-batch overhead (poll, decode, produce): a target
    # without it counts a small-batch stage as faster than it is and leaves it saturated
    overhead_s = plan.overhead_ms / 1000
    times = {o.id: batch_time(o.tables[plan.stages[o.id].hardware], plan.stages[o.id].max_batch) + overhead_s
             for o in options}
    # a request crosses the stages of one path, not all of them: parallel branches (a fan-out and its join)
    # share the SLO's time instead of adding to it (summed, video-monitoring's four stages left no slack)
    total, stages = critical_path(options, times)
    budget = plan.slo_ms / 1000 - plan.hop_ms / 1000 * (stages + 1)
    # half the plan's own split (each stage's simulated p99 there), half the even one: the plan's p99s are
    # one sample's peak, where a stage it never queued gets almost nothing; the even split alone gave
    # video-monitoring's 30-ms stages shares their p99 could not keep, at 6.6x the oracle's cost
    even = _even_shares(options, times, budget, total, stages)
    planned = _planned_shares(options, plan, budget) or even
    shares = {k: (planned[k] + even[k]) / 2 for k in even}
    out = []
    for o in options:
        cfg = plan.stages[o.id]
        slo_share = max(times[o.id], shares[o.id])
        rate = (max(safe_rate(tuple(sorted(o.tables[cfg.hardware].items())), cfg.max_batch, slo_share,
                              overhead_s=overhead_s), _carried(plan, share[o.id], cfg.consumers))
                if profile else 0.0)
        out.append(StageTarget(o.id, cfg.max_batch, times[o.id], slo_share, share[o.id], plan.partitions,
                               cfg.consumers, rate))
    return out


def _carried(plan: Plan, traffic_share: float, consumers: int) -> float:
    """Requests/s the busiest of the plan's ``consumers`` carried in its trace's busiest window of at least
    ``RATE_WINDOW_S`` (the window the profile rule reads live): the plan met the SLO there, so one consumer
    is safe at that rate whatever its share says. A share is a split of one budget over the longest path,
    and a stage on it beside a slow one gets little: cascade's 8-ms ``final`` got 10 ms, a safe rate of
    490/s, and the tuner ran it at 12 consumers where the plan's one met the SLO at 2,167/s (0 without an
    envelope)."""
    rates = [n / w for w, n in plan.envelope if w >= RATE_WINDOW_S]
    if not rates or consumers < 1:
        return 0.0
    partitions = max(1, plan.partitions)
    return max(rates) * traffic_share * math.ceil(partitions / consumers) / partitions


def _planned_shares(options: Sequence[StageOptions], plan: Plan, budget_s: float) -> dict[str, float] | None:
    """The SLO split in proportion to each stage's simulated p99 at the plan's own configuration (the plan's
    ``stage_p99_ms``), scaled so the longest path fills the budget: the plan met its SLO with these, so its
    consumers keep their shares. None when the plan has no such figures (older plan files)."""
    planned = plan.predicted.get("stage_p99_ms") or {}
    if not all(o.id in planned for o in options):
        return None
    seconds = {o.id: float(planned[o.id]) / 1000 for o in options}
    longest, _ = critical_path(options, seconds)
    scale = budget_s / longest if longest > 0 else 1.0
    return {k: v * scale for k, v in seconds.items()}


def _even_shares(options: Sequence[StageOptions], times: dict[str, float], budget_s: float, total: float,
                 stages: int) -> dict[str, float]:
    """Without the plan's per-stage figures, the queueing slack is split half in equal parts, so a
    sub-millisecond stage has room for the bursts a produce batch makes, and half in proportion to batch
    time, as a stage waits about one batch for the batch in progress (equal parts alone left a 140 ms
    classifier with a share its p99 could not keep at the plan's own consumers)."""
    slack = max(0.0, budget_s - total)
    return {o.id: times[o.id] + slack / 2 / max(1, stages) + slack / 2 * times[o.id] / (total or 1.0)
            for o in options}


def critical_path(options: Sequence[StageOptions], times: dict[str, float]) -> tuple[float, int]:
    """The longest path's batch times and its number of stages (``options`` in topological order)."""
    longest: dict[str, tuple[float, int]] = {}
    for o in options:
        ups = [longest[src] for src, _ in o.inputs if src is not None and src in longest]
        before = max(ups, default=(0.0, 0))
        longest[o.id] = (before[0] + times[o.id], before[1] + 1)
    return max(longest.values(), default=(0.0, 0))
