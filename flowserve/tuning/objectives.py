"""What the planner minimises (``flowserve plan --objective cost|energy|carbon``) and the energy a plan is
expected to use.

The search (:func:`flowserve.tuning.plan.search`) minimises a price per replica-hour per hardware kind:
dollars for ``cost``; for ``energy`` and ``carbon`` the caller passes joules or grams CO2e per replica-hour
(``flowserve.energy.watt_prices``: each kind at its active draw). Whatever the objective,
:func:`account_energy` records in the plan its dollars per hour and its expected joules per request.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from flowserve.errors import FlowserveError
from flowserve.tuning.plan import Plan

#: 1 kWh (grams CO2e per request = joules / this x grams per kWh)
JOULES_PER_KWH = 3_600_000.0

#: what ``flowserve plan --objective`` may minimise: dollars, joules or grams CO2e per replica-hour
OBJECTIVES = ("cost", "energy", "carbon")


def account_energy(plan: Plan, arrivals: np.ndarray, *, objective: str, dollars: dict[str, float],
                   watts: dict[str, tuple[float, float]], g_per_kwh: float | None = None) -> Plan:
    """Record in ``plan.predicted`` the objective it was searched for, its dollars per hour (``dollars``: per
    kind; the search may have priced kinds in joules), and ``joules_per_request``: each stage's consumers
    drawing their kind's idle watts, plus the active share at the stage's simulated utilisation
    (``watts``: per kind, (idle, active)), over the trace's mean arrival rate; given ``g_per_kwh``, also
    ``g_co2e_per_request`` at that carbon intensity.

    >>> from flowserve.tuning.stages import StageConfig
    >>> p = Plan("t", 100.0, 1, 5.0, {"a": StageConfig("k", 1, 2)}, {"utilisation": {"a": 0.5}})
    >>> account_energy(p, np.arange(11.0), objective="energy", dollars={"k": 1.0},
    ...                watts={"k": (10.0, 30.0)}).predicted["joules_per_request"]  # 2 x 20 W / 1 request/s
    40.0
    """
    if objective not in OBJECTIVES:
        raise FlowserveError(f"unknown objective '{objective}' (objectives: {', '.join(OBJECTIVES)})")
    a = np.asarray(arrivals, dtype=float)
    span = float(a.max() - a.min()) if a.size > 1 else 0.0
    rate = (a.size - 1) / span if span > 0 else float(a.size)
    utilisation = plan.predicted.get("utilisation", {})
    joules_per_s = 0.0
    for stage, cfg in plan.stages.items():
        idle, active = watts[cfg.hardware]
        u = min(1.0, max(0.0, float(utilisation.get(stage, 0.0))))
        joules_per_s += cfg.consumers * (idle + (active - idle) * u)
    joules = joules_per_s / rate if rate > 0 else 0.0
    predicted = {**plan.predicted, "objective": objective, "cost_per_hour": plan.cost_per_hour(dollars),
                 "joules_per_request": round(joules, 6)}
    if g_per_kwh is not None:
        predicted.update(g_per_kwh=g_per_kwh, g_co2e_per_request=round(joules / JOULES_PER_KWH * g_per_kwh, 9))
    return replace(plan, predicted=predicted)


def kind_utilisation(plan: Plan) -> dict[str, float]:
    """Per hardware kind the plan uses, its consumers' mean simulated utilisation (weighted by consumers)."""
    busy: dict[str, float] = {}
    count: dict[str, int] = {}
    utilisation = plan.predicted.get("utilisation", {})
    for stage, cfg in plan.stages.items():
        busy[cfg.hardware] = busy.get(cfg.hardware, 0.0) + cfg.consumers * float(utilisation.get(stage, 0.0))
        count[cfg.hardware] = count.get(cfg.hardware, 0) + cfg.consumers
    return {k: busy[k] / count[k] for k in busy}


def plan_for_objective(objective: str, plan_with: Callable[[dict[str, float]], Plan], arrivals: np.ndarray, *,
                       dollars: dict[str, float], watts: dict[str, tuple[float, float]], g_per_kwh: float,
                       rounds: int = 3) -> Plan:
    """The plan for ``objective``, ``plan_with(prices)`` running the search at a price per hardware kind.

    ``cost``: one search at ``dollars``. ``energy`` and ``carbon``: the cost plan, then searches with each
    kind priced at its watts per replica (times 3600 s; for carbon, those joules' grams): first at the
    kind's active draw, then, for up to ``rounds - 1`` more, at its idle draw plus the active share at the
    utilisation the previous plan gave that kind's consumers (a replica that would idle costs what it
    draws idle). Of these plans the one with the fewest expected joules per request wins (then dollars):
    a fixed price per replica cannot see utilisation, so no single price vector is right for every stage.
    ``predicted["searches"]`` lists each search's prices and result.
    """
    def accounted(prices: dict[str, float], name: str) -> Plan:
        return account_energy(plan_with(prices), arrivals, objective=name, dollars=dollars, watts=watts,
                              g_per_kwh=g_per_kwh)

    first = accounted(dollars, objective)
    if objective == "cost":
        return first
    unit = 3600.0 if objective == "energy" else 3600.0 / JOULES_PER_KWH * g_per_kwh  # per watt, per hour
    units = {"energy": "J", "carbon": "g CO2e"}
    candidates = [(dict(dollars), first)]
    prices = {k: watts[k][1] * unit for k in dollars}
    for _ in range(rounds):
        plan = accounted(prices, objective)
        candidates.append((prices, plan))
        used = kind_utilisation(plan)
        following = {k: (watts[k][0] + (watts[k][1] - watts[k][0]) * used[k]) * unit if k in used else v
                     for k, v in prices.items()}
        if all(math.isclose(following[k], prices[k], rel_tol=0.01) for k in prices):
            break
        prices = following
    _, best = min(candidates, key=lambda c: (c[1].predicted["joules_per_request"],
                                                       c[1].predicted["cost_per_hour"]))
    searches = [{"priced_in": "$" if i == 0 else units[objective], "prices": {k: round(v, 6) for k, v in p.items()},
                 "joules_per_request": c.predicted["joules_per_request"], "cost_per_hour": c.predicted["cost_per_hour"]}
                for i, (p, c) in enumerate(candidates)]
    chosen = next(i for i, c in enumerate(candidates) if c[1] is best)
    return replace(best, predicted={**best.predicted, "searches": searches, "chosen_search": chosen,
                                    "priced_in": searches[chosen]["priced_in"], "prices": searches[chosen]["prices"]})
