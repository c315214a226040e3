"""The simulated cluster (flowserve.tuning.cluster): start delays and rebalance pauses on tiny cases
computed by hand, and the same answers as flowserve.tuning.simulate when nothing changes."""

from __future__ import annotations

import doctest
from pathlib import Path

import numpy as np
import pytest

from flowserve.topology.graph import load_topology
from flowserve.tuning import cluster as cluster_module
from flowserve.tuning.cluster import Cluster, Replicas
from flowserve.tuning.plan import stage_options
from flowserve.tuning.simulate import SimStage, simulate
from flowserve.tuning.stages import StageConfig, sim_stages
from flowserve.tuning.traces import at_scale, generate

ROOT = Path(__file__).parents[2]


def _stage(consumers: int = 1) -> SimStage:
    return SimStage("m", {1: 1.0}, inputs=[(None, "x")], consumers=consumers, max_batch=1, output=True)


def test_a_new_consumer_serves_only_after_its_start_delay_and_the_pause() -> None:
    # 2 partitions, 1 consumer, 1 s per request; requests at 0, 0.1 (partition 1), 0.2, 0.3 (partition 1)
    replicas = {"m": Replicas(1, start_s=2.0)}
    replicas["m"].scale(0.5, 2)  # ready at 2.5; the group rebalances for 0.5 s: the stage serves from 3.0
    c = Cluster([_stage()], [0.0, 0.1, 0.2, 0.3], partitions=2, replicas=replicas, hop_s=0.0, jitter=0.0,
                pause_s=0.5)
    lat = c.result().latency_s
    # consumer 0 alone: r0 0-1, r1 1-2, r2 2-3 (begun at 2 < 2.5, it finishes); then the pause to 3.0:
    # r3 (partition 1) moves to consumer 1, which begins it at 3.0 and ends at 4.0
    assert list(np.round(lat, 6)) == [1.0, 1.9, 2.8, 3.7]
    assert replicas["m"].changes() == [(0.0, 1), (2.5, 2)]
    assert replicas["m"].pod_seconds(10.0) == pytest.approx(10.0 + 9.5)  # the new pod is paid from its request


def test_a_scale_down_pauses_the_stage_and_hands_the_partition_on() -> None:
    replicas = {"m": Replicas(2)}
    replicas["m"].scale(0.5, 1)  # consumer 1 leaves at 0.5: a pause to 1.5, then consumer 0 owns both
    c = Cluster([_stage()], [0.0, 0.1, 0.2, 0.3], partitions=2, replicas=replicas, hop_s=0.0, jitter=0.0,
                pause_s=1.0)
    lat = c.result().latency_s
    # r0 (p0) 0-1 and r1 (p1) 0.1-1.1 begun before the change finish; r2 and r3 wait for the pause (1.5):
    # consumer 0 takes r2 at 1.5 (batch 1), then r3 at 2.5
    assert list(np.round(lat, 6)) == [1.0, 1.0, 2.3, 3.2]


def test_a_pending_pod_is_stopped_first_and_never_serves() -> None:
    r = Replicas(1, start_s=5.0)
    r.scale(0.0, 3)
    r.scale(1.0, 2)
    assert r.spec() == 2 and r.ready(4.0) == 1 and r.ready(6.0) == 2
    assert r.changes() == [(0.0, 1), (5.0, 2)]


def test_partitions_cap_the_consumers_that_serve() -> None:
    replicas = {"m": Replicas(4)}
    lat = Cluster([_stage()], [0.0, 0.0, 0.0], partitions=1, replicas=replicas, hop_s=0.0,
                  jitter=0.0).result().latency_s
    assert list(lat) == [1.0, 2.0, 3.0]  # one partition: one consumer serves, three are paid and idle


@pytest.mark.parametrize("name", ["image-processing", "cascade-emulated", "video-monitoring"])
def test_fixed_consumers_give_what_simulate_gives_in_any_windows(name: str) -> None:
    topology = load_topology(ROOT / "topologies" / f"{name}.yaml")
    options = stage_options(topology)
    config = {o.id: StageConfig(min(o.tables), 4, 2) for o in options}
    stages = sim_stages(options, config)
    trace = generate("gamma", rate=200, cv=2, seconds=10, seed=1).arrivals
    want = simulate(stages, trace, partitions=4, hop_s=0.005, jitter=0.0, overhead_s=0.002).latency_s
    c = Cluster(stages, trace, partitions=4, hop_s=0.005, jitter=0.0, overhead_s=0.002)
    for t in np.arange(0.3, 10, 0.9):
        c.advance(float(t))
    assert np.array_equal(c.result().latency_s, want)


def test_lag_counts_queued_and_unfinished_records() -> None:
    c = Cluster([_stage()], [0.0, 0.1, 0.2, 0.3], partitions=1, hop_s=0.0, jitter=0.0)
    c.advance(1.5)  # r0 done at 1; r1 begun at 1, ends at 2; r2 and r3 queued
    assert c.lag("m") == 3


def test_a_request_that_cannot_make_its_deadline_is_refused_and_frees_the_consumer() -> None:
    # 1 s per request, deadline 2.85 s: a request must begin within 1.85 s of its arrival
    c = Cluster([_stage()], [0.0, 0.1, 0.2, 0.3], partitions=1, hop_s=0.0, jitter=0.0, deadline_s=2.85)
    c.advance(3.5)
    assert c.lag("m") == 0  # r3 was refused at 3.0 (answered at once), not queued nor in flight
    # r2 begins at 2.0, within its 2.05; r3 would begin at 3.0, past its 2.15: refused, a miss (inf)
    assert list(np.round(c.result().latency_s, 6)) == [1.0, 1.9, 2.8, np.inf]
    slow = Cluster([_stage()], [0.0, 0.1, 0.2, 0.3], partitions=1, hop_s=0.0, jitter=0.0)
    assert list(np.round(slow.result().latency_s, 6)) == [1.0, 1.9, 2.8, 3.7]  # no deadline: all served


def test_deadlines_keep_a_backlog_from_making_every_later_request_late() -> None:
    # 2 s at twice what one consumer serves, then half: without deadlines the backlog delays the calm
    # second too; with them the hopeless are refused and the calm requests are served in time
    stage = SimStage("m", {1: 0.01}, inputs=[(None, "x")], consumers=1, max_batch=1, output=True)
    arrivals = np.concatenate([np.arange(0, 2, 0.005), np.arange(2, 4, 0.02)])
    late = Cluster([stage], arrivals, partitions=1, hop_s=0.0, jitter=0.0).result().latency_s
    kept = Cluster([stage], arrivals, partitions=1, hop_s=0.0, jitter=0.0, deadline_s=0.1).result().latency_s
    calm = arrivals >= 3.0
    assert np.all(late[calm] > 0.1) and np.all(kept[calm] <= 0.1)
    assert np.all(np.isinf(kept[kept > 0.1]))  # a miss under a deadline is a refusal, never a late answer


def test_scale_traces_peak_where_the_issue_says() -> None:
    spike = at_scale("spike", peak=2000, seconds=600, seed=1)
    assert spike.params["length"] <= 0.1 * 600 and spike.params["factor"] == 4.0
    diurnal = at_scale("diurnal", peak=2000, seconds=600, seed=1)
    counts = np.histogram(diurnal.arrivals, bins=60, range=(0, 600))[0] / 10
    assert counts.max() > 1800 and counts.min() < 0.2 * 2000
    assert at_scale("mmpp", peak=2000, seconds=600, seed=1).arrivals.size > 0


def test_the_modules_examples_run() -> None:
    assert doctest.testmod(cluster_module).failed == 0
