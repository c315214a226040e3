"""Placement: models hash to partitions stably, partitions go to workers in ranges, and a model that grows
hot gains a second worker (and loses it when it cools)."""

from __future__ import annotations

import pytest

from flowserve.errors import ErrorKind, FlowserveError
from flowserve.models import Placement, partition_of


def test_a_model_hashes_to_the_same_partition_every_time() -> None:
    assert partition_of("m-00001", 32) == partition_of("m-00001", 32)
    spread = {partition_of(f"m-{i:05d}", 32) for i in range(1000)}
    assert spread == set(range(32))


def test_partitions_go_to_workers_in_ranges() -> None:
    p = Placement(3, partitions=9)
    assert [p.owner(i) for i in range(9)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_placement_moves_a_hot_model_to_a_second_worker() -> None:
    p = Placement(2, partitions=16, hot_share=0.2)
    cold = {f"m-{i}": 0.001 for i in range(100)}
    placed = p.place({**cold, "star": 0.01})
    home = p.home("star")
    assert placed["star"] == (home,)
    assert {p.route("star", k) for k in range(10)} == {home}
    placed = p.place({"star": 0.3})  # popularity shifted: 30% of all requests
    assert placed["star"] == (home, 1 - home)  # its home first, then the other worker
    assert [p.route("star", k) for k in range(4)] == [home, 1 - home, home, 1 - home]
    assert all(len(placed[name]) == 1 for name in cold)  # the cold ones stay put
    assert p.place({"star": 0.01})["star"] == (home,)  # cooled: back to its home alone


def test_replicas_grow_with_the_share_up_to_every_worker() -> None:
    p = Placement(4, hot_share=0.2)
    assert [p.replicas(x) for x in (0.0, 0.05, 0.06, 0.11, 0.5)] == [1, 1, 2, 3, 4]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(FlowserveError, match="partitions") as e:
        Placement(4, partitions=2)
    assert e.value.kind is ErrorKind.INVALID_SETTINGS
