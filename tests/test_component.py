"""The component contract: ports, params, batches, loading a component class by reference."""

from __future__ import annotations

import sys
from typing import ClassVar

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict, Field

from flowserve.component import (
    Batch,
    Component,
    NoParams,
    Port,
    Result,
    import_library,
    load_component_class,
    read_result,
)
from flowserve.errors import ComponentError, WireError


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float = Field(0.5, ge=0, le=1)
    mode: str = "fast"


class Thresh(Component):
    inputs: ClassVar[dict[str, Port]] = {"x": Port("FP32", [-1, 2])}
    outputs: ClassVar[dict[str, Port]] = {"hit": Port("BOOL", [-1, 2])}
    Params = Params

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return {"hit": batch["x"] > self.params.threshold}  # type: ignore[attr-defined]


class Plain(Component):
    pass


# --- Port ------------------------------------------------------------------------------------------


def test_port_normalises_shape_to_a_tuple() -> None:
    port = Port("FP32", [-1, 64])
    assert port.shape == (-1, 64)
    assert port == Port("FP32", (-1, 64))
    assert Port("INT8").shape == (-1,)
    assert port.to_metadata("pixels") == {"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}


@pytest.mark.parametrize("datatype", ["FLOAT32", "fp32", ""])
def test_port_rejects_unknown_datatypes(datatype: str) -> None:
    with pytest.raises(ComponentError, match=f"port datatype '{datatype}' is not one of BOOL, UINT8"):
        Port(datatype, [-1])


@pytest.mark.parametrize("shape", [[], [-2], [-1, 1.5], ["4"]])
def test_port_rejects_bad_shapes(shape: list) -> None:
    with pytest.raises(ComponentError, match="must be a non-empty list of ints >= -1"):
        Port("FP32", shape)


def test_check_accepts_fitting_arrays() -> None:
    port = Port("FP32", [-1, 3])
    port.check("x", np.zeros((0, 3), dtype=np.float32))
    port.check("x", np.zeros((5, 3), dtype=np.float32))
    port.check("x", np.array([[np.inf, -np.inf, np.nan]], dtype=np.float32))  # NaN allowed by default
    Port("BYTES", [-1]).check("s", np.array([b"a", b""], dtype=object))
    Port("BYTES", [-1]).check("s", np.array(["a", "b"]))
    Port("BOOL", [-1]).check("b", np.array([True]))


@pytest.mark.parametrize(("array", "dtype_name"), [
    (np.zeros((1, 3), dtype=np.float64), "float64"),
    (np.zeros((1, 3), dtype=np.int32), "int32"),
    (np.zeros((1, 3), dtype=object), "object"),
])
def test_check_rejects_other_datatypes(array: np.ndarray, dtype_name: str) -> None:
    with pytest.raises(WireError, match=f"port 'x' takes FP32, got {dtype_name}"):
        Port("FP32", [-1, 3]).check("x", array)


def test_check_rejects_non_bytes_for_bytes_ports() -> None:
    with pytest.raises(WireError, match="port 's' takes BYTES, got int64"):
        Port("BYTES", [-1]).check("s", np.array([1, 2], dtype=np.int64))


@pytest.mark.parametrize("shape", [(3,), (1, 3, 1), ()])
def test_check_rejects_other_ranks(shape: tuple[int, ...]) -> None:
    with pytest.raises(WireError, match=rf"port 'x' takes shape \[-1, 3\], got \[{', '.join(map(str, shape))}\]"):
        Port("FP32", [-1, 3]).check("x", np.zeros(shape, dtype=np.float32))


def test_check_rejects_wrong_fixed_dims_and_accepts_any_variable_dim() -> None:
    port = Port("UINT8", [2, -1, 4])
    for shape in [(2, 0, 4), (2, 1, 4), (2, 1000, 4)]:
        port.check("img", np.zeros(shape, dtype=np.uint8))
    for shape in [(3, 1, 4), (2, 1, 5), (1, 1, 4)]:
        with pytest.raises(WireError, match=r"port 'img' takes shape \[2, -1, 4\]"):
            port.check("img", np.zeros(shape, dtype=np.uint8))


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
def test_check_rejects_non_finite_values_when_not_allowed(datatype: str) -> None:
    port = Port(datatype, [-1], allow_nan=False)
    dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[datatype]
    port.check("x", np.array([1.0, -2.5, np.finfo(dtype).max], dtype=dtype))
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(WireError, match="port 'x' does not accept NaN or infinite values"):
            port.check("x", np.array([1.0, bad], dtype=dtype))
    Port(datatype, [-1]).check("x", np.array([np.nan, np.inf], dtype=dtype))  # allowed by default


def test_allow_nan_false_is_harmless_for_integer_ports() -> None:
    Port("INT32", [-1], allow_nan=False).check("i", np.array([1, 2], dtype=np.int32))


def test_compatible() -> None:
    vec = Port("FP32", [-1, 4])
    assert vec.compatible(Port("FP32", [-1, 4])) is None
    assert vec.compatible(Port("FP32", [-1, -1])) is None
    assert Port("FP32", [8, 4]).compatible(vec) is None
    assert vec.compatible(Port("FP32", [8, 4])) is None  # -1 on either side fits
    assert vec.compatible(Port("FP64", [-1, 4])) == "datatype FP32 does not match FP64"
    assert vec.compatible(Port("FP32", [-1])) == "shape [-1, 4] has rank 2, expected [-1]"
    assert vec.compatible(Port("FP32", [-1, 5])) == "shape [-1, 4] does not fit [-1, 5]"
    assert vec.compatible(Port("FP32", [-1, 4], allow_nan=False)) is None


# --- Component ---------------------------------------------------------------------------------------


def test_configure_validates_params() -> None:
    comp = Thresh.configure({"threshold": 0.25}, node="gate")
    assert isinstance(comp, Thresh)
    assert comp.params == Params(threshold=0.25)
    assert comp.node == "gate" and comp.device == "cpu"
    assert Thresh.configure(None).params == Params()
    assert comp.describe() == f"{__name__}:Thresh"


def test_configure_bad_params_message_names_every_problem() -> None:
    with pytest.raises(ComponentError) as info:
        Thresh.configure({"threshold": 2, "mode": 3, "extra": True})
    assert str(info.value) == (
        "bad params for Thresh: threshold: Input should be less than or equal to 1; "
        "mode: Input should be a valid string; extra: Extra inputs are not permitted"
    )


def test_components_without_params_reject_any() -> None:
    assert isinstance(Plain.configure({}).params, NoParams)
    with pytest.raises(ComponentError, match="bad params for Plain: k: Extra inputs are not permitted"):
        Plain.configure({"k": 1})


def test_process_must_be_implemented() -> None:
    with pytest.raises(NotImplementedError, match="Plain.process"):
        Plain().process(Batch({}, [], []))


def test_process_on_a_batch() -> None:
    out = Thresh.configure({}).process(Batch({"x": np.array([[0.1, 0.9]], dtype=np.float32)}, [1], ["r"]))
    assert out["hit"].tolist() == [[False, True]]  # type: ignore[index]


def test_result_defaults() -> None:
    result = Result({"y": np.zeros(2)})
    assert result.mask == {} and result.errors == {}


# --- Batch -------------------------------------------------------------------------------------------


def test_batch_is_a_mapping_of_tensors_with_sizes() -> None:
    x = np.arange(12).reshape(6, 2)
    batch = Batch({"x": x, "y": x[:, 0]}, [1, 3, 2], ["a", "b", "c"])
    assert list(batch) == ["x", "y"] and len(batch) == 2
    assert batch["x"] is x
    assert dict(batch).keys() == {"x", "y"}
    assert batch.rows == 6
    assert batch.request_ids == ["a", "b", "c"]
    assert batch.starts().tolist() == [0, 1, 4]
    assert batch.starts().dtype == np.intp
    assert np.minimum.reduceat(x[:, 0], batch.starts()).tolist() == [0, 2, 8]


def test_batch_starts_edge_cases() -> None:
    assert Batch({}, [5], ["a"]).starts().tolist() == [0]
    assert Batch({}, [0, 2, 0], ["a", "b", "c"]).starts().tolist() == [0, 0, 2]
    empty = Batch({}, [], [])
    assert empty.rows == 0
    assert empty.starts().tolist() == []


# --- load_component_class ----------------------------------------------------------------------------


def test_load_component_class() -> None:
    assert load_component_class(f"{__name__}:Thresh") is Thresh
    assert load_component_class("flowserve.topology.graph:Collect").__name__ == "Collect"


@pytest.mark.parametrize("ref", ["no_colon", ":Thresh", f"{__name__}:", ""])
def test_load_component_class_needs_module_and_class(ref: str) -> None:
    with pytest.raises(ComponentError, match=f"component '{ref}' must look like 'package.module:ClassName'"):
        load_component_class(ref)


@pytest.mark.parametrize("module", ["no_such_module_xyz", "flowserve.no_such_module", ".relative"])
def test_load_component_class_unknown_module(module: str) -> None:
    with pytest.raises(ComponentError, match=f"cannot import module '{module}' for component '{module}:X'"):
        load_component_class(f"{module}:X")


def test_load_component_class_unknown_class() -> None:
    with pytest.raises(ComponentError, match=f"module '{__name__}' has no 'Missing'"):
        load_component_class(f"{__name__}:Missing")


@pytest.mark.parametrize("name", ["Params", "test_compatible", "np", "Port"])
def test_load_component_class_rejects_non_components(name: str) -> None:
    with pytest.raises(ComponentError, match=f"'{__name__}:{name}' is not a flowserve Component subclass"):
        load_component_class(f"{__name__}:{name}")


# --- read_result (how a worker and a fused chain read what process returned) -------------------------


def test_read_result_casts_to_the_declared_dtype_and_keeps_masks_and_errors() -> None:
    comp = Thresh()
    outputs, mask, errors = read_result(comp, Result({"hit": np.array([[1, 0], [0, 1]])}, {"hit": [True, False]},
                                                     {1: "bad row", 7: "no such row"}), 2, node="t")
    assert outputs["hit"].dtype == np.bool_
    np.testing.assert_array_equal(mask["hit"], [True, False])
    assert errors == {1: "bad row"}  # an error naming no row of the batch matches nothing


@pytest.mark.parametrize(("result", "message"), [
    ({"other": np.zeros((2, 2))}, "node 't': process returned undeclared output port 'other'"),
    ({"hit": np.zeros((3, 2))}, r"node 't': output 'hit' has leading dimension \(3,\), expected 2"),
    (Result({"hit": np.zeros((2, 2))}, {"hit": np.ones(3, bool)}), r"mask of 'hit' has shape \[3\], expected \[2\]"),
    ([np.zeros((2, 2))], "process returned list, expected a dict of arrays or a Result"),
])
def test_read_result_rejects_results_that_break_the_declaration(result: object, message: str) -> None:
    with pytest.raises(ComponentError, match=message):
        read_result(Thresh(), result, 2, node="t")  # type: ignore[arg-type]


def test_a_missing_component_library_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # as if flowserve-components were absent, whatever of it earlier tests imported
    for name in ["flowserve_components", "flowserve_components.models", "flowserve_components.digits"]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ComponentError, match=r"cannot import flowserve_components\.models: .* pip install -e "
                                             r"\./components"):
        import_library("flowserve_components.models")
    with pytest.raises(ComponentError, match=r"component 'flowserve_components\.digits:Normalize': .* is not "
                                             r"installed: pip install -e \./components"):
        load_component_class("flowserve_components.digits:Normalize")


def test_import_library_passes_on_other_import_errors() -> None:
    with pytest.raises(ImportError) as info:
        import_library("no_such_module_fs")
    assert not isinstance(info.value, ComponentError)
    with pytest.raises(ComponentError, match="check the module path and that its package is installed"):
        load_component_class("no_such_module_fs:X")
