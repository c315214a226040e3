"""Serve an ONNX model with ONNX Runtime: ports read from the graph, one ``session.run`` per batch.

In a topology::

    classify:
      component: flowserve_components.onnx:OnnxModel
      params: {model: models/cnn.onnx}
      inputs: {image: input.image}

The node's input and output ports are the graph's inputs and outputs: their names, their V2 datatypes
(mapped from the ONNX element types) and their shapes with ``-1`` for the batch dimension and any other
symbolic dimension. Every graph input must have a dynamic first dimension (the batch): export with e.g.
``dynamic_axes={"image": {0: "batch"}}``. A graph name that is not a valid port name (``input.1``) is
renamed with ``names: {input.1: image}``.

Loading is safe: an ONNX file is a protobuf graph and weights, never unpickled. The file is read when
the topology is loaded (a cheap protobuf parse, external weights left on disk), so a missing file, a file
that is not ONNX, an opset this runtime does not know or an input without a batch dimension fails there,
naming the file; ONNX Runtime itself is imported and the session built in ``setup``, once per worker.
Providers: CUDA where ONNX Runtime has it, else CPU (``providers`` picks them explicitly).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx
from onnx import TensorProto
from pydantic import BaseModel, ConfigDict, Field, model_validator

from flowserve.component import Batch, Component, Port
from flowserve.errors import ComponentError
from flowserve_components.model_files import model_location, one_source

#: ONNX element type -> V2 datatype; a type absent here (complex, float8, bfloat16) cannot be served.
ELEMENT_TYPES: dict[int, str] = {
    TensorProto.BOOL: "BOOL",
    TensorProto.UINT8: "UINT8",
    TensorProto.UINT16: "UINT16",
    TensorProto.UINT32: "UINT32",
    TensorProto.UINT64: "UINT64",
    TensorProto.INT8: "INT8",
    TensorProto.INT16: "INT16",
    TensorProto.INT32: "INT32",
    TensorProto.INT64: "INT64",
    TensorProto.FLOAT16: "FP16",
    TensorProto.FLOAT: "FP32",
    TensorProto.DOUBLE: "FP64",
    TensorProto.STRING: "BYTES",
}
#: ONNX Runtime only guarantees the default domain from this opset on.
MIN_OPSET = 7
_CPU, _CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
#: what a port name must look like (it ends up in topic names): flowserve.topology.spec.ID_PATTERN.
_PORT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
#: pickle protocol 2+ starts with 0x80; torch.save writes a zip archive holding a pickle.
_PICKLE_MAGIC, _ZIP_MAGIC = b"\x80", b"PK\x03\x04"


class OnnxParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(None, description="path of the .onnx file (relative: to the working directory)")
    model_from: str | None = Field(None, description="'module:function' returning the .onnx file's path, creating "
                                   "it when missing (e.g. training into a cache); called when the topology loads")
    providers: list[str] | None = Field(None, description="ONNX Runtime execution providers in order of "
                                        "preference; default CUDA where present, then CPU")
    names: dict[str, str] = Field(default_factory=dict, description="graph input/output name -> port name, "
                                  "for graph names that are not valid port names")
    threads: int = Field(1, ge=1, le=256, description="intra-op threads per worker (CPU provider)")
    max_batch: int | None = Field(None, gt=0, le=65536, description="largest batch in requests")

    @model_validator(mode="after")
    def _one_source(self) -> OnnxParams:
        one_source(self.model, self.model_from)
        return self


def _fail(path: Path, why: str) -> ComponentError:
    return ComponentError(f"ONNX model {path}: {why}")


def read_graph(path: Path) -> onnx.ModelProto:
    """Parse ``path`` as an ONNX model without its external weights; raise naming the file if it is not one."""
    if not path.is_file():
        problem = "no such file" if not path.exists() else "not a file"
        raise _fail(path, f"{problem}; give 'model' the path of an .onnx file")
    with path.open("rb") as f:
        head = f.read(4)
    if head.startswith(_ZIP_MAGIC) or head.startswith(_PICKLE_MAGIC):
        raise _fail(path, "is a pickle or torch.save archive, not ONNX; pickles run code when loaded, so they "
                    "are refused: export the model with torch.onnx.export")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError and friends; all mean the same here
        raise _fail(path, f"not an ONNX file ({type(exc).__name__}: {exc})") from None
    if not model.ir_version or not model.HasField("graph") or not model.graph.output:
        raise _fail(path, "not an ONNX model (it parses, but holds no IR version or no graph outputs)")
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            newest = onnx.defs.onnx_opset_version()
            if not MIN_OPSET <= opset.version <= newest:
                raise _fail(path, f"unsupported opset {opset.version} (this runtime serves opsets {MIN_OPSET} "
                            f"to {newest}); re-export with a supported opset_version")
    return model


def _port(path: Path, kind: str, value: onnx.ValueInfoProto, name: str) -> Port:
    """The port for one graph input or output: V2 datatype, shape with -1 for the batch and symbolic dims."""
    if not value.type.HasField("tensor_type"):
        raise _fail(path, f"graph {kind} '{value.name}' is not a tensor ({value.type.WhichOneof('value')})")
    tensor = value.type.tensor_type
    datatype = ELEMENT_TYPES.get(tensor.elem_type)
    if datatype is None:
        element = TensorProto.DataType.Name(tensor.elem_type)
        raise _fail(path, f"graph {kind} '{value.name}' holds {element}, which has no V2 datatype "
                    f"(served: {', '.join(TensorProto.DataType.Name(t) for t in ELEMENT_TYPES)})")
    if not tensor.HasField("shape"):
        raise _fail(path, f"graph {kind} '{value.name}' has no shape; export it with shapes or run "
                    "onnx.shape_inference on the file")
    dims = list(tensor.shape.dim)
    if not dims or dims[0].HasField("dim_value"):
        shape = [d.dim_value if d.HasField("dim_value") else "?" for d in dims]
        raise _fail(path, f"graph {kind} '{value.name}' has shape {shape}: no batch dimension (its first "
                    f"dimension must be dynamic); export with dynamic_axes={{'{value.name}': {{0: 'batch'}}}}")
    shape_out = [-1] + [d.dim_value if d.HasField("dim_value") else -1 for d in dims[1:]]
    if not _PORT_NAME.match(name):
        raise _fail(path, f"graph {kind} '{value.name}' is not a valid port name; map it to one with "
                    f"params 'names: {{{value.name}: NAME}}' (NAME matching {_PORT_NAME.pattern})")
    return Port(datatype, shape_out)


def graph_ports(path: Path, model: onnx.ModelProto, names: dict[str, str]) -> tuple[dict[str, Port],
                                                                                   dict[str, Port]]:
    """Input and output ports of ``model`` by port name (``names`` renames graph names)."""
    graph = model.graph
    # Before IR 4, initializers (weights) were listed among the inputs too; they are not ports.
    weights = {init.name for init in graph.initializer}
    feeds = [v for v in graph.input if v.name not in weights]
    outputs = list(graph.output)
    if any(not v.type.tensor_type.HasField("shape") for v in outputs if v.type.HasField("tensor_type")):
        try:
            graph = onnx.shape_inference.infer_shapes(model).graph
            outputs = list(graph.output)
        except Exception as exc:  # noqa: BLE001 - inference failing leaves the shapes unknown, reported below
            raise _fail(path, f"graph outputs have no shape and shape inference failed: {exc}") from None
    unknown = set(names) - {v.name for v in (*feeds, *outputs)}
    if unknown:
        raise _fail(path, f"'names' maps {', '.join(sorted(unknown))}, which the graph lacks (inputs: "
                    f"{', '.join(v.name for v in feeds)}; outputs: {', '.join(v.name for v in outputs)})")
    ins = {names.get(v.name, v.name): _port(path, "input", v, names.get(v.name, v.name)) for v in feeds}
    outs = {names.get(v.name, v.name): _port(path, "output", v, names.get(v.name, v.name)) for v in outputs}
    if not ins:
        raise _fail(path, "the graph has no inputs (every input is a weight)")
    if len(ins) != len(feeds) or len(outs) != len(outputs):
        raise _fail(path, "'names' maps two graph values to the same port name")
    return ins, outs


class OnnxModel(Component):
    """Run an ONNX model with ONNX Runtime; its ports are the graph's inputs and outputs."""

    Params: ClassVar[type[BaseModel]] = OnnxParams
    max_batch: ClassVar[int] = 256
    #: ONNX Runtime releases the GIL while it runs, so the worker can fetch the next batch meanwhile.
    offload: ClassVar[bool] = True

    params: OnnxParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        if self.params.max_batch is not None:
            self.max_batch = self.params.max_batch  # type: ignore[misc]
        self.path = Path(model_location(self.params.model, self.params.model_from))
        ins, outs = graph_ports(self.path, read_graph(self.path), self.params.names)
        # Instance attributes shadow the class-level declarations; the graph reads them from the instance.
        self.inputs = ins  # type: ignore[misc]
        self.outputs = outs  # type: ignore[misc]
        graph_name = {port: graph for graph, port in self.params.names.items()}
        self._feed = {port: graph_name.get(port, port) for port in ins}  # port -> graph input name
        self._fetch = [graph_name.get(port, port) for port in outs]  # graph output names, in port order
        self._session: Any = None
        self.weights_hash: str | None = None

    def _providers(self, available: list[str]) -> list[str]:
        wanted = self.params.providers
        if wanted is None:
            return [p for p in (_CUDA, _CPU) if p in available]
        missing = [p for p in wanted if p not in available]
        if missing:
            raise ComponentError(f"node '{self.node}': ONNX Runtime here has no {', '.join(missing)} "
                                 f"(available: {', '.join(available)})")
        return list(wanted)

    def setup(self) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        # Several workers share the machine's cores; ONNX Runtime's default (all cores each) oversubscribes.
        options.intra_op_num_threads = self.params.threads
        options.inter_op_num_threads = 1
        providers = self._providers(list(ort.get_available_providers()))
        try:
            self._session = ort.InferenceSession(str(self.path), sess_options=options, providers=providers)
        except Exception as exc:  # noqa: BLE001 - ORT raises its own Fail/InvalidGraph/...; all mean a bad model
            raise ComponentError(f"node '{self.node}': ONNX model {self.path}: ONNX Runtime cannot load it: "
                                 f"{str(exc).strip()}") from None
        self.device = "cuda" if _CUDA in self._session.get_providers() else "cpu"
        digest = hashlib.sha256()
        with self.path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        self.weights_hash = digest.hexdigest()

    def close(self) -> None:
        self._session = None

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        if self._session is None:
            raise ComponentError(f"node '{self.node}': OnnxModel.process called before setup()")
        feeds = {graph: _to_onnx(batch[port], self.inputs[port]) for port, graph in self._feed.items()}
        results = self._session.run(self._fetch, feeds)
        return {port: _from_onnx(array) for port, array in zip(self.outputs, results, strict=True)}

    def describe(self) -> str:
        parts = [f"model={self.path}"]
        if self.weights_hash:
            parts.append(f"weights=sha256:{self.weights_hash}")
        return f"{super().describe()}({', '.join(parts)})"


def _to_onnx(array: np.ndarray, port: Port) -> np.ndarray:
    """A batch tensor as ONNX Runtime takes it: contiguous; BYTES as str (ONNX strings are text)."""
    if port.datatype == "BYTES":
        return np.vectorize(lambda v: v.decode() if isinstance(v, bytes) else str(v), otypes=[object])(array)
    return np.ascontiguousarray(array)


def _from_onnx(array: np.ndarray) -> np.ndarray:
    """An ONNX Runtime result as a port's array: strings back to bytes (the V2 BYTES representation)."""
    array = np.asarray(array)
    if array.dtype.kind in "OU":
        return np.vectorize(lambda v: v.encode() if isinstance(v, str) else v, otypes=[object])(array)
    return array
