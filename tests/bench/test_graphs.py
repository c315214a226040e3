"""The workloads' topologies load from their files (flowserve_bench/topologies/), with what each bench sets."""

from __future__ import annotations

from importlib import resources

import pytest

from flowserve_bench import graphs
from flowserve_bench.capture import topology as capture_topology
from flowserve_bench.learn_ensemble import MEMBERS, STALLED
from flowserve_bench.learn_ensemble import topology_text as ensemble_text

FILES = sorted(f.name for f in resources.files("flowserve_bench").joinpath("topologies").iterdir()
               if f.name.endswith(".yaml"))


def test_the_bench_ships_its_topologies() -> None:
    assert {"batching.yaml", "capture.yaml", "chaos.yaml", "latency.yaml", "learn-continual.yaml",
            "learn-ensemble.yaml", "learn-selection.yaml", "parity-digits.yaml", "parity-emulated.yaml",
            "passthrough.yaml", "scale-cpu.yaml", "scale-emulated.yaml", "tuner-hop.yaml",
            "tuner-overhead.yaml"} <= set(FILES)


@pytest.mark.parametrize("file", FILES)
def test_each_topology_file_loads_under_a_fresh_name(file: str) -> None:
    topology = graphs.load(file, "fresh-name")
    assert topology.name == "fresh-name"
    assert topology.nodes


def test_changes_set_nested_keys_and_drop_removes_them() -> None:
    t = graphs.load("capture.yaml", "c", {"nodes.model.replicas": 3, "nodes.input_drift": graphs.DROP,
                                          "capture": {"sample": 0.5}})
    assert t.nodes["model"].replicas == 3
    assert "input_drift" not in t.nodes
    assert graphs.document("capture.yaml")["nodes"]["input_drift"]  # the file itself is untouched


def test_capture_configurations() -> None:
    _, off = capture_topology(None)
    _, detector = capture_topology(1.0, detector=True)
    assert "input_drift" not in off.nodes and off.spec.capture is None
    assert "input_drift" in detector.nodes and detector.spec.capture is not None
    assert detector.spec.capture.sample == 1.0


def test_the_ensemble_stalls_its_stalled_member_and_joins_as_told() -> None:
    join = {"type": "inner", "window_ms": 900}
    doc = graphs.yaml.safe_load(ensemble_text("e", join, stall_share=0.2, deadline_ms=900))
    assert doc["deadline_ms"] == 900 and doc["nodes"]["avg"]["join"] == join
    assert doc["nodes"]["stall"]["params"]["share"] == 0.2
    assert doc["nodes"]["stall"]["inputs"] == {"logits": f"{STALLED}.logits"}
    assert doc["nodes"]["avg"]["params"]["members"] == list(MEMBERS)
    for member, model in MEMBERS.items():
        assert doc["nodes"][member]["params"]["model"] == model
