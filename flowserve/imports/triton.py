"""Read a Triton model repository: each folder with a ``config.pbtxt`` (or an ONNX file in a version folder).

``platform``/``backend`` picks the runtime: ``onnxruntime_onnx`` (``onnxruntime``) → ``OnnxModel``,
``pytorch_libtorch`` (``pytorch``) → ``TorchProgram`` with the config's inputs and outputs as its ports
(a TorchScript file records no types or shapes). The served version is the newest numbered folder (or the
newest ``version_policy: specific`` lists). An ``ensemble`` becomes one topology: each step a node, wired as
its ``input_map``/``output_map`` say. A ``python`` backend runs ``model.py``, which flowserve does not run;
other backends (TensorRT, TensorFlow, OpenVINO, FIL, DALI) have no runtime here: both are reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flowserve.imports.pbtxt import Message, PbtxtError, many, one, parse
from flowserve.imports.plan import ImportReport, ModelNode, Unmapped, node_spec, safe_id

CONFIG = "config.pbtxt"
#: platform or backend -> runtime
RUNTIMES = {"onnxruntime_onnx": "onnx", "onnxruntime": "onnx", "pytorch_libtorch": "torchscript",
            "pytorch": "torchscript", "ensemble": "ensemble"}
DEFAULT_FILES = {"onnx": "model.onnx", "torchscript": "model.pt"}
COMPONENTS = {"onnx": "flowserve_components.onnx:OnnxModel",
              "torchscript": "flowserve_components.torch_program:TorchProgram"}
REFUSED = {
    "python": "a Python backend runs model.py, code flowserve does not run; write its execute() as a flowserve "
              "component (a Component with a process method)",
    "tensorrt_plan": "a TensorRT engine is built for one GPU and TensorRT version; serve the ONNX it was built "
                     "from (OnnxModel picks CUDA where present)",
    "tensorrt": "a TensorRT engine is built for one GPU and TensorRT version; serve the ONNX it was built from",
}
#: Triton data_type -> V2 datatype (TYPE_BF16 has no V2 datatype in flowserve's wire format)
DATATYPES = {f"TYPE_{t}": t for t in ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                                       "INT64", "FP16", "FP32", "FP64")} | {"TYPE_STRING": "BYTES"}


def find(root: Path) -> list[Path]:
    """Model folders: those holding a config.pbtxt, and those with only a version folder holding model.onnx
    (or ``root`` itself, when it holds a config.pbtxt)."""
    if (root / CONFIG).is_file():  # the folder of one model
        return [root]
    folders = [] if not root.is_dir() else sorted(p for p in root.iterdir() if p.is_dir())
    return [f for f in folders if (f / CONFIG).is_file() or any((v / "model.onnx").is_file() for v in _versions(f))]


def read_config(folder: Path, report: ImportReport) -> Message | None:
    path = folder / CONFIG
    if not path.is_file():  # Triton completes an ONNX model's config from the file
        report.notes.append(Unmapped(folder.name, CONFIG, "none: read as an ONNX model, its ports from the file"))
        return {"platform": ["onnxruntime_onnx"]}
    try:
        return parse(path.read_text(), str(path))
    except (OSError, PbtxtError) as exc:
        report.unmapped.append(Unmapped(folder.name, str(path), f"cannot be read ({exc})"))
        return None


def read(folder: Path, config: Message, report: ImportReport) -> ModelNode | None:
    """The node serving one (non-ensemble) model, or None with why under ``report.unmapped``."""
    try:
        return _read(folder, config, report)
    except (TypeError, ValueError) as exc:  # int() of a string, a message where a number belongs
        report.unmapped.append(Unmapped(folder.name, str(folder / CONFIG), f"a field holds the wrong kind of "
                                        f"value ({exc})"))
        return None


def _read(folder: Path, config: Message, report: ImportReport) -> ModelNode | None:
    name = folder.name
    kind = str(one(config, "platform") or one(config, "backend") or "")
    runtime = RUNTIMES.get(kind)
    if runtime is None or runtime == "ensemble":
        why = REFUSED.get(kind, f"no flowserve runtime serves the '{kind or '(none)'}' platform; export the model "
                                "to ONNX and serve it with OnnxModel")
        report.unmapped.append(Unmapped(name, f"platform/backend '{kind}'", why))
        return None
    version = _version(folder, config, report)
    if version is None:
        return None
    model_file = version / str(one(config, "default_model_filename") or DEFAULT_FILES[runtime])
    if not model_file.exists():
        report.unmapped.append(Unmapped(name, str(model_file), "no such file"))
        return None
    batched = int(one(config, "max_batch_size", 0)) > 0
    declared_in = _tensors(name, many(config, "input"), batched, report)
    declared_out = _tensors(name, many(config, "output"), batched, report)
    if declared_in is None or declared_out is None:
        return None
    if not batched and one(config, "max_batch_size") is not None:
        report.notes.append(Unmapped(name, "max_batch_size 0", "Triton passes each request whole; flowserve "
                                     "batches requests along the first dimension, so that must be the batch"))
    renames = {raw: port for raw, (port, _, _) in {**declared_in, **declared_out}.items() if raw != port}
    params: dict[str, Any] = {"model": str(model_file.resolve())}
    if runtime == "onnx" and renames:
        params["names"] = renames
    if runtime == "torchscript":
        positional = [raw for raw in declared_in if re.search(r"__\d+$", raw)]
        if positional:
            report.notes.append(Unmapped(name, f"input(s) {', '.join(positional)}", "Triton's NAME__<i> naming "
                                         "passes inputs by position; TorchProgram passes them by forward's argument "
                                         "names: rename them in config.pbtxt (or in the topology)"))
        params["inputs"] = {port: {"datatype": d, "shape": s} for port, d, s in declared_in.values()}
        params["outputs"] = {port: {"datatype": d, "shape": s} for port, d, s in declared_out.values()}
    node = ModelNode(name=name, source=folder / CONFIG, server="Triton", component=COMPONENTS[runtime],
                     params=params, replicas=_replicas(config),
                     declared_inputs={port: (d, s) for port, d, s in declared_in.values()},
                     declared_outputs={port: (d, s) for port, d, s in declared_out.values()})
    if declared_out:  # Triton answers the outputs its config lists
        listed = [port for port, _, _ in declared_out.values()]
        node.outputs = lambda ports: {p: p for p in listed if p in ports}
    return node


def ensemble(folder: Path, config: Message, models: dict[str, ModelNode], report: ImportReport
             ) -> dict[str, Any] | None:
    """The topology of an ensemble: one node per step, wired by the steps' input and output maps."""
    name = folder.name
    scheduling = one(config, "ensemble_scheduling") or {}
    steps = many(scheduling, "step")
    if not steps:
        report.unmapped.append(Unmapped(name, "ensemble_scheduling", "no steps"))
        return None
    sources = {str(one(t, "name")): f"input.{safe_id(str(one(t, 'name')))}" for t in many(config, "input")}
    nodes: dict[str, dict[str, Any]] = {}
    pending = list(enumerate(steps))
    while pending:  # Triton lets steps come in any order: place each once its inputs are produced
        ready = [(i, s) for i, s in pending if all(str(v) in sources for v in _map(s, "input_map").values())]
        if not ready:
            i, step = pending[0]
            missing = [v for v in _map(step, "input_map").values() if v not in sources]
            report.unmapped.append(Unmapped(name, f"step {i} ({one(step, 'model_name')})", f"its input(s) "
                                            f"{', '.join(missing)} come from no ensemble input and no step"))
            return None
        for i, step in ready:
            pending.remove((i, step))
            model = models.get(str(one(step, "model_name")))
            if model is None:
                report.unmapped.append(Unmapped(name, f"step {i}", f"model '{one(step, 'model_name')}' is not in "
                                                "the repository, or could not be mapped (see its own line)"))
                return None
            node_id = safe_id(model.name, node=True)
            while node_id in nodes:
                node_id += "_2"
            wiring = {safe_id(k): sources[v] for k, v in _map(step, "input_map").items()}
            nodes[node_id] = node_spec(model, wiring)
            for output, tensor in _map(step, "output_map").items():
                sources[tensor] = f"{node_id}.{safe_id(output)}"
    outputs = {}
    for tensor in (str(one(t, "name")) for t in many(config, "output")):
        if tensor not in sources:
            report.unmapped.append(Unmapped(name, f"output '{tensor}'", "no step's output_map produces it"))
            return None
        outputs[safe_id(tensor)] = sources[tensor]
    return {"name": safe_id(name), "description": f"imported from Triton's {folder / CONFIG} (an ensemble)",
            "nodes": nodes, "outputs": outputs}


