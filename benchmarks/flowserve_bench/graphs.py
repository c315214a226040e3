"""The workloads' topologies, loaded from files: the bench's own in ``flowserve_bench/topologies/`` (shipped
with the distribution), the examples a workload runs as they are in the checkout's ``topologies/``.

A workload deploys each topology under a fresh name (fresh topics and consumer groups) and with the
figures it varies (replicas, batching, a join), so :func:`text` reads a file and sets those keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from flowserve.topology import Topology, load_topology_text

#: the bench's own topologies
BENCH = resources.files("flowserve_bench") / "topologies"
#: the example topologies of a flowserve checkout (the tuner's emulated pipelines)
EXAMPLES = Path(__file__).resolve().parents[2] / "topologies"

#: ``text(..., changes={"nodes.stall": DROP})`` removes the key
DROP = object()


def document(file: str) -> dict[str, Any]:
    """The bench topology ``file`` (in ``flowserve_bench/topologies/``) as a YAML document."""
    doc: dict[str, Any] = yaml.safe_load(BENCH.joinpath(file).read_text())
    return doc


def text(file: str | Path, name: str | None = None, changes: Mapping[str, Any] | None = None) -> str:
    """The topology ``file`` (a name in ``flowserve_bench/topologies/``, or a path) as YAML, named ``name``,
    with each dotted key of ``changes`` (``"nodes.model.replicas"``) set to its value, or removed where the
    value is :data:`DROP`."""
    doc = yaml.safe_load(file.read_text()) if isinstance(file, Path) else document(file)
    if name is not None:
        doc["name"] = name
    for key, value in (changes or {}).items():
        *parents, last = key.split(".")
        at = doc
        for part in parents:
            at = at.setdefault(part, {})
        if value is DROP:
            at.pop(last, None)
        else:
            at[last] = value
    return yaml.safe_dump(doc, sort_keys=False)


def load(file: str, name: str | None = None, changes: Mapping[str, Any] | None = None) -> Topology:
    """:func:`text`, loaded as a topology."""
    return load_topology_text(text(file, name, changes), source=f"flowserve_bench/topologies/{file}")
