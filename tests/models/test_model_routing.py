"""Routing requests by model: a model's requests go to its home partition; a model grown hot gets a partition
on a second worker, its requests alternate between them, and it goes home again when it cools; each change
says so (the actions topic's body). Placement's worker of a partition is the range assignor's."""

from __future__ import annotations

import doctest
import itertools

from aiokafka.coordinator.assignors.range import RangePartitionAssignor

import flowserve.models.routing
from flowserve.models import ModelRouter, Placement, partition_of
from flowserve.models.agent import live_workers
from flowserve.runtime.metrics import PLACEMENT_ROLE


def test_module_examples_run() -> None:
    assert doctest.testmod(flowserve.models.routing).failed == 0


def _range_assignment(partitions: int, workers: int) -> list[int]:
    """Partition -> the rank (in member-id order) of the member aiokafka's range assignor gives it."""

    class Cluster:  # what the assignor reads of the cluster's metadata
        def partitions_for_topic(self, topic: str) -> set[int]:
            return set(range(partitions))

    members = {f"member-{w:02d}": RangePartitionAssignor.metadata(["t"]) for w in range(workers)}
    assigned = RangePartitionAssignor.assign(Cluster(), members)  # type: ignore[arg-type]
    owner = [-1] * partitions
    for rank, member in enumerate(sorted(members)):
        for _, parts in assigned[member].assignment:
            for p in parts:
                owner[p] = rank
    return owner


def test_placement_owner_is_the_range_assignors() -> None:
    for partitions, workers in itertools.product((1, 4, 7, 13, 16, 30), (1, 2, 3, 5, 7)):
        if partitions >= workers:
            p = Placement(workers, partitions=partitions)
            assert [p.owner(i) for i in range(partitions)] == _range_assignment(partitions, workers), \
                (partitions, workers)


def test_a_cold_model_always_goes_to_its_home_partition() -> None:
    router = ModelRouter(partitions=8, workers=2)
    assert {router.partition("m-7") for _ in range(5)} == {partition_of("m-7", 8)}


def test_placement_moves_a_hot_model_to_a_second_worker() -> None:
    router = ModelRouter(partitions=16, workers=2, hot_share=0.2)
    cold = [f"m-{i:03d}" for i in range(100)]
    for name in cold:
        router.partition(name)
    assert router.replace() == []  # 1% each: every model on its home worker alone
    for _ in range(300):  # popularity shifts: 'star' takes 3/4 of the requests
        router.partition("star")
    changes = router.replace()
    assert [c.model for c in changes] == ["star"]
    (change,) = changes
    home = partition_of("star", 16)
    assert change.before == (router.owner(home),)
    assert change.workers == (router.owner(home), 1 - router.owner(home))  # its home worker, then the other
    assert change.partitions[0] == home and router.owner(change.partitions[1]) == 1 - router.owner(home)
    assert [router.partition("star") for _ in range(4)] == [*change.partitions, *change.partitions]
    assert change.as_action()["reason"].startswith("hot: ")
    assert router.placed() == {"star": {"workers": list(change.workers), "partitions": list(change.partitions),
                                        "share": router.placed()["star"]["share"]}}
    assert all(router.partition(name) == partition_of(name, 16) for name in cold)  # the cold ones stay put
    # it cools: nobody asks for it for a few rounds, and it goes back to its home alone
    moved = []
    for _ in range(12):
        for name in cold:
            router.partition(name)
        moved += router.replace()
    assert [(c.model, c.workers) for c in moved] == [("star", (router.owner(home),))]
    assert moved[0].as_action()["reason"].startswith("cooled: ")
    assert {router.partition("star") for _ in range(4)} == {home}


def test_a_change_in_the_workers_places_again_over_them() -> None:
    router = ModelRouter(partitions=12, workers=2)
    for _ in range(10):
        router.partition("star")
    assert len(router.replace()[0].workers) == 2
    changes = router.replace(workers=3)  # a third worker joined: the hot model on all three
    assert [(c.model, len(c.workers)) for c in changes] == [("star", 3)]
    assert sorted(router.owner(p) for p in changes[0].partitions) == [0, 1, 2]
    assert len(router.replace(workers=1)) == 0  # one left: all on it, its home (nothing to say)
    assert {router.partition("star") for _ in range(3)} == {partition_of("star", 12)}


def test_live_workers_are_the_nodes_recent_snapshots() -> None:
    now = 100_000
    snaps = [{"node": "zoo", "worker": "a", "ts_ms": now - 1000}, {"node": "zoo", "worker": "b", "ts_ms": now - 60_000},
             {"node": "other", "worker": "c", "ts_ms": now}, {"node": "zoo", "role": PLACEMENT_ROLE, "ts_ms": now}]
    assert live_workers(snaps, "zoo", now) == 1