def iterate(root: Path, report: ImportReport) -> Iterator[tuple[Path, Message]]:
    for folder in find(root):
        config = read_config(folder, report)
        if config is not None:
            yield folder, config


def is_ensemble(config: Message) -> bool:
    return one(config, "platform") == "ensemble"


def _map(step: Message, field: str) -> dict[str, str]:
    """A step's input_map/output_map (a protobuf map: repeated {key, value} entries) as a dict."""
    return {str(one(e, "key")): str(one(e, "value")) for e in many(step, field)}


def _versions(folder: Path) -> list[Path]:
    return sorted((p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def _version(folder: Path, config: Message, report: ImportReport) -> Path | None:
    versions = _versions(folder)
    policy = one(config, "version_policy") or {}
    wanted = [int(v) for v in many(one(policy, "specific") or {}, "versions")]
    if wanted:
        versions = [v for v in versions if int(v.name) in wanted]
    if not versions:
        report.unmapped.append(Unmapped(folder.name, "versions", "no numbered version folder holds the model"
                                        + (f" (version_policy lists {wanted})" if wanted else "")))
        return None
    if "all" in policy or len(wanted) > 1 or int(one(one(policy, "latest") or {}, "num_versions", 1)) > 1:
        report.notes.append(Unmapped(folder.name, "version_policy", f"Triton serves several versions; the "
                                     f"topology serves the newest, {versions[-1].name}"))
    return versions[-1]


def _tensors(model: str, tensors: list[Message], batched: bool, report: ImportReport
             ) -> dict[str, tuple[str, str, list[int]]] | None:
    """Config tensors: their name -> (port name, V2 datatype, shape with -1 for the batch)."""
    out: dict[str, tuple[str, str, list[int]]] = {}
    for tensor in tensors:
        raw, data_type = str(one(tensor, "name")), str(one(tensor, "data_type"))
        datatype = DATATYPES.get(data_type)
        if datatype is None:
            report.unmapped.append(Unmapped(model, f"tensor '{raw}'", f"{data_type} has no V2 datatype here"))
            return None
        dims = [int(d) for d in many(one(tensor, "reshape") or tensor, "dims")]
        if one(tensor, "reshape") is not None:
            report.notes.append(Unmapped(model, f"tensor '{raw}'", "reshape: the port takes the model's shape"))
        out[raw] = (safe_id(raw), datatype, ([-1] if batched else []) + dims)
        if out[raw][0] != raw:
            report.notes.append(Unmapped(model, f"tensor '{raw}'", f"requests name it '{out[raw][0]}' (a port name)"))
    return out


def _replicas(config: Message) -> int:
    """Triton's instance count (summed over instance groups) as worker replicas."""
    counts = [int(one(g, "count", 1)) for g in many(config, "instance_group")]
    return max(1, min(64, sum(counts))) if counts else 1
