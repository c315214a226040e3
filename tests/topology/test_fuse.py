"""Operator fusion (``fuse:``): what a chain may be, the graph it compiles to, and that it computes what the
unfused stages compute, request by request, with failures and routing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flowserve.cli import main as cli
from flowserve.component import Batch, Result
from flowserve.errors import ComponentError, TopologyError, WireError
from flowserve.topology import Topology, load_topology, load_topology_text
from flowserve.topology.fuse import Chain
from flowserve.topology.render import to_dot, to_mermaid, to_text
from flowserve.topology.spec import load_spec_text
from flowserve.wire.tensors import DATATYPES

REPO = Path(__file__).resolve().parents[2]
K = "fs_testkit"

# a -> b -> c is the chain of most tests; d reads the chain's last member from outside.
BASE = f"""
name: t
nodes:
  a: {{component: {K}:Affine, params: {{mul: 2}}, inputs: {{x: input.x}}}}
  b: {{component: {K}:Reject, params: {{value: 14}}, inputs: {{x: a.x}}}}
  c: {{component: {K}:Split, params: {{value: 50}}, inputs: {{x: b.x}}}}
  d: {{component: {K}:Affine, params: {{add: 100}}, inputs: {{x: c.hi}}}}
outputs: {{lo: c.lo, y: d.x}}
"""


def load(tmp_path: Path, text: str) -> Topology:
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return load_topology(path)


def fuse_error(tmp_path: Path, text: str, node: str) -> str:
    """The TopologyError of loading ``text``; it must name the file and ``node``."""
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    message = str(info.value)
    assert message.startswith(f"{path}: node '{node}': "), message
    assert (info.value.source, info.value.node) == (str(path), node)
    return message


# --- what a chain may be ---------------------------------------------------------------------------------


def test_unknown_node(tmp_path: Path) -> None:
    message = fuse_error(tmp_path, BASE + "fuse: {f: [a, zz]}\n", "f")
    assert "fuse.f: unknown node 'zz' (nodes: a, b, c, d)" in message


def test_node_in_two_chains(tmp_path: Path) -> None:
    message = fuse_error(tmp_path, BASE + "fuse: {f: [a, b], g: [b, c]}\n", "b")
    assert "fuse: node 'b' is in both 'f' and 'g'; a node runs in one place, once" in message


def test_node_twice_in_one_chain(tmp_path: Path) -> None:
    message = fuse_error(tmp_path, BASE + "fuse: {f: [a, b, a]}\n", "a")
    assert "fuse: node 'a' is twice in 'f'" in message


@pytest.mark.parametrize("members", ["[a]", "[]"])
def test_chain_of_one(tmp_path: Path, members: str) -> None:
    message = fuse_error(tmp_path, BASE + f"fuse: {{f: {members}}}\n", "f")
    assert "fuse.f: a chain needs at least two nodes" in message


def test_name_of_another_node(tmp_path: Path) -> None:
    message = fuse_error(tmp_path, BASE + "fuse: {d: [a, b]}\n", "d")
    assert "fuse.d: the name is already a node's id; pick another" in message


def test_name_of_a_member_is_fine(tmp_path: Path) -> None:
    t = load(tmp_path, BASE + "fuse: {c: [a, b, c]}\n")
    assert list(t.nodes) == ["c", "d", "outputs"]
    assert t.nodes["c"].component.members == ["a", "b", "c"]  # type: ignore[attr-defined]


def test_member_reading_a_non_predecessor(tmp_path: Path) -> None:
    message = fuse_error(tmp_path, BASE + "fuse: {f: [a, c]}\n", "c")
    assert "fuse.f: every input of 'c' must come from 'a', the node before it in the chain (a chain is linear)" \
        in message


def test_chain_out_of_order(tmp_path: Path) -> None:
    message = fuse_error(tmp_path, BASE + "fuse: {f: [b, a]}\n", "a")
    assert "every input of 'a' must come from 'b'" in message


def test_member_reading_the_input(tmp_path: Path) -> None:
    text = BASE.replace("outputs:", f"  e: {{component: {K}:Affine, inputs: {{x: input.x}}}}\noutputs:")
    message = fuse_error(tmp_path, text.replace("y: d.x", "y: d.x, z: e.x") + "fuse: {f: [a, e]}\n", "e")
    assert "every input of 'e' must come from 'a'" in message


def test_member_with_triggers(tmp_path: Path) -> None:
    text = BASE.replace("inputs: {x: a.x}}", "inputs: {x: a.x}, triggers: [input.go]}")
    assert load(tmp_path, text).nodes["b"].triggers  # valid unfused
    message = fuse_error(tmp_path, text + "fuse: {f: [a, b, c]}\n", "b")
    assert "every input of 'b' must come from 'a'" in message


def test_member_with_a_join(tmp_path: Path) -> None:
    text = BASE.replace("inputs: {x: a.x}}", "inputs: {x: [a.x, input.x]}, join: {type: any}}")
    assert load(tmp_path, text).nodes["b"].needs_join  # valid unfused
    message = fuse_error(tmp_path, text + "fuse: {f: [a, b, c]}\n", "b")
    assert "every input of 'b' must come from 'a'" in message


def test_outside_node_reading_inside_the_chain(tmp_path: Path) -> None:
    text = BASE.replace("inputs: {x: c.hi}", "inputs: {x: b.x}")
    message = fuse_error(tmp_path, text + "fuse: {f: [a, b, c]}\n", "d")
    assert "fuse.f: 'd' reads 'b.x', inside the chain; only the chain's last node may feed other nodes" in message


def test_outputs_reading_inside_the_chain(tmp_path: Path) -> None:
    text = BASE.replace("lo: c.lo", "lo: c.lo, z: a.x")
    message = fuse_error(tmp_path, text + "fuse: {f: [a, b, c]}\n", "a")
    assert "fuse.f: outputs.z reads 'a.x', inside the chain; only the chain's last node may feed the outputs" \
        in message


@pytest.mark.parametrize("capture", ["{ports: [b.x]}", "{ports: ['b.*']}", "{nodes: {b: {sample: 0.5}}}"])
def test_capture_of_a_fused_member(tmp_path: Path, capture: str) -> None:
    message = fuse_error(tmp_path, BASE + f"capture: {capture}\nfuse: {{f: [a, b, c]}}\n", "b")
    assert ("fuse.f: capture names 'b', which is fused: data inside a chain is not on Kafka; capture 'f' or "
            "take 'b' out of the chain") in message


def test_capture_of_the_fused_node(tmp_path: Path) -> None:
    t = load(tmp_path, BASE + "capture: {ports: [f.lo], nodes: {f: {sample: 0.5}}}\nfuse: {f: [a, b, c]}\n")
    assert "f" in t.nodes


@pytest.mark.parametrize("name", ["'9lives'", "'a b'", "outputs", "input"])
def test_bad_fused_id(tmp_path: Path, name: str) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(BASE + f"fuse: {{{name}: [a, b, c]}}\n")
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    message = str(info.value)
    assert message.startswith(f"{path}: fuse: ")
    assert f"fused node id '{name.strip(chr(39))}' must match ^[A-Za-z][A-Za-z0-9_-]*$ and not be reserved" \
        in message


def test_unfused_errors_come_first(tmp_path: Path) -> None:
    """The graph is checked as written before fusing: a port mistake names the member, not the chain."""
    message = fuse_error(tmp_path, BASE.replace("inputs: {x: c.hi}", "inputs: {x: c.nope}")
                         + "fuse: {f: [a, b, c]}\n", "d")
    assert "'c.nope': node 'c' has no output port 'nope' (its outputs: lo, hi)" in message


# --- the graph a chain compiles to -----------------------------------------------------------------------


def test_compiled_shape(tmp_path: Path) -> None:
    t = load(tmp_path, BASE + "fuse: {f: [a, b, c]}\n")
    assert list(t.nodes) == ["f", "d", "outputs"]
    f = t.nodes["f"]
    assert isinstance(f.component, Chain) and f.component.members == ["a", "b", "c"]
    assert {p: [(s.ref, s.topic) for s in ss] for p, ss in f.bindings.items()} == {
        "x": [("input.x", "fs.t.inputs")]}
    assert f.output_topics == {"lo": "fs.t.f.lo", "hi": "fs.t.f.hi"}
    assert [(s.ref, s.node, s.topic) for s in t.nodes["d"].bindings["x"]] == [("f.hi", "f", "fs.t.f.hi")]
    assert {name: (s.ref, s.node, s.topic) for name, s in t.outputs.items()} == {
        "lo": ("f.lo", "f", "fs.t.f.lo"), "y": ("d.x", "d", "fs.t.d.x")}
    assert set(t.topics()) == {"fs.t.inputs", "fs.t.outputs", "fs.t.deadletter", "fs.t.metrics",
                               "fs.t.feedback", "fs.t.f.lo", "fs.t.f.hi", "fs.t.d.x"}
    unfused = load(tmp_path, BASE)
    assert {"fs.t.a.x", "fs.t.b.x"} <= set(unfused.topics())
    assert t.spec.fuse == {} and set(t.spec.nodes) == {"f", "d"}
    assert t.inputs == unfused.inputs and t.output_ports() == unfused.output_ports()
    assert list(t.with_partitions(8).nodes) == ["f", "d", "outputs"]


def test_references_to_the_last_member_are_repointed(tmp_path: Path) -> None:
    t = load(tmp_path, BASE + "fuse: {f: [a, b, c]}\n")
    assert [s.ref for s in t.nodes["d"].bindings["x"]] == ["f.hi"]


def test_consecutive_chains(tmp_path: Path) -> None:
    text = BASE.replace("lo: c.lo, ", "") + "fuse: {f: [a, b], g: [c, d]}\n"
    t = load(tmp_path, text)
    assert list(t.nodes) == ["f", "g"]
    assert [s.ref for s in t.nodes["g"].bindings["x"]] == ["f.x"]
    assert t.nodes["g"].emits_outputs == {"y": "x"}
    assert t.nodes["g"].component.steps[1][0].wiring == {"x": "hi"}  # type: ignore[attr-defined]
    assert set(t.topics()) == {"fs.t.inputs", "fs.t.outputs", "fs.t.deadletter", "fs.t.metrics", "fs.t.feedback",
                                "fs.t.f.x"}


def test_head_keeps_its_triggers_and_join(tmp_path: Path) -> None:
    text = BASE.replace("inputs: {x: input.x}}", "inputs: {x: input.x}, triggers: [input.go], "
                        "join: {window_ms: 1234}}")
    f = load(tmp_path, text + "fuse: {f: [a, b, c]}\n").nodes["f"]
    assert [s.ref for s in f.triggers] == ["input.go"]
    assert f.join.window_ms == 1234


def with_settings(a: str = "", b: str = "", c: str = "") -> str:
    text = BASE
    for node, more in (("a", a), ("b", b), ("c", c)):
        if more:
            text = text.replace(f"  {node}: {{component: {K}", f"  {node}: {{{more}, component: {K}")
    return text + "fuse: {f: [a, b, c]}\n"


def test_scaling_settings_merge(tmp_path: Path) -> None:
    f = load(tmp_path, with_settings(a="replicas: 2", b="replicas: 3, max_batch: 64",
                                     c="batching: {policy: fixed, size: 8}")).nodes["f"]
    assert f.replicas == 3  # the most replicated member
    assert f.max_batch == 64
    spec = load_spec_text(with_settings(b="batching: {policy: lag}", c="batching: {policy: fixed, size: 8}"))
    assert spec.nodes["b"].batching.policy == "lag"
    t = load(tmp_path, with_settings(b="batching: {policy: lag}", c="batching: {policy: fixed, size: 8}"))
    assert t.spec.nodes["f"].batching.policy == "lag"  # the first member that asks for a policy
    assert t.spec.nodes["f"].batching == spec.nodes["b"].batching


def test_max_batch_is_the_most_limited_members(tmp_path: Path) -> None:
    """A member's component max_batch limits the chain even when another member sets a larger one."""
    text = with_settings(b="max_batch: 64").replace("params: {mul: 2}", "params: {mul: 2, max_batch: 16}")
    t = load(tmp_path, text)
    assert t.nodes["f"].max_batch == 16 and t.nodes["f"].component.max_batch == 16
    assert load(tmp_path, with_settings()).nodes["f"].max_batch == 1024
    assert load(tmp_path, with_settings()).nodes["f"].replicas == 1


