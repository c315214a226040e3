"""The discrete-event simulator against queueing theory and the pipeline mechanics it models."""

from __future__ import annotations

import numpy as np
import pytest

from flowserve.tuning.simulate import SimStage, batch_time, range_assignment, simulate
from flowserve.tuning.traces import generate


def test_md1_mean_wait_matches_the_pollaczek_khinchine_formula() -> None:
    service, rho = 0.01, 0.7
    trace = generate("poisson", rate=rho / service, seconds=3000, seed=11)
    stage = SimStage("m", {1: service}, inputs=[(None, "x")], consumers=1, max_batch=1, output=True)
    result = simulate([stage], trace.arrivals, partitions=1, hop_s=0.0, jitter=0.0)
    expected = rho * service / (2 * (1 - rho))  # M/D/1: Wq = rho D / (2 (1 - rho))
    assert result.stages["m"].mean_wait_s == pytest.approx(expected, rel=0.04)
    assert float(np.mean(result.latency_s)) == pytest.approx(expected + service, rel=0.04)
    assert result.stages["m"].utilisation == pytest.approx(rho, rel=0.02)


def test_mm1_with_exponential_jitter() -> None:
    service, rho = 0.01, 0.5
    trace = generate("poisson", rate=rho / service, seconds=3000, seed=12)
    stage = SimStage("m", {1: service}, inputs=[(None, "x")], consumers=1, max_batch=1, output=True)
    result = simulate([stage], trace.arrivals, partitions=1, hop_s=0.0, jitter=1.0, seed=3)
    assert result.stages["m"].mean_wait_s == pytest.approx(rho * service / (1 - rho), rel=0.06)  # M/M/1


def test_range_assignment_spreads_partitions_like_kafka() -> None:
    assert range_assignment(8, 3) == [0, 0, 0, 1, 1, 1, 2, 2]
    assert range_assignment(4, 8) == [0, 1, 2, 3]  # consumers beyond the partitions sit idle
    assert range_assignment(4, 1) == [0, 0, 0, 0]


def test_batch_time_interpolates_and_extrapolates() -> None:
    table = {1: 0.002, 8: 0.009}
    assert batch_time(table, 4) == pytest.approx(0.005)
    assert batch_time(table, 16) == pytest.approx(0.017)


def test_hops_batches_and_a_saturated_stage() -> None:
    # ten requests at once to a stage batching up to 4, 10 ms a batch whatever its size
    stage = SimStage("m", {1: 0.01, 4: 0.01}, inputs=[(None, "x")], max_batch=4, output=True)
    result = simulate([stage], [0.0] * 10, partitions=1, hop_s=0.001, jitter=0.0)
    assert sorted(np.round(result.latency_s, 6)) == [0.012] + [0.022] * 4 + [0.032] * 4 + [0.042]
    assert result.stages["m"].batches == 4


def test_a_batch_holds_its_consumer_for_the_overhead_too() -> None:
    # two requests 1 ms apart, 10 ms of device and 5 ms of worker overhead per batch: the second waits for both
    stage = SimStage("m", {1: 0.01}, inputs=[(None, "x")], output=True)
    result = simulate([stage], [0.0, 0.001], partitions=1, hop_s=0.0, jitter=0.0, overhead_s=0.005)
    assert np.round(result.latency_s, 6).tolist() == [0.015, 0.029]
    assert result.stages["m"].utilisation == pytest.approx(0.02 / 0.03)  # the device's share, not the overhead's
    # drawn from measured samples: every draw is one of them
    drawn = simulate([stage], np.arange(200) * 0.1, partitions=1, hop_s=0.0, jitter=0.0,
                     overhead_s=np.array([0.001, 0.003]), seed=1)
    assert set(np.round(drawn.latency_s, 6).tolist()) == {0.011, 0.013}


def test_cascade_routing_and_any_join() -> None:
    stages = [
        SimStage("cheap", {1: 0.001}, inputs=[(None, "x")], max_batch=8),
        SimStage("router", {1: 1e-6}, inputs=[("cheap", "x")], max_batch=64,
                 fractions={"sure_x": 0.7, "unsure_x": 0.3}),
        SimStage("expensive", {1: 0.001}, inputs=[("router", "unsure_x")], max_batch=8),
        SimStage("final", {1: 1e-6}, inputs=[("router", "sure_x"), ("expensive", "x")], join="any",
                 max_batch=64, output=True),
    ]
    trace = generate("poisson", rate=50, seconds=100, seed=1)
    result = simulate(stages, trace.arrivals, partitions=4, hop_s=0.002)
    assert np.isfinite(result.latency_s).all()  # every request completes down exactly one branch
    served = result.stages["expensive"].mean_batch * result.stages["expensive"].batches
    assert served / len(trace.arrivals) == pytest.approx(0.3, abs=0.03)


def test_inner_join_waits_for_both_branches() -> None:
    stages = [
        SimStage("a", {1: 0.001}, inputs=[(None, "x")]),
        SimStage("fast", {1: 0.001}, inputs=[("a", "x")]),
        SimStage("slow", {1: 0.005}, inputs=[("a", "x")]),
        SimStage("join", {1: 0.001}, inputs=[("fast", "x"), ("slow", "x")], output=True),
    ]
    result = simulate(stages, [0.0], partitions=1, hop_s=0.0, jitter=0.0)
    assert result.latency_s[0] == pytest.approx(0.001 + 0.005 + 0.001)
