"""Fusion chosen by the planner (flowserve.tuning.fusion_plan): which chains it fuses, which it may not, and
that the plan file carries the choice to ``apply_plan``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from flowserve.cli import main as cli
from flowserve.cli.gateway import planned
from flowserve.errors import FlowserveError
from flowserve.topology import load_topology_text
from flowserve.topology.fuse import Chain
from flowserve.tuning.fusion_plan import _better, choose_fusion, fused_options, make_fused_plan
from flowserve.tuning.plan import (
    apply_plan,
    default_prices,
    load_plan,
    make_plan,
    priced_options,
    save_plan,
    stage_options,
    sum_tables,
)
from flowserve.tuning.stages import StageOptions
from flowserve.tuning.traces import generate, load_trace, save_trace

PORTS = "{x: {datatype: FP32, shape: [-1, 4]}}"


def identity(node: str, source: str, extra: str = "") -> str:
    params = f"{{ports: {PORTS}}}"
    return f"  {node}: {{component: flowserve.builtin:Identity, params: {params}, inputs: {{x: {source}}}{extra}}}"


def chain_text(nodes: str, extra: dict[str, str] | None = None, tail: str = "") -> str:
    """A linear pipeline of Identity nodes named by the letters of ``nodes``."""
    extra = extra or {}
    lines = ["name: t", "nodes:"]
    for k, n in enumerate(nodes):
        lines.append(identity(n, "input.x" if k == 0 else f"{nodes[k - 1]}.x", extra.get(n, "")))
    return "\n".join(lines) + f"\noutputs: {{y: {nodes[-1]}.x}}\n{tail}"


@pytest.fixture(scope="module")
def arrivals() -> np.ndarray:
    return generate("poisson", rate=50, seconds=10, seed=3).arrivals


def test_a_cheap_chain_is_fused(arrivals: np.ndarray) -> None:
    topology = load_topology_text(chain_text("abc"))
    plan = make_fused_plan(topology, arrivals, 100, hop_ms=5, overhead_ms=5)
    assert plan.fuse == {"a-b-c": ["a", "b", "c"]}
    assert set(plan.stages) == {"a-b-c"} and plan.stages["a-b-c"].consumers == 1
    chain = plan.fusion["chains"]["a-b-c"]
    assert chain["members"] == ["a", "b", "c"] and chain["hardware"] == "cpu"
    assert chain["fused"]["cost_per_hour"] == pytest.approx(0.17)
    assert chain["apart"]["cost_per_hour"] == pytest.approx(3 * 0.17)
    assert chain["why"] == "cheaper: $0.170/h fused against $0.510/h apart"
    assert plan.fusion["unfused"]["cost_per_hour"] == pytest.approx(0.51)
    # two hops and two per-batch overheads fewer: the fused p99 is lower too
    assert chain["fused"]["p99_ms"] < chain["apart"]["p99_ms"]
    assert plan.predicted["cost_per_hour"] == pytest.approx(0.17)
    assert {tuple(c["members"]) for c in plan.fusion["considered"]} == {("a", "b"), ("b", "c"), ("a", "b", "c")}
    assert make_plan(topology, arrivals, 100, hop_ms=5, overhead_ms=5).fuse == {}  # the plain planner never fuses


def test_no_fusion_across_hardware_kinds(arrivals: np.ndarray) -> None:
    topology = load_topology_text(chain_text("ab"))
    prices = default_prices()
    options = priced_options(topology, prices)
    options[1].tables = {"gpu-small": {1: 0.002, 8: 0.004}}  # b runs only on gpu-small, a only on cpu
    chains, planned, config, _, record = choose_fusion(topology, options, arrivals, 0.1, prices=prices,
                                                       hop_s=0.005, overhead_s=0.005)
    assert chains == {} and [o.id for o in planned] == ["a", "b"]
    assert (config["a"].hardware, config["b"].hardware) == ("cpu", "gpu-small")
    assert record["refused"] == [{"link": "a -> b", "why": "no hardware kind in common ('a': cpu; 'b': gpu-small)"}]
    assert record["considered"] == [] and record["chains"] == {}


def test_a_never_node_stays_apart_and_the_rest_fuses(arrivals: np.ndarray) -> None:
    topology = load_topology_text(chain_text("abcd", {"c": ", fuse: never"}))
    plan = make_fused_plan(topology, arrivals, 100, hop_ms=5, overhead_ms=5)
    assert plan.fuse == {"a-b": ["a", "b"]}
    assert set(plan.stages) == {"a-b", "c", "d"}
    assert plan.fusion["refused"] == [{"link": "b -> c", "why": "'c' says fuse: never"},
                                      {"link": "c -> d", "why": "'c' says fuse: never"}]


def test_a_node_capture_names_is_not_fused(arrivals: np.ndarray) -> None:
    topology = load_topology_text(chain_text("abc", tail="capture: {nodes: {b: {sample: 0.5}}}\n"))
    plan = make_fused_plan(topology, arrivals, 100, hop_ms=5, overhead_ms=5)
    assert "b" not in {m for members in plan.fuse.values() for m in members}
    assert {"link": "a -> b", "why": "capture names 'b', so its edges stay on Kafka"} in plan.fusion["refused"]


def test_fused_options_sum_the_members_and_rename_the_readers() -> None:
    options = [StageOptions("a", {"cpu": {1: 0.01}, "gpu-small": {1: 0.001}}, [(None, "x")]),
               StageOptions("b", {"cpu": {1: 0.02, 4: 0.05}}, [("a", "x")], fractions={"lo": 0.5, "hi": 0.5}),
               StageOptions("c", {"cpu": {1: 0.001}}, [("b", "lo")], output=True)]
    a_b, c = fused_options(options, {"a-b": ["a", "b"]})
    assert (a_b.id, a_b.inputs, a_b.fractions, a_b.output) == ("a-b", [(None, "x")], {"lo": 0.5, "hi": 0.5}, False)
    assert list(a_b.tables) == ["cpu"]  # the only kind both run on
    assert a_b.tables["cpu"] == sum_tables([{1: 0.01}, {1: 0.02, 4: 0.05}])
    assert a_b.tables["cpu"][1] == pytest.approx(0.03) and a_b.tables["cpu"][4] == pytest.approx(0.04 + 0.05)
    assert (c.id, c.inputs, c.output) == ("c", [("a-b", "lo")], True)


def test_better_is_cheaper_or_as_cheap_with_a_lower_p99() -> None:
    cfg: dict = {}
    r = None
    assert _better((1.0, 0.2, cfg, r), (2.0, 0.1, cfg, r))  # type: ignore[arg-type]
    assert _better((1.0, 0.1, cfg, r), (1.0, 0.2, cfg, r))  # type: ignore[arg-type]
    assert not _better((1.0, 0.2, cfg, r), (1.0, 0.2, cfg, r))  # type: ignore[arg-type]
    assert not _better((2.0, 0.01, cfg, r), (1.0, 0.2, cfg, r))  # type: ignore[arg-type]
    assert _better((9.0, 0.2, cfg, r), None) and not _better(None, (1.0, 0.2, cfg, r))  # type: ignore[arg-type]


def test_a_fused_plan_round_trips_through_its_file_and_applies(tmp_path: Path, arrivals: np.ndarray) -> None:
    topology = load_topology_text(chain_text("abcd", {"c": ", fuse: never"}))
    plan = make_fused_plan(topology, arrivals, 100, hop_ms=5, overhead_ms=5)
    loaded = load_plan(save_plan(plan, tmp_path / "t.plan.json"))
    assert loaded == plan
    applied = apply_plan(topology, loaded)
    assert list(applied.nodes) == ["a-b", "c", "d"]
    fused = applied.nodes["a-b"]
    assert isinstance(fused.component, Chain) and fused.component.members == ["a", "b"]
    cfg = plan.stages["a-b"]
    assert (fused.replicas, fused.max_batch, applied.spec.partitions) == (cfg.consumers, cfg.max_batch,
                                                                          plan.partitions)
    assert fused.bindings["x"][0].ref == "input.x" and applied.nodes["c"].bindings["x"][0].node == "a-b"
    # the planner sees the applied topology as it planned it: the chain's stage, its members' tables summed
    options = {o.id: o for o in stage_options(applied)}
    assert set(options) == {"a-b", "c", "d"} and options["c"].inputs == [("a-b", "x")]
    assert options["a-b"].tables["cpu"][1] == pytest.approx(2 * options["c"].tables["cpu"][1])


def test_the_gateway_applies_each_plan_to_the_topology_it_names(tmp_path: Path, arrivals: np.ndarray) -> None:
    # flowserve gateway --plan: the gateway waits for the stages the workers run, a fused chain's among them
    topology = load_topology_text(chain_text("abcd", {"c": ", fuse: never"}))
    other = load_topology_text(chain_text("xy").replace("name: t", "name: u"))
    path = save_plan(make_fused_plan(topology, arrivals, 100, hop_ms=5, overhead_ms=5), tmp_path / "t.plan.json")
    served = planned([other, topology], [str(path)])
    assert [t.name for t in served] == ["u", "t"]
    assert list(served[0].nodes) == ["x", "y"] and list(served[1].nodes) == ["a-b", "c", "d"]
    with pytest.raises(FlowserveError, match="is for topology 't', which this gateway does not serve"):
        planned([other], [str(path)])


def test_plan_and_simulate_commands_print_the_fusion_and_simulate_the_fused_stage(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topology = tmp_path / "t.yaml"
    topology.write_text(chain_text("abc", {"c": ", fuse: never"}))
    trace = save_trace(generate("poisson", rate=50, seconds=10, seed=3), tmp_path / "trace.json")
    plan = tmp_path / "t.plan.json"
    assert cli(["plan", str(topology), "--trace", str(trace), "--slo-ms", "100", "--out", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "fused a-b = a -> b on cpu: cheaper: $0.340/h fused against $0.510/h apart" in out
    assert "not fusable: b -> c: 'c' says fuse: never" in out
    assert json.loads(out.strip().splitlines()[-1])["fuse"] == {"a-b": ["a", "b"]}
    assert cli(["simulate", str(topology), "--trace", str(trace), "--plan", str(plan)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(summary["stages"]) == {"a-b", "c"} and summary["requests"] == len(load_trace(trace).arrivals)
    assert cli(["plan", str(topology), "--trace", str(trace), "--slo-ms", "100", "--out", str(plan),
                "--no-fuse"]) == 0
    assert load_plan(plan).fuse == {} and set(load_plan(plan).stages) == {"a", "b", "c"}
