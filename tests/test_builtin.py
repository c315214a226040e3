from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flowserve import builtin
from flowserve.builtin import Fail, Identity, Sleep
from flowserve.component import Port, Result
from flowserve.errors import ComponentError
from flowserve.wire.tensors import DATATYPES


def test_identity_default_port(configure, make_batch) -> None:
    node = configure(Identity, {}, node="echo")
    assert node.inputs == {"x": Port("FP32", [-1])} == node.outputs
    x = np.array([1.0, 2.0], dtype=np.float32)
    out = node.process(make_batch([2], x=x))
    assert out == {"x": x} and out["x"] is x


def test_identity_ports_from_params_are_per_instance(configure, make_batch) -> None:
    params = {"ports": {"img": {"datatype": "UINT8", "shape": [-1, 2, 2]}, "name": {"datatype": "BYTES"}}}
    node = configure(Identity, params, node="echo")
    assert node.inputs == {"img": Port("UINT8", [-1, 2, 2]), "name": Port("BYTES", [-1])}
    assert node.outputs == node.inputs and node.outputs is not node.inputs
    assert Identity.inputs == {} and Identity.configure({}).inputs == {"x": Port("FP32", [-1])}
    img = np.zeros((3, 2, 2), dtype=np.uint8)
    name = np.array([b"a", b"b", b"c"], dtype=object)
    out = node.process(make_batch([1, 2], img=img, name=name))
    assert out["img"] is img and out["name"] is name


@pytest.mark.parametrize(
    ("ports", "message"),
    [
        ({"x": {"datatype": "FLOAT"}}, "port 'x': port datatype 'FLOAT' is not one of"),
        ({"x": {"datatype": "FP32", "shape": []}}, "port 'x': port shape"),
        ({}, "declare at least one port"),
        ({"a b": {"datatype": "FP32"}}, "port name 'a b' must match"),
        ({"x": {"datatype": "FP32", "dims": [1]}}, "dims"),
    ],
)
def test_identity_bad_ports(ports: dict, message: str) -> None:
    with pytest.raises(ComponentError, match=message):
        Identity.configure({"ports": ports})


def test_fail_fails_matching_rows(configure, make_batch) -> None:
    node = configure(Fail, {"value": 7}, node="fail")
    x = np.array([1, 7, 3, 7], dtype=np.float32)
    result = node.process(make_batch([1, 2, 1], x=x))
    assert isinstance(result, Result)
    assert result.outputs["x"] is x
    assert result.errors == {1: "row 1 holds 7.0 on 'x'", 3: "row 3 holds 7.0 on 'x'"}
    assert result.mask == {}


def test_fail_matches_any_element_of_a_row_and_bytes(configure, make_batch) -> None:
    node = configure(
        Fail,
        {
            "ports": {"v": {"datatype": "INT32", "shape": [-1, 3]}, "s": {"datatype": "BYTES"}},
            "port": "s",
            "value": "boom",
        }
    )
    v = np.zeros((3, 3), dtype=np.int32)
    s = np.array([b"ok", b"boom", b"okay"], dtype=object)
    assert node.process(make_batch([3], v=v, s=s)).errors == {1: "row 1 holds 'boom' on 's'"}
    numeric = configure(Fail, {"ports": {"v": {"datatype": "INT32", "shape": [-1, 3]}}, "port": "v", "value": 5})
    v[2, 1] = 5
    assert list(numeric.process(make_batch([3], v=v)).errors) == [2]
    text = configure(Fail, {"ports": {"v": {"datatype": "INT32", "shape": [-1, 3]}}, "port": "v", "value": "5"})
    assert text.process(make_batch([3], v=v)).errors == {}


def test_fail_raise_mode(configure, make_batch) -> None:
    node = configure(Fail, {"value": -1, "mode": "raise"})
    x = np.array([0.0, -1.0], dtype=np.float32)
    with pytest.raises(RuntimeError, match=r"Fail: 1 row\(s\) hold -1.0 on 'x'"):
        node.process(make_batch([2], x=x))
    assert node.process(make_batch([1], x=np.zeros(1, dtype=np.float32))).errors == {}


def test_fail_port_must_be_declared() -> None:
    with pytest.raises(ComponentError, match="port 'y' is not one of the declared ports"):
        Fail.configure({"port": "y"})


def test_sleep_passes_through_after_its_delay(configure, make_batch, monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(builtin.time, "sleep", slept.append)
    node = configure(Sleep, {"ms": 20, "per_item_ms": 5}, node="slow")
    x = np.ones(3, dtype=np.float32)
    out = node.process(make_batch([1, 2], x=x))
    assert out["x"] is x
    assert slept == [pytest.approx(0.035)]
    assert node.offload and not Identity.offload
    with pytest.raises(ComponentError, match="ms"):
        Sleep.configure({"ms": -1})


def test_sample_fills_every_echo_port() -> None:
    from flowserve.topology import load_topology

    echo = load_topology(Path(__file__).resolve().parents[1] / "topologies" / "echo.yaml")
    requests, labels = builtin.sample(3, seed=1)
    assert labels == [None, None, None] and len(requests) == 3
    for request in requests:
        assert set(request) == set(echo.inputs)
        for name, port in echo.inputs.items():
            assert request[name].shape == (1, 3) and request[name].dtype == DATATYPES[port.datatype]
    assert requests[0]["t_bytes"][0, 0] == str(requests[0]["t_int64"][0, 0]).encode()
    assert builtin.sample(0) == ([], [])
    with pytest.raises(ValueError, match="n must be >= 0"):
        builtin.sample(-1)


def test_stall_never_answers_its_share_or_the_marked_requests(configure, make_batch) -> None:
    ports = {"x": {"datatype": "FP32", "shape": [-1, 2]}}
    none = configure(builtin.Stall, {"ports": ports}, node="s")
    x = np.zeros((3, 2), np.float32)
    x[2, 1] = -1.0
    assert none.process(make_batch([1, 2], x=x)).mask["x"].tolist() == [True, True, True]
    marked = configure(builtin.Stall, {"ports": ports, "port": "x", "value": -1}, node="s")
    result = marked.process(make_batch([1, 2], x=x))  # request r1 holds -1 on one of its rows: all of it
    assert isinstance(result, Result) and result.mask["x"].tolist() == [True, False, False]
    everyone = configure(builtin.Stall, {"ports": ports, "share": 1.0}, node="s")
    assert not everyone.process(make_batch([1, 2], x=x)).mask["x"].any()
