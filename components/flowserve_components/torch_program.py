"""Serve a PyTorch model as it was shipped: a TorchScript or ``torch.export`` program, or a state dict.

In a topology::

    classify:                               # ports read from a torch.export program (.pt2)
      component: flowserve_components.torch_program:TorchProgram
      params: {model: models/cnn.pt2}
      inputs: {image: input.image}

    classify:                               # a state dict and the code that builds its architecture
      component: flowserve_components.torch_program:TorchStateDict
      params:
        weights: models/cnn.safetensors     # or a torch.save'd state dict, read with weights_only=True
        architecture: mypackage.nets:TinyCNN
        inputs: {image: {datatype: FP32, shape: [-1, 1, 8, 8]}}
        outputs: {logits: {datatype: FP32, shape: [-1, 10]}, probs: {datatype: FP32, shape: [-1, 10]}}
      inputs: {image: input.image}

Ports. A ``torch.export`` program records its inputs' names, dtypes and shapes (``-1`` for the batch and
any other dynamic dimension) and its outputs' dtypes and shapes, so its ports are read from the file;
``outputs`` names them in the order the program returns them (a program returning a dict names them by
its keys; otherwise they are ``output0``, ``output1``, ...). A TorchScript file records only its inputs'
names, and an architecture nothing, so there ``inputs`` and ``outputs`` declare every port's datatype
and shape. Whatever ``inputs``/``outputs`` declare is checked against what the file records.

Loading is safe: TorchScript and ``torch.export`` archives hold code as TorchScript or a graph, read by
torch's own restricted loaders; a state dict is read with safetensors or ``torch.load(weights_only=True)``.
A pickle, or a ``torch.save`` of a whole module, is refused with the reason. A ``torch.export`` program is
read when the topology loads (its ports); every model is loaded in ``setup`` and run once on a row of
zeros shaped as declared, so a wrong input name, a dtype the model does not take, an output count or
dtype other than declared fail there, naming the file, before any request.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from flowserve.component import Batch, Component, Port, pick_device, torch_threads
from flowserve.errors import ComponentError
from flowserve.wire.tensors import DATATYPES
from flowserve_components.model_files import (
    ModelFile,
    check_port_name,
    entry_point,
    is_safetensors,
    is_torch_save,
    require,
)

if TYPE_CHECKING:
    import torch

#: torch dtype name -> V2 datatype; a dtype absent here (bfloat16, complex) cannot be a port.
TORCH_DATATYPES: dict[str, str] = {
    "float32": "FP32", "float64": "FP64", "float16": "FP16", "int64": "INT64", "int32": "INT32",
    "int16": "INT16", "int8": "INT8", "uint8": "UINT8", "bool": "BOOL",
}
_RESAVE = ("save the model with torch.export.save (or torch.jit.save), or save its state_dict() and serve it "
           "with TorchStateDict")


class PortParam(BaseModel):
    """A port as params declare it; what the model file records fills in (and must agree with) the rest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    datatype: str | None = Field(None, description="V2 datatype (FP32, INT64, ...)")
    shape: list[int] | None = Field(None, description="shape, -1 for the batch and other variable dimensions")


class TorchParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    inputs: dict[str, PortParam] = Field(default_factory=dict, description="input ports by forward's argument "
                                         "names")
    outputs: dict[str, PortParam] = Field(default_factory=dict, description="output ports, in the order the "
                                          "model returns them (or by the keys of the dict it returns)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when torch sees a GPU")
    threads: int = Field(1, ge=1, le=256, description="torch intra-op threads per worker (CPU)")
    max_batch: int | None = Field(None, gt=0, le=65536, description="largest batch in requests")


class TorchProgramParams(TorchParams):
    model: str = Field(description="a TorchScript (torch.jit.save) or torch.export (torch.export.save) file")


class TorchStateDictParams(TorchParams):
    weights: str = Field(description="state dict: a .safetensors file, or torch.save(model.state_dict())")
    architecture: str = Field(description="'module:callable' that builds the torch.nn.Module the weights fit")
    arguments: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for 'architecture'")
    strict: bool = Field(True, description="every weight must match a parameter of the architecture, and back")


def _declared(file: ModelFile, kind: str, ports: Mapping[str, PortParam]) -> dict[str, Port]:
    """Ports that params declare in full (what TorchScript and architectures need: their files say nothing)."""
    out: dict[str, Port] = {}
    for name, spec in ports.items():
        check_port_name(file, kind, name)
        if spec.datatype is None or spec.shape is None:
            raise file.fail(f"{kind} '{name}' needs a datatype and a shape under '{kind}s' (this format does "
                            "not record them)")
        out[name] = _port(file, kind, name, spec.datatype, spec.shape)
    if not out:
        raise file.fail(f"declare the model's {kind}s under '{kind}s' (name: {{datatype: FP32, shape: [-1, ...]}})")
    return out


