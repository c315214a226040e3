"""The scale bench's CPU stage passes rows through unchanged, and the command line knows the workload."""

from __future__ import annotations

import numpy as np

from flowserve.cli import build_parser
from flowserve_bench import graphs
from flowserve_bench.scale import CPU_TOPOLOGY, EMULATED_TOPOLOGY, Burn


def test_burn_passes_rows_through() -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(Burn().process({"x": x})["x"], x)  # type: ignore[arg-type]


def test_bench_scale_is_a_workload() -> None:
    args = build_parser().parse_args(["bench", "scale", "--rounds", "2", "--slice-seconds", "1"])
    assert (args.workload, args.rounds, args.slice_seconds) == ("scale", 2, 1.0)


def test_both_halves_deploy_valid_topologies() -> None:
    for i, file in enumerate((CPU_TOPOLOGY, EMULATED_TOPOLOGY)):
        topology = graphs.load(file, f"scale-{i}", {"nodes.stage.replicas": 8})
        assert topology.name == f"scale-{i}"
        assert topology.nodes["stage"].replicas == 8
        assert topology.spec.partitions == 8
