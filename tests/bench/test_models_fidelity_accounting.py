"""``flowserve bench models --fidelity``'s accounting: live figures close to the simulator's meet both
targets, a known-bad live run (far fewer answers in time, far more loads) fails them; and the simulator's
intake model (the live hook's granularity) takes a worker's requests an intake at a time."""

from __future__ import annotations

import numpy as np

from flowserve.models import Catalogue, Placement, Scheduler, poisson_zipf, run
from flowserve_bench import graphs
from flowserve_bench.models_fidelity import TOPOLOGY, compare, fidelity_targets, figures, simulate

SLO = 0.1


def _side(within: int, refused: int, late: int, loads: int, sent: int = 1000) -> dict:
    latency = np.full(sent, np.nan)
    latency[:within] = 0.05
    latency[within:within + late] = 0.15
    ok = ~np.isnan(latency)
    gone = np.zeros(sent, bool)
    gone[within + late:within + late + refused] = True
    return figures(latency, ok, gone, SLO, loads, loads)


def _row(live: dict, sim: dict) -> dict:
    return {"workers": 1, "s": 0.9, "load": 0.6, "live": live, "sim": sim}


def test_figures_count_within_late_refused_and_lost() -> None:
    f = _side(900, 50, 30, 200)
    assert (f["attainment"], f["refused"], f["late"], f["lost"], f["loads"]) == (0.9, 0.05, 0.03, 20, 200)
    assert (f["p50_ms"], f["p99_ms"]) == (50.0, 150.0)


def test_live_close_to_the_simulator_meets_both_targets() -> None:
    sim = _side(900, 100, 0, 200)
    t = fidelity_targets([_row(_side(885, 110, 5, 220), sim)])
    assert t == {"fidelity_attainment_within_2pts/w1_s0.9_60%": True, "fidelity_loads_within_15pct/w1_s0.9_60%": True}


def test_a_known_bad_live_run_fails_them() -> None:
    sim = _side(900, 100, 0, 200)
    far = fidelity_targets([_row(_side(400, 170, 430, 280), sim)])  # 50 points fewer in time, 40% more loads
    assert far == {"fidelity_attainment_within_2pts/w1_s0.9_60%": False,
                   "fidelity_loads_within_15pct/w1_s0.9_60%": False}
    just_out = compare(_side(879, 121, 0, 231), sim)  # 2.1 points, 15.5%
    assert not just_out["attainment_ok"] and not just_out["loads_ok"]


def test_an_intake_takes_no_more_than_its_size_and_each_answer_leaves_with_its_batch() -> None:
    cat = Catalogue.emulated(10)
    wl = poisson_zipf(10, rate=300.0, seconds=2.0, s=1.2, seed=3)

    def served(intake: int):  # noqa: ANN202 - an Outcome
        return run(wl, cat, Placement(1), [Scheduler(cat, cat.total_bytes, horizon=0.0)], slo_s=SLO, intake=intake)

    each, whole = served(0), served(4)
    assert int(each.answered().sum() + each.refused.sum()) == wl.arrivals.size
    assert int(whole.answered().sum() + whole.refused.sum()) == wl.arrivals.size
    assert whole.taken is not None
    starts, counts = np.unique(whole.taken, return_counts=True)
    # at most 4 per intake (two intakes open at one instant only when the first is refused whole at once)
    assert (counts <= 4).mean() > 0.95 and counts.max() > 1
    # the hook answers in parts: within an intake, answers leave as their own batches end, not together
    assert any(len(set(whole.finish[(whole.taken == t) & whole.answered()])) > 1 for t in starts)
    assert np.nanmean(whole.finish - whole.arrival) > np.nanmean(each.finish - each.arrival)


def test_the_bench_simulates_its_topology_on_the_same_arrivals() -> None:
    topology = graphs.load(TOPOLOGY, "t")
    spec = topology.nodes["zoo"].models
    assert spec is not None
    cat = Catalogue.declared(spec)
    wl = poisson_zipf(len(cat), rate=100.0, seconds=2.0, s=1.2, seed=0)
    a = simulate(cat, spec, wl, 2, topology.spec.partitions, hop_s=0.01, intake=64)
    b = simulate(cat, spec, wl, 2, topology.spec.partitions, hop_s=0.01, intake=64)
    assert a == b and a["sent"] == wl.arrivals.size and a["lost"] == 0 and a["loads"] > 0


def test_a_turnaround_keeps_the_worker_from_its_next_intake() -> None:
    cat = Catalogue.emulated(10)
    wl = poisson_zipf(10, rate=300.0, seconds=2.0, s=1.2, seed=3)
    out = run(wl, cat, Placement(1), [Scheduler(cat, cat.total_bytes, horizon=0.0)], slo_s=SLO, intake=4,
              turnaround_s=0.02)
    assert out.taken is not None
    starts = np.unique(out.taken)
    closes = [np.nanmax(out.finish[out.taken == t], initial=-np.inf) for t in starts]
    assert len(starts) > 10
    for close, start in zip(closes, starts[1:], strict=False):
        assert start >= close + 0.02 - 1e-9  # never sooner than the turnaround after the last intake's answers
