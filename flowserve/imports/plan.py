"""What both repository readers produce, and how it becomes topology YAML: one node per model, checked.

A reader (:mod:`~flowserve.imports.mlserver`, :mod:`~flowserve.imports.triton`) turns each model folder into
a :class:`ModelNode`: the component and params that serve its file, where its inputs come from and which
outputs the original server answered. :func:`probe` builds and sets up the component to learn its ports (the
runtimes read them from the model file), so the outputs can be named as the original server named them;
:func:`finish` writes the topology and loads it back, so a file that is written is one that loads.
Anything that cannot be mapped is an :class:`Unmapped` entry saying why, never an exception.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flowserve.component import Port, load_component_class
from flowserve.errors import ErrorKind, FlowserveError
from flowserve.topology.graph import load_topology_text
from flowserve.topology.spec import RESERVED_IDS

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class RepositoryError(FlowserveError):
    """The directory is not a model repository (no ``model-settings.json``, no ``config.pbtxt``)."""

    kind = ErrorKind.INVALID_SETTINGS


@dataclass(frozen=True)
class Unmapped:
    """Something in the repository the importer could not carry over (or carried over with a difference)."""

    model: str
    what: str
    why: str

    def __str__(self) -> str:
        return f"{self.model}: {self.what}: {self.why}"


#: the node's output ports -> (the topology's output name -> node port), as the original server named them
OutputNamer = Callable[[dict[str, Port]], dict[str, str]]
#: the probed node's output ports -> params to add (e.g. the sklearn methods behind those outputs)
ParamsRefiner = Callable[[dict[str, Port]], dict[str, Any]]


@dataclass
class ModelNode:
    """One model of a repository as one flowserve node."""

    name: str  #: the model's name in its repository (the topology's name, sanitised)
    source: Path  #: the file it was read from (model-settings.json, config.pbtxt, or the model folder)
    server: str  #: "MLServer" or "Triton"
    component: str
    params: dict[str, Any]
    #: node input port -> the tensor name requests carry (the topology's input); empty: each port's own name
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: OutputNamer = field(default=lambda ports: {p: p for p in ports})
    refine: ParamsRefiner | None = None
    replicas: int = 1
    #: what the config declares, to compare with the ports the model file gives: port -> (datatype, shape)
    declared_inputs: dict[str, tuple[str, list[int]]] = field(default_factory=dict)
    declared_outputs: dict[str, tuple[str, list[int]]] = field(default_factory=dict)
    #: filled by probe(): the component's ports, as the model file gives them
    in_ports: dict[str, Port] = field(default_factory=dict)
    out_ports: dict[str, Port] = field(default_factory=dict)


@dataclass
class ImportReport:
    """What ``import_repository`` did: the topologies written, and what it could not map (each with why)."""

    written: dict[str, Path] = field(default_factory=dict)  #: topology name -> YAML file
    unmapped: list[Unmapped] = field(default_factory=list)  #: not imported, or not faithfully
    notes: list[Unmapped] = field(default_factory=list)  #: imported, with a difference worth knowing


def safe_id(text: str, *, node: bool = False) -> str:
    """``text`` as a flowserve id (topology, node, port or tensor name): unsafe characters become ``_``."""
    name = _UNSAFE.sub("_", text)
    if not name or not name[0].isalpha():
        name = "m" + name
    if node and name in RESERVED_IDS:
        name += "_model"
    return name


def probe(model: ModelNode, report: ImportReport) -> bool:
    """Build and set up the model's component to read its ports (its params refined by them); False, with why
    under ``report.unmapped``, if that fails."""
    try:
        cls = load_component_class(model.component)
        component = cls.configure(model.params, node=safe_id(model.name, node=True))
        if model.refine is not None:
            model.params = {**model.params, **model.refine(dict(component.outputs))}
            component = cls.configure(model.params, node=safe_id(model.name, node=True))
        # what a worker does first: a model its library cannot load (or a TorchScript model whose forward
        # takes other argument names) fails here rather than in the worker
        component.setup()
        component.close()
    except FlowserveError as exc:
        report.unmapped.append(Unmapped(model.name, f"{model.component} on {model.source}", str(exc)))
        return False
    model.in_ports, model.out_ports = dict(component.inputs), dict(component.outputs)
    for kind, declared, ports in (("input", model.declared_inputs, model.in_ports),
                                  ("output", model.declared_outputs, model.out_ports)):
        for port, (datatype, shape) in declared.items():
            got = ports.get(port)
            if got is None:
                report.unmapped.append(Unmapped(model.name, f"{kind} '{port}'", f"the config declares it, the model "
                                                f"file has no such {kind} (its {kind}s: {', '.join(ports)})"))
            elif got.datatype != datatype or not _shapes_agree(list(got.shape), shape):
                report.notes.append(Unmapped(model.name, f"{kind} '{port}'", f"the config says {datatype} {shape}, "
                                             f"the model file {got.datatype} {list(got.shape)}: the topology "
                                             "follows the model file"))
    return True


def node_spec(model: ModelNode, inputs: dict[str, str]) -> dict[str, Any]:
    """The YAML of the model's node, its input ports wired to ``inputs`` (port -> reference)."""
    spec: dict[str, Any] = {"component": model.component, "params": model.params, "inputs": inputs}
    if model.replicas > 1:
        spec["replicas"] = model.replicas
    return spec


def single(model: ModelNode) -> dict[str, Any]:
    """The topology serving one model: its requests' tensors in, the outputs the original server answered."""
    node = safe_id(model.name, node=True)
    tensors = model.inputs or {port: port for port in model.in_ports}
    return {
        "name": safe_id(model.name),
        "description": f"imported from {model.server}'s {model.source}",
        "nodes": {node: node_spec(model, {port: f"input.{tensor}" for port, tensor in tensors.items()})},
        "outputs": {name: f"{node}.{port}" for name, port in model.outputs(model.out_ports).items()},
    }


def finish(topology: dict[str, Any], model: str, out: Path, report: ImportReport, *, force: bool) -> None:
    """Write ``topology`` to ``out/<name>.yaml`` once it loads; else say why under ``report.unmapped``."""
    path = out / f"{topology['name']}.yaml"
    if path.exists() and not force:
        report.unmapped.append(Unmapped(model, "topology", f"{path} exists; remove it or pass --force"))
        return
    text = (f"# Written by `flowserve import` from {topology['description'].removeprefix('imported from ')};\n"
            "# model paths are absolute. Edit freely: it is an ordinary topology.\n"
            + yaml.safe_dump(topology, sort_keys=False, width=120))
    try:
        load_topology_text(text, source=str(path))
    except FlowserveError as exc:
        report.unmapped.append(Unmapped(model, "topology", f"does not load: {exc}"))
        return
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    report.written[topology["name"]] = path
    if topology["name"] != model:  # the gateway serves a topology under its name
        report.notes.append(Unmapped(model, "name", f"served as '{topology['name']}' (topology names are ids: "
                                     "letters, digits, '_' and '-', a letter first)"))


def _shapes_agree(port: list[int], declared: list[int]) -> bool:
    return len(port) == len(declared) and all(a == b or -1 in (a, b) for a, b in zip(port, declared, strict=True))