def _port(file: ModelFile, kind: str, name: str, datatype: str, shape: list[int]) -> Port:
    if datatype not in DATATYPES or datatype == "BYTES":
        raise file.fail(f"{kind} '{name}': datatype {datatype} is not a tensor torch can hold")
    if not shape or shape[0] != -1:
        raise file.fail(f"{kind} '{name}' has shape {shape}: its first dimension must be -1 (the batch)")
    return Port(datatype, shape)


def _read_program_ports(file: ModelFile, program: Any, declared_in: Mapping[str, PortParam],
                        declared_out: Mapping[str, PortParam]) -> tuple[dict[str, Port], dict[str, Port]]:
    """Ports of a ``torch.export`` program from its graph signature and the tensors' recorded metadata."""
    nodes = {node.name: node for node in program.graph.nodes}
    signature = program.graph_signature
    ins: dict[str, Port] = {}
    for name in signature.user_inputs:
        ins[check_port_name(file, "input", name)] = _recorded(file, "input", name, nodes[name], declared_in.get(name),
                                                              program.range_constraints)
    unknown = set(declared_in) - set(ins)
    if unknown:
        raise file.fail(f"'inputs' declares {', '.join(sorted(unknown))}, but the program takes "
                        f"{', '.join(ins) or 'no tensors'}")
    out_spec = program.call_spec.out_spec
    count = len(signature.user_outputs)
    if out_spec is not None and out_spec.type is dict:
        names = [str(key) for key in out_spec.context]
        if declared_out and list(declared_out) != names:
            raise file.fail(f"the program returns a dict of {', '.join(names)}, but 'outputs' declares "
                            f"{', '.join(declared_out)}")
    elif declared_out:
        names = list(declared_out)
        if len(names) != count:
            raise file.fail(f"the program returns {count} tensor(s), but 'outputs' declares {len(names)}: "
                            f"{', '.join(names)}")
    else:
        names = [f"output{i}" for i in range(count)]
    outs = {check_port_name(file, "output", port): _recorded(file, "output", port, nodes[node], declared_out.get(port))
            for port, node in zip(names, signature.user_outputs, strict=True)}
    return ins, outs


def _recorded(file: ModelFile, kind: str, name: str, node: Any, declared: PortParam | None,
              ranges: Mapping[Any, Any] | None = None) -> Port:
    """The port a program's tensor makes (dtype from its metadata, -1 for dynamic dims), checked against params."""
    value = node.meta.get("val")
    if value is None or not hasattr(value, "dtype"):
        raise file.fail(f"{kind} '{name}' is not a tensor ({type(value).__name__}); only tensors can be ports")
    datatype = TORCH_DATATYPES.get(str(value.dtype).removeprefix("torch."))
    if datatype is None:
        raise file.fail(f"{kind} '{name}' holds {value.dtype}, which has no V2 datatype")
    shape = [d if isinstance(d, int) else -1 for d in value.shape]
    if not shape or shape[0] != -1:
        raise file.fail(f"{kind} '{name}' has shape {shape}: no batch dimension (its first dimension must be "
                        f"dynamic); export with dynamic_shapes={{'{name}': {{0: torch.export.Dim('batch')}}}}")
    if ranges is not None:
        lower = getattr(ranges.get(value.shape[0].node.expr), "lower", 0)
        if int(lower) > 1:
            raise file.fail(f"{kind} '{name}': the program's batch dimension takes sizes from {lower} up, so a "
                            "single request could not run; export with Dim('batch', min=1)")
    if declared is not None:
        if declared.datatype is not None and declared.datatype != datatype:
            raise file.fail(f"{kind} '{name}' is {datatype} in the program, but params declare {declared.datatype}")
        if declared.shape is not None and Port(datatype, declared.shape).compatible(Port(datatype, shape)):
            raise file.fail(f"{kind} '{name}' has shape {shape} in the program, but params declare "
                            f"{declared.shape}")
    return Port(datatype, shape)


