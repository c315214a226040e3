"""``flowserve plan --objective``: the energy a plan records, the objectives' searches, old plan files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from flowserve.cli import main
from flowserve.energy import power_watts
from flowserve.errors import FlowserveError
from flowserve.tuning.objectives import account_energy, kind_utilisation, plan_for_objective
from flowserve.tuning.plan import Plan, load_plan, save_plan
from flowserve.tuning.stages import StageConfig
from flowserve.tuning.traces import generate, save_trace

REPO = Path(__file__).resolve().parents[2]
WATTS = {"cpu": (3.0, 14.0), "gpu-small": (13.0, 84.0)}
DOLLARS = {"cpu": 0.17, "gpu-small": 0.526}


def _plan(stages: dict[str, StageConfig], utilisation: dict[str, float]) -> Plan:
    return Plan("t", 100.0, 4, 5.0, stages, {"utilisation": utilisation, "p99_ms": 50.0})


def test_joules_per_request_by_hand() -> None:
    plan = _plan({"a": StageConfig("cpu", 4, 2), "b": StageConfig("gpu-small", 8, 1)}, {"a": 0.5, "b": 0.25})
    arrivals = np.linspace(0.0, 10.0, 1001)  # 100 requests per second
    p = account_energy(plan, arrivals, objective="energy", dollars=DOLLARS, watts=WATTS, g_per_kwh=360.0).predicted
    watts = 2 * (3.0 + 11.0 * 0.5) + 1 * (13.0 + 71.0 * 0.25)
    assert p["joules_per_request"] == pytest.approx(watts / 100.0)
    assert p["g_co2e_per_request"] == pytest.approx(watts / 100.0 / 3.6e6 * 360.0)
    assert p["cost_per_hour"] == pytest.approx(2 * 0.17 + 0.526) and p["objective"] == "energy"
    assert kind_utilisation(plan) == {"cpu": 0.5, "gpu-small": 0.25}
    with pytest.raises(FlowserveError, match="unknown objective 'speed'"):
        account_energy(plan, arrivals, objective="speed", dollars=DOLLARS, watts=WATTS)


def test_the_energy_objective_keeps_the_plan_with_the_fewest_joules() -> None:
    # a stand-in search: dollars pick two cpu replicas; any watt pricing picks one gpu-small
    def plan_with(prices: dict[str, float]) -> Plan:
        if prices["cpu"] < 1:
            return _plan({"a": StageConfig("cpu", 4, 2)}, {"a": 0.9})
        return _plan({"a": StageConfig("gpu-small", 4, 1)}, {"a": 0.05})

    arrivals = np.linspace(0.0, 10.0, 101)
    cost = plan_for_objective("cost", plan_with, arrivals, dollars=DOLLARS, watts=WATTS, g_per_kwh=400.0)
    energy = plan_for_objective("energy", plan_with, arrivals, dollars=DOLLARS, watts=WATTS, g_per_kwh=400.0)
    carbon = plan_for_objective("carbon", plan_with, arrivals, dollars=DOLLARS, watts=WATTS, g_per_kwh=400.0)
    assert cost.stages["a"].hardware == "cpu" and "searches" not in cost.predicted
    assert energy.stages["a"].hardware == carbon.stages["a"].hardware == "gpu-small"
    assert energy.predicted["joules_per_request"] < cost.predicted["joules_per_request"]
    searches = energy.predicted["searches"]
    assert searches[0]["priced_in"] == "$" and searches[1]["prices"]["gpu-small"] == 84.0 * 3600
    # the second watt-priced search: the gpu priced at its draw at the utilisation the first plan gave it
    assert searches[2]["prices"]["gpu-small"] == pytest.approx((13.0 + 71.0 * 0.05) * 3600)
    assert carbon.predicted["searches"][1]["prices"]["gpu-small"] == pytest.approx(84.0 * 3600 / 3.6e6 * 400.0)


def test_an_old_plan_file_without_energy_still_loads(tmp_path: Path) -> None:
    path = save_plan(_plan({"a": StageConfig("cpu", 4, 2)}, {"a": 0.5}), tmp_path / "old.plan.json")
    doc = json.loads(path.read_text())
    assert "joules_per_request" not in doc["predicted"]
    assert load_plan(path).stages["a"] == StageConfig("cpu", 4, 2)


def test_flowserve_plan_records_joules_per_request_for_each_objective(tmp_path: Path, capsys) -> None:
    trace = save_trace(generate("poisson", rate=50, seconds=10, seed=1), tmp_path / "t.json")
    for objective in ("cost", "energy"):
        out = tmp_path / f"{objective}.plan.json"
        assert main(["plan", str(REPO / "topologies" / "image-processing.yaml"), "--trace", str(trace),
                     "--slo-ms", "300", "--no-fuse", "--objective", objective, "--carbon-region", "france",
                     "--out", str(out)]) == 0
        predicted = load_plan(out).predicted
        assert predicted["objective"] == objective and predicted["joules_per_request"] > 0
        assert predicted["g_per_kwh"] == 56.0
        assert predicted["g_co2e_per_request"] == pytest.approx(predicted["joules_per_request"] / 3.6e6 * 56.0,
                                                                rel=1e-3)
    assert "J/request" in capsys.readouterr().out
    assert set(power_watts()) == {"cpu", "gpu-small", "gpu-large"}
