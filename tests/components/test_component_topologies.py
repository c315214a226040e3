"""The shipped topologies load, wire the library's components as intended, and classify digits.

``_run`` below is a reference executor, one request at a time, with no broker: enough to check that
the graphs compute the right thing, not how the runtime moves records.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flowserve.component import Batch, Result
from flowserve.topology import Topology, load_topology
from flowserve.wire.tensors import DATATYPES

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = REPO / "topologies"


def _run(topology: Topology, request: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    produced: dict[tuple[str | None, str], np.ndarray] = {(None, k): v for k, v in request.items()}
    for node in topology.nodes.values():
        tensors: dict[str, np.ndarray] = {}
        for port, sources in node.bindings.items():
            ready = [produced[(s.node, s.tensor)] for s in sources if (s.node, s.tensor) in produced]
            if ready:
                tensors[port] = ready[0]
        if len(tensors) < len(node.bindings):
            continue  # routed away from this branch
        rows = len(next(iter(tensors.values())))
        out = node.component.process(Batch(tensors, [rows], ["r0"]))
        result = out if isinstance(out, Result) else Result(outputs=dict(out))
        assert result.errors == {}
        for port, array in result.outputs.items():
            node.component.outputs[port].check(port, array)
            if result.mask.get(port, np.ones(rows, dtype=bool)).all():
                produced[(node.id, port)] = array
    return {name: produced[(src.node, src.tensor)] for name, src in topology.outputs.items()}


def _nodes(topology: Topology) -> dict[str, tuple[str, dict[str, list[str]]]]:
    return {
        node_id: (
            f"{type(node.component).__module__}:{type(node.component).__name__}",
            {port: [s.ref for s in sources] for port, sources in node.bindings.items()},
        )
        for node_id, node in topology.nodes.items()
    }


def test_every_topology_loads_without_torch() -> None:
    code = (
        "import sys\n"
        "from flowserve.topology import load_topology\n"
        f"for name in {sorted(p.name for p in TOPOLOGIES.glob('*.yaml'))!r}:\n"
        f"    print(name, list(load_topology({str(TOPOLOGIES)!r} + '/' + name).nodes))\n"
        "assert 'torch' not in sys.modules\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert {"cascade.yaml", "digits.yaml", "echo.yaml", "ensemble.yaml"} <= {
        line.split()[0] for line in proc.stdout.splitlines()
    }


def test_digits_wiring() -> None:
    t = load_topology(TOPOLOGIES / "digits.yaml")
    assert _nodes(t) == {
        "pre": ("flowserve_components.digits:Normalize", {"pixels": ["input.pixels"]}),
        "model": ("flowserve_components.torch_stage:TorchClassifier", {"x": ["pre.x"]}),
        "post": ("flowserve_components.postprocess:ArgMax", {"logits": ["model.logits"]}),
    }
    assert t.nodes["model"].component.params.model_dump()["model"] == "digits-mlp"
    assert t.nodes["post"].emits_outputs == {"label": "label", "probs": "probs"}
    assert {name: (p.datatype, p.shape) for name, p in t.inputs.items()} == {"pixels": ("FP32", (-1, 64))}
    assert t.spec.sample == "flowserve_components.digits:sample"


def test_cascade_wiring() -> None:
    t = load_topology(TOPOLOGIES / "cascade.yaml")
    nodes = _nodes(t)
    assert nodes["router"] == (
        "flowserve_components.routing:ConfidenceRouter", {"probs": ["fast_probs.probs"], "x": ["pre.x"]}
    )
    assert nodes["cnn"] == ("flowserve_components.torch_stage:TorchClassifier", {"x": ["router.unsure_x"]})
    assert nodes["final"] == (
        "flowserve_components.postprocess:ArgMax", {"probs": ["router.confident_probs", "cnn_probs.probs"]}
    )
    assert t.nodes["final"].join.type == "any"
    assert t.nodes["router"].join.type == "inner" and t.nodes["router"].needs_join
    assert t.nodes["fast"].component.params.model_dump()["model"] == "digits-mlp-small"
    assert t.nodes["router"].component.params.model_dump()["threshold"] == 0.9
    assert set(t.outputs) == {"label", "probs"}


def test_ensemble_wiring() -> None:
    t = load_topology(TOPOLOGIES / "ensemble.yaml")
    nodes = _nodes(t)
    assert nodes["mlp"][1] == nodes["cnn"][1] == {"x": ["pre.x"]}
    assert nodes["avg"] == (
        "flowserve_components.ensemble:Average", {"mlp": ["mlp_probs.probs"], "cnn": ["cnn_probs.probs"]}
    )
    assert t.nodes["avg"].join.type == "deadline" and t.nodes["avg"].needs_join
    assert set(t.outputs) == {"label", "probs", "missing"}


def test_echo_has_one_port_per_datatype() -> None:
    t = load_topology(TOPOLOGIES / "echo.yaml")
    expected = {f"t_{dt.lower()}": dt for dt in DATATYPES}
    assert {name: p.datatype for name, p in t.inputs.items()} == expected
    assert {name: p.datatype for name, p in t.output_ports().items()} == expected
    assert all(p.shape == (-1, -1) for p in t.inputs.values())
    request = {
        name: (np.array([[b"a", b""]], dtype=object) if dt == "BYTES" else np.ones((1, 2), DATATYPES[dt]))
        for name, dt in expected.items()
    }
    out = _run(t, request)
    assert all(out[name] is request[name] for name in expected)


@pytest.mark.usefixtures("model_cache", "torch_threads")
@pytest.mark.parametrize("name", ["digits", "cascade", "ensemble"])
def test_topology_classifies_held_out_digits(name: str) -> None:
    t = load_topology(TOPOLOGIES / f"{name}.yaml")
    assert t.spec.sample is not None
    module, _, func = t.spec.sample.partition(":")
    requests, labels = getattr(importlib.import_module(module), func)(60, seed=5)
    for node in t.nodes.values():
        node.component.setup()
    try:
        answers = [_run(t, request) for request in requests]
    finally:
        for node in t.nodes.values():
            node.component.close()
    for answer in answers:
        assert answer["label"].dtype == np.int64 and answer["label"].shape == (1,)
        np.testing.assert_allclose(answer["probs"].sum(axis=1), 1.0, rtol=1e-5)
    predicted = [int(a["label"][0]) for a in answers]
    assert np.mean(np.array(predicted) == np.array(labels)) >= 0.93