def test_render_lists_members(tmp_path: Path) -> None:
    t = load(tmp_path, BASE + "fuse: {f: [a, b, c]}\n")
    assert "  node    f [Chain: a -> b -> c] x<-input.x" in to_text(t)
    assert "  node    d [Affine] x<-f.hi" in to_text(t)
    assert '  f["f<br/>Chain: a -> b -> c"]' in to_mermaid(t)
    assert '  "f" [shape=box, label="f\\nChain: a -> b -> c"];' in to_dot(t)


def test_cli_validate_and_graph(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fused = str(REPO / "topologies" / "digits-fused.yaml")
    assert cli(["validate", fused]) == 0
    # one line, wherever the checkout is: output to a pipe is never hard-wrapped
    assert f"{fused}: topology 'digits-fused' with 1 nodes is valid\n" in capsys.readouterr().out
    assert cli(["graph", fused]) == 0
    graph = capsys.readouterr().out
    assert "  node    classify [Chain: pre -> model -> post] pixels<-input.pixels" in graph
    assert "label<-classify.label, probs<-classify.probs" in graph
    assert "fs.digits-fused.pre" not in graph and "fs.digits-fused.model" not in graph
    broken = tmp_path / "broken.yaml"
    broken.write_text((REPO / "topologies" / "digits-fused.yaml").read_text().replace("[pre, model, post]",
                                                                                      "[pre, post]"))
    assert cli(["validate", str(broken)]) == 1
    assert "every input of 'post' must come from 'pre'" in capsys.readouterr().err


def test_digits_fused_is_digits(tmp_path: Path) -> None:
    fused = load_topology(REPO / "topologies" / "digits-fused.yaml")
    plain = load_topology(REPO / "topologies" / "digits.yaml")
    chain = fused.nodes["classify"].component
    assert isinstance(chain, Chain) and chain.members == list(plain.nodes)
    for (step, member), node in zip(chain.steps, plain.nodes.values(), strict=True):
        assert type(member) is type(node.component) and member.params == node.component.params
        assert step.wiring == {p: ss[0].tensor for p, ss in node.bindings.items()} or step.id == "pre"
    assert fused.inputs == plain.inputs and fused.output_ports() == plain.output_ports()
    assert chain.offload  # the model member offloads, so the chain does


# --- what a chain computes -------------------------------------------------------------------------------


def chain_of(*members: tuple[str, dict[str, Any], str]) -> tuple[Chain, Topology]:
    """A chain of ``(component, params, port read from the previous member)`` named m0, m1, ...; and the same
    topology unfused."""
    lines = ["name: t", "nodes:"]
    for k, (component, params, port) in enumerate(members):
        source = "input.x" if k == 0 else f"m{k - 1}.{port}"
        lines.append(f"  m{k}: {{component: {K}:{component}, params: {params}, inputs: {{x: {source}}}}}")
    last = len(members) - 1
    text = "\n".join(lines) + f"\noutputs: {{out: m{last}.x}}\n"
    if members[-1][0] == "Split":
        text = text.replace(f"out: m{last}.x", f"lo: m{last}.lo, hi: m{last}.hi")
    fused = load_topology_text(text + f"fuse: {{f: [{', '.join(f'm{k}' for k in range(len(members)))}]}}\n")
    chain = fused.nodes["f"].component
    assert isinstance(chain, Chain)
    return chain, load_topology_text(text)


def batch(firsts: list[list[float]]) -> Batch:
    """A request per inner list; each row is ``[first, 1, 2, 3]``."""
    rows = [[v, 1.0, 2.0, 3.0] for request in firsts for v in request]
    return Batch({"x": np.array(rows, dtype=np.float32).reshape(-1, 4)}, [len(r) for r in firsts],
                 [f"r{i}" for i in range(len(firsts))])


def delivered(result: Any, sizes: list[int]) -> list[dict[str, np.ndarray] | str]:
    """What each request gets from a result, read as the worker's emitter reads it: its first error, or its
    rows on each port it is emitted on."""
    r = result if isinstance(result, Result) else Result(dict(result))
    out: list[dict[str, np.ndarray] | str] = []
    start = 0
    for n in sizes:
        stop = start + n
        error = next((r.errors[i] for i in range(start, stop) if i in r.errors), None)
        if error is not None:
            out.append(error)
        else:
            got = {}
            for port, array in r.outputs.items():
                rows = np.asarray(array)[start:stop]
                if port in r.mask:
                    sel = np.asarray(r.mask[port], dtype=bool)[start:stop]
                    if not sel.any():
                        continue
                    rows = rows[sel]
                got[port] = rows
            out.append(got)
        start = stop
    return out


def unfused(topology: Topology, x: np.ndarray) -> dict[str, np.ndarray] | str:
    """One request through the unfused stages, each its own worker: the last stage's emitted ports, {} when
    the request was routed away, or the error of the stage that failed it."""
    emitted = {"x": x}
    for node in topology.nodes.values():
        if node.id == "outputs":
            continue
        (src,) = node.bindings["x"]
        if src.tensor not in emitted:
            return {}
        tensors = {"x": emitted[src.tensor]}
        try:
            node.component.inputs["x"].check("x", tensors["x"])
        except WireError as exc:
            return f"node '{node.id}': {exc}"
        result = node.component.process(Batch(tensors, [len(x)], ["r"]))
        if isinstance(result, Result):  # the worker casts to the declared datatypes before it encodes
            result.outputs = {p: a.astype(DATATYPES[node.component.outputs[p].datatype])
                              for p, a in result.outputs.items()}
        else:
            result = {p: a.astype(DATATYPES[node.component.outputs[p].datatype]) for p, a in result.items()}
        (answer,) = delivered(result, [len(x)])
        if isinstance(answer, str):
            return f"node '{node.id}': {answer}"
        emitted = answer
    return emitted


def assert_same_as_unfused(chain: Chain, topology: Topology, firsts: list[list[float]]) -> list[Any]:
    b = batch(firsts)
    got = delivered(chain.process(b), b.sizes)
    start = 0
    for n, answer in zip(b.sizes, got, strict=True):
        expected = unfused(topology, b["x"][start:start + n])
        start += n
        if isinstance(expected, str):
            assert answer == expected
        else:
            assert isinstance(answer, dict) and answer.keys() == expected.keys()
            for port in expected:
                assert answer[port].dtype == expected[port].dtype
                np.testing.assert_array_equal(answer[port], expected[port])
    return got


SIZES = [[0, 7], [1], [2, 3, 7], [4, 5, 6], [8]]  # sizes [2, 1, 3, 3, 1]


def test_plain_dicts_equal_the_composition() -> None:
    chain, plain = chain_of(("Affine", {"mul": 2}, "x"), ("Affine", {"add": 1}, "x"), ("Affine", {"mul": 3}, "x"))
    b = batch(SIZES)
    result = chain.process(b)
    assert not isinstance(result, Result)  # nothing failed or was routed: the last member's dict as is
    np.testing.assert_array_equal(result["x"], (b["x"] * 2 + 1) * 3)
    assert_same_as_unfused(chain, plain, SIZES)


def test_errors_name_the_member_and_keep_the_original_row_numbers() -> None:
    # m0 sends rows of 50 and more away (hi); m1 rejects 7; m2 adds 1.
    chain, plain = chain_of(("Split", {"value": 50}, ""), ("Reject", {"value": 7}, "lo"), ("Affine", {"add": 1}, "x"))
    b = batch([[60, 7], [1], [2, 70, 7], [3, 4]])
    result = chain.process(b)
    assert isinstance(result, Result)
    assert result.errors == {1: "node 'm1': rejects 7", 5: "node 'm1': rejects 7"}
    got = assert_same_as_unfused(chain, plain, [[60, 7], [1], [2, 70, 7], [3, 4]])
    assert got[0] == got[2] == "node 'm1': rejects 7"
    np.testing.assert_array_equal(got[1]["x"][:, 0], [2])
    np.testing.assert_array_equal(got[3]["x"][:, 0], [4, 5])


def test_errors_of_the_first_and_last_member() -> None:
    chain, plain = chain_of(("Reject", {"value": 7}, "x"), ("Affine", {"mul": 2}, "x"), ("Reject", {"value": 8}, "x"))
    result = chain.process(batch(SIZES))
    assert isinstance(result, Result)
    assert result.errors == {1: "node 'm0': rejects 7", 5: "node 'm0': rejects 7", 6: "node 'm2': rejects 8"}
    got = assert_same_as_unfused(chain, plain, SIZES)  # [4, 5, 6] is 8 at m2
    assert got[3] == "node 'm2': rejects 8"
    assert got[1]["x"].shape == (1, 4) and got[4]["x"].shape == (1, 4)


def test_an_item_routed_away_from_the_next_member_stops_there() -> None:
    chain, plain = chain_of(("Split", {"value": 5}, ""), ("Affine", {"add": 1}, "lo"), ("Affine", {"mul": 2}, "x"))
    b = batch(SIZES)
    result = chain.process(b)
    assert isinstance(result, Result) and result.errors == {}
    assert list(result.mask) == ["x"]
    np.testing.assert_array_equal(result.mask["x"], [True, False, True, True, True, False, True, False, False,
                                                     False])
    got = assert_same_as_unfused(chain, plain, SIZES)
    assert got[4] == {}  # wholly routed away: no rows on any port, no error
    np.testing.assert_array_equal(got[3]["x"][:, 0], [10])  # partly: the rows that went on, alone
    np.testing.assert_array_equal(got[2]["x"][:, 0], [6, 8])


def test_everything_routed_away() -> None:
    chain, plain = chain_of(("Split", {"value": -1}, ""), ("Affine", {"add": 1}, "lo"))
    result = chain.process(batch(SIZES))
    assert isinstance(result, Result) and result.outputs == {} and result.errors == {}
    assert assert_same_as_unfused(chain, plain, SIZES) == [{}] * len(SIZES)


def test_the_last_members_mask_is_carried_through() -> None:
    chain, plain = chain_of(("Affine", {"add": 1}, "x"), ("Split", {"value": 5}, "x"))
    b = batch(SIZES)
    result = chain.process(b)
    assert isinstance(result, Result) and set(result.mask) == {"lo", "hi"}
    np.testing.assert_array_equal(result.mask["lo"], b["x"][:, 0] + 1 < 5)
    assert_same_as_unfused(chain, plain, SIZES)
    # ... also when earlier members dropped items
    chain, plain = chain_of(("Reject", {"value": 7}, "x"), ("Split", {"value": 4}, "x"))
    result = chain.process(b)
    assert isinstance(result, Result) and result.errors == {1: "node 'm0': rejects 7", 5: "node 'm0': rejects 7"}
    got = assert_same_as_unfused(chain, plain, SIZES)
    assert set(got[3]) == {"hi"} and set(got[1]) == {"lo"}


def test_a_member_raising_names_the_member() -> None:
    chain, _ = chain_of(("Affine", {}, "x"), ("Boom", {"value": 3}, "x"))
    with pytest.raises(ComponentError, match=r"^node 'm1' \(Boom\): RuntimeError\('boom on 3'\)$"):
        chain.process(batch(SIZES))
    assert not isinstance(chain.process(batch([[1], [2]])), Result)


def test_inner_edges_keep_the_port_contract() -> None:
    """Between members, as between workers: outputs cast to the declared datatype, inputs checked."""
    from fs_testkit import NoNaN

    NoNaN.seen.clear()
    chain, plain = chain_of(("Emit", {"value": 7}, "x"), ("NoNaN", {}, "x"))
    result = chain.process(batch(SIZES))
    assert NoNaN.seen == [np.float32]
    assert isinstance(result, Result)
    assert result.errors == {0: "node 'm1': port 'x' does not accept NaN or infinite values",
                             3: "node 'm1': port 'x' does not accept NaN or infinite values"}
    assert_same_as_unfused(chain, plain, SIZES)


def test_a_bad_member_result_names_the_member() -> None:
    chain, _ = chain_of(("Affine", {}, "x"), ("Affine", {}, "x"))
    chain.steps[0][1].process = lambda batch: {"x": batch["x"][:1]}  # type: ignore[method-assign]
    with pytest.raises(ComponentError, match=r"node 'm0': output 'x' has leading dimension \(1,\), expected 3"):
        chain.process(batch([[1, 2, 3]]))
    chain.steps[0][1].process = lambda batch: {"y": batch["x"]}  # type: ignore[method-assign]
    with pytest.raises(ComponentError, match="node 'm0': process returned undeclared output port 'y'"):
        chain.process(batch([[1]]))


def test_describe_weights_and_lifecycle() -> None:
    from fs_testkit import Lifecycle

    chain, _ = chain_of(("Affine", {"weights": "w1"}, "x"), ("Lifecycle", {}, "x"), ("Affine", {"weights": "w3"}, "x"))
    assert chain.describe() == ("flowserve.topology.fuse:Chain"
                                "[m0=fs_testkit:Affine; m1=fs_testkit:Lifecycle; m2=fs_testkit:Affine]")
    assert chain.weights_hash == "w1,w3"
    assert chain_of(("Affine", {}, "x"), ("Affine", {}, "x"))[0].weights_hash is None
    Lifecycle.calls.clear()
    chain.prepare()
    chain.setup()
    chain.close()
    assert Lifecycle.calls == ["prepare m1", "setup m1", "close m1"]
    assert chain.device == "cpu" and not chain.offload
    assert list(chain.inputs) == ["x"] and list(chain.outputs) == ["x"]


def test_a_bad_member_mask_names_the_member() -> None:
    chain, _ = chain_of(("Affine", {}, "x"), ("Affine", {}, "x"))
    chain.steps[0][1].process = lambda batch: Result({"x": batch["x"]}, mask={"x": [True]})  # type: ignore[method-assign]
    with pytest.raises(ComponentError, match=r"node 'm0': mask of 'x' has shape \[1\], expected \[3\]"):
        chain.process(batch([[1, 2, 3]]))