class _TorchRuntime(Component):
    """Runs a loaded torch model on each batch: inputs by name, outputs flattened in declared order."""

    max_batch: ClassVar[int] = 256
    #: torch releases the GIL while it computes, so the worker can fetch the next batch meanwhile.
    offload: ClassVar[bool] = True

    params: TorchParams
    file: ModelFile

    def _init_common(self) -> None:
        if self.params.max_batch is not None:
            self.max_batch = self.params.max_batch  # type: ignore[misc]
        self._model: Any = None
        self._by_keyword = True  # TorchScript and modules take inputs by name; export programs by position
        self.weights_hash: str | None = None

    def _load(self, device: str) -> Any:
        raise NotImplementedError

    def _parameter_names(self, model: Any) -> tuple[list[str], set[str]]:
        """forward's input names in order, and those of them without a default (which must be fed)."""
        raise NotImplementedError

    def setup(self) -> None:
        import torch

        self.device = pick_device() if self.params.device == "auto" else self.params.device
        if self.device == "cpu":
            torch.set_num_threads(self.params.threads)
        model = self._load(self.device)
        names, required = self._parameter_names(model)
        declared = set(self.inputs)
        if not required <= declared or not declared <= set(names):
            raise self.file.fail(f"forward takes ({', '.join(names)}), but 'inputs' declares "
                                 f"{', '.join(self.inputs)}; name the inputs after forward's arguments")
        self._order = [n for n in names if n in declared]
        self._model = model
        self._probe()
        self.weights_hash = self.file.sha256()

    def _probe(self) -> None:
        """Run one row of zeros shaped as declared, so a model that cannot take its ports fails now."""
        rows = {name: np.zeros([1 if d == -1 else d for d in port.shape], DATATYPES[port.datatype])
                for name, port in self.inputs.items()}
        described = ", ".join(f"{n} {p.datatype} {[1, *list(p.shape[1:])]}" for n, p in self.inputs.items())
        try:
            outputs = self._run(rows)
        except ComponentError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the model raises means it cannot take these inputs
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise self.file.fail(f"a probe with one row of zeros as declared ({described}) failed: {first}; "
                                 "check the datatypes and shapes under 'inputs'") from None
        for name, array in outputs.items():
            port = self.outputs[name]
            if array.dtype != DATATYPES[port.datatype]:
                raise self.file.fail(f"output '{name}' is {array.dtype.name}, but 'outputs' declares {port.datatype}")
            problem = Port(port.datatype, list(array.shape)).compatible(port)
            if problem:
                raise self.file.fail(f"output '{name}' of one row has shape {list(array.shape)}, but 'outputs' "
                                     f"declares {list(port.shape)}")

    def _run(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        tensors = {n: torch.from_numpy(_writable(arrays[n])).to(self.device) for n in self._order}
        with torch.inference_mode():
            args = () if self._by_keyword else tuple(tensors[n] for n in self._order)
            result = self._model(*args, **(tensors if self._by_keyword else {}))
        return self._flatten(result)

    def _flatten(self, result: Any) -> dict[str, np.ndarray]:
        import torch

        names = list(self.outputs)
        if isinstance(result, torch.Tensor):
            values = [result]
        elif isinstance(result, tuple | list):
            values = list(result)
        elif isinstance(result, Mapping):
            missing = [n for n in names if n not in result]
            if missing:
                raise self.file.fail(f"the model returned a dict of {', '.join(map(str, result))}, without "
                                     f"{', '.join(missing)} that 'outputs' declares")
            values = [result[n] for n in names]
        else:
            raise self.file.fail(f"the model returned a {type(result).__name__}; serve models that return "
                                 "tensors (one, a tuple, or a dict of them)")
        if len(values) != len(names):
            raise self.file.fail(f"the model returned {len(values)} tensor(s), but 'outputs' declares "
                                 f"{len(names)}: {', '.join(names)}")
        return {name: value.detach().cpu().numpy() for name, value in zip(names, values, strict=True)}

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        if self._model is None:
            raise ComponentError(f"node '{self.node}': {type(self).__name__}.process called before setup()")
        if self.device == "cpu":
            torch_threads(self.params.threads)  # in this thread: setup() ran in another
        return self._run(batch)

    def close(self) -> None:
        self._model = None

    def describe(self) -> str:
        parts = [f"model={self.file.path}"]
        if self.weights_hash:
            parts.append(f"weights=sha256:{self.weights_hash}")
        return f"{super().describe()}({', '.join(parts)})"


class TorchProgram(_TorchRuntime):
    """A TorchScript or ``torch.export`` program; a program's ports are read from the file."""

    Params: ClassVar[type[BaseModel]] = TorchProgramParams
    params: TorchProgramParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        self._init_common()
        self.file = ModelFile(self.params.model, "torch model")
        self.file.head(_RESAVE)
        names = self.file.zip_names()
        if "constants.pkl" in names and any(n.startswith("code/") for n in names):
            self.format = "torchscript"
            self.inputs = _declared(self.file, "input", self.params.inputs)  # type: ignore[misc]
            self.outputs = _declared(self.file, "output", self.params.outputs)  # type: ignore[misc]
        elif "archive_format" in names or "serialized_exported_program.json" in names:
            self.format = "export"
            self._by_keyword = False
            ins, outs = _read_program_ports(self.file, self._read_export("cpu"), self.params.inputs,
                                            self.params.outputs)
            self.inputs, self.outputs = ins, outs  # type: ignore[misc]
        elif is_torch_save(names):
            raise self.file.fail(f"is a torch.save archive (a pickle), not a TorchScript or torch.export program; "
                                 f"loading it would run the code it names, so it is refused: {_RESAVE}")
        else:
            raise self.file.fail("is neither a TorchScript nor a torch.export archive")

    def _read_export(self, device: str) -> Any:
        import torch

        try:
            return torch.export.load(str(self.file.path))
        except Exception as exc:  # noqa: BLE001 - torch raises many kinds; all mean the file cannot be read
            raise self.file.fail(f"torch.export.load cannot read it ({type(exc).__name__}: {exc})") from None

    def _load(self, device: str) -> Any:
        import torch

        if self.format == "export":
            return self._read_export(device).module().to(device)
        try:
            with warnings.catch_warnings():  # TorchScript is deprecated upstream but still how many ship models
                warnings.simplefilter("ignore", FutureWarning)
                return torch.jit.load(str(self.file.path), map_location=device).eval()
        except Exception as exc:  # noqa: BLE001 - as above
            raise self.file.fail(f"torch.jit.load cannot read it ({type(exc).__name__}: {exc})") from None

    def _parameter_names(self, model: Any) -> tuple[list[str], set[str]]:
        if self.format == "export":
            return list(self.inputs), set(self.inputs)
        arguments = model.forward.schema.arguments[1:]  # the first is self
        return [a.name for a in arguments], {a.name for a in arguments if not a.has_default_value()}


class TorchStateDict(_TorchRuntime):
    """A state dict (safetensors, or ``torch.save`` of tensors) loaded into an architecture built by code."""

    Params: ClassVar[type[BaseModel]] = TorchStateDictParams
    params: TorchStateDictParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        self._init_common()
        self.file = ModelFile(self.params.weights, "state dict")
        head = self.file.head("save model.state_dict() with safetensors or torch.save")
        self._safetensors = is_safetensors(head)
        if not self._safetensors and not is_torch_save(self.file.zip_names()):
            raise self.file.fail("is neither safetensors nor a torch.save archive of a state dict")
        self._build = entry_point(self.params.architecture, "architecture")
        self.inputs = _declared(self.file, "input", self.params.inputs)  # type: ignore[misc]
        self.outputs = _declared(self.file, "output", self.params.outputs)  # type: ignore[misc]

    def _state(self) -> dict[str, torch.Tensor]:
        import torch

        try:
            if self._safetensors:
                safetensors_torch = require("safetensors.torch", "safetensors")
                return dict(safetensors_torch.load_file(str(self.file.path), device="cpu"))
            state = torch.load(str(self.file.path), map_location="cpu", weights_only=True)
        except ComponentError:
            raise
        except Exception as exc:  # noqa: BLE001 - weights_only refusing a pickled object lands here, with why
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise self.file.fail(f"holds more than plain tensors, so it is refused (torch.load with "
                                 f"weights_only=True: {why}); save model.state_dict(), not the model") from None
        if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise self.file.fail(f"holds a {type(state).__name__}, not a state dict (names -> tensors)")
        return dict(state)

    def _load(self, device: str) -> Any:
        import torch

        try:
            model = self._build(**self.params.arguments)
        except Exception as exc:  # noqa: BLE001 - user code: report what it raised
            raise ComponentError(f"node '{self.node}': architecture '{self.params.architecture}' failed: "
                                 f"{type(exc).__name__}: {exc}") from None
        if not isinstance(model, torch.nn.Module):
            raise ComponentError(f"node '{self.node}': architecture '{self.params.architecture}' returned a "
                                 f"{type(model).__name__}, not a torch.nn.Module")
        try:
            missing, unexpected = model.load_state_dict(self._state(), strict=False)
        except RuntimeError as exc:  # a tensor whose shape differs from the parameter's
            raise self.file.fail(f"does not fit '{self.params.architecture}': {str(exc).strip()}") from None
        if self.params.strict and (missing or unexpected):
            raise self.file.fail(f"does not fit '{self.params.architecture}': parameters without weights: "
                                 f"{', '.join(missing[:5]) or 'none'}; weights without parameters: "
                                 f"{', '.join(unexpected[:5]) or 'none'} (strict: false loads what matches)")
        return model.to(device).eval()

    def _parameter_names(self, model: Any) -> tuple[list[str], set[str]]:
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        parameters = [p for p in inspect.signature(model.forward).parameters.values() if p.kind in kinds]
        return [p.name for p in parameters], {p.name for p in parameters if p.default is inspect.Parameter.empty}

    def describe(self) -> str:
        return super().describe().replace("(model=", f"(architecture={self.params.architecture}, model=", 1)


def _writable(array: np.ndarray) -> np.ndarray:
    # Arrays decoded from the wire are read-only views; torch wants memory it may write.
    array = np.ascontiguousarray(array)
    return array if array.flags.writeable else array.copy()

