"""The YAML form of a topology, as pydantic models: every section, ``capture:`` and ``parity:`` included.

The bottom of the topology layer: plain frozen models and the loader, importing nothing of the layer
but the errors. Structural checks only; what a section means for the graph (capture's policy, parity's
model node, fusion) lives in capture.py, parity.py and fuse.py, and graph.py compiles it all.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from flowserve.errors import TopologyError

ID_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]*$"
RESERVED_IDS = frozenset({"input", "inputs", "outputs", "output", "deadletter", "replies"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# -- capture: (flowserve.topology.capture derives the policy in force at each node) --------------------

class NodeCaptureSpec(_Strict):
    """Overrides of the topology-wide capture settings for one node."""

    enabled: bool = True
    sample: float | None = Field(None, ge=0.0, le=1.0)
    lineage: bool | None = None
    tracing: bool | None = None


Redaction = Literal["drop", "hash", "keep"]


class KeySource(_Strict):
    """Where the key of ``redact: hash`` comes from: an environment variable or a file, exactly one.

    The spec names the source, never the key, so a topology file can be shared and logged.
    """

    env: str | None = Field(None, min_length=1)
    file: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one(self) -> KeySource:
        if (self.env is None) == (self.file is None):
            raise ValueError("hash_key takes exactly one of 'env' (a variable's name) or 'file' (a path)")
        return self

    def describe(self) -> str:
        return f"environment variable {self.env}" if self.env is not None else f"file {self.file}"


class CaptureSpec(_Strict):
    """Capture policy of a topology (the ``capture:`` section; see :mod:`flowserve.topology.capture`)."""

    enabled: bool = True
    #: fraction of requests captured; the choice hashes the request id, so a request is kept at every node.
    sample: float = Field(1.0, ge=0.0, le=1.0)
    #: "node.port", "node.*" or "*": ports that get a topic (for sampled requests) even when nothing reads them.
    ports: list[str] = Field(default_factory=list)
    lineage: bool = True
    tracing: bool = True
    #: retention.ms of edge, capture, lineage and drift topics, applied when they are created.
    retention_ms: int | None = Field(None, gt=0)
    #: retention.bytes (per partition) of the same topics, applied when they are created.
    retention_bytes: int | None = Field(None, gt=0)
    #: "node.port" -> drop | hash | keep, for ports capture writes (their own topics), applied before writing.
    redact: dict[str, Redaction] = Field(default_factory=dict)
    #: the key of ``hash`` redactions (HMAC-SHA256): where to read it, never the key itself.
    hash_key: KeySource | None = None
    nodes: dict[str, NodeCaptureSpec] = Field(default_factory=dict)


# -- parity: (flowserve.topology.parity checks it and adds the parity model node) ----------------------

class ParitySpec(_Strict):
    """Coded redundancy for one node (the ``parity:`` section; see :mod:`flowserve.topology.parity`)."""

    k: int = Field(2, le=16)
    #: the parity model's component; default: the protected node's component class.
    component: str | None = None
    #: params of the parity model: laid over the protected node's params (e.g. another weights file), or,
    #: with ``component``, that component's params.
    params: dict[str, Any] = Field(default_factory=dict)
    #: sum: the parity query is the sum of the k inputs (ParM's general encoder). concat: each input, an
    #: image, shrunk by block averaging and tiled into one image of the same size (ParM's image encoder).
    encoder: Literal["sum", "concat"] = "sum"
    #: concat: each row's image as [height, width] (a row holds channels x height x width values, channels
    #: first); default: a square single-channel image (64 values: 8 x 8).
    image: tuple[int, int] | None = None
    #: how long a group waits for its k members; the members themselves are never held.
    wait_ms: float = Field(20.0, gt=0, le=60_000)
    #: how long the decoder keeps a group's outputs waiting for the rest (then they are forgotten).
    hold_ms: float = Field(30_000.0, gt=0, le=3_600_000)
    #: worker processes of the parity model node.
    replicas: int = Field(1, ge=1, le=64)

    @field_validator("k")
    @classmethod
    def _k(cls, k: int) -> int:
        if k < 2:
            raise ValueError(f"k={k}: a parity group needs at least 2 requests (k: 2, 3 or 4); "
                             "to duplicate every request use 'replicas' instead")
        return k


# -- explain: (flowserve.explain composes the chain and computes attributions) ---------------------

class ExplainSpec(_Strict):
    """Attributions of an output to the topology's inputs (the ``explain:`` section; see flowserve.explain).

    On the topology, ``output`` names one of its outputs; on a node, one of the node's output ports.
    """

    #: share of requests explained in the side branch, chosen by a stable hash of the request id (0: on demand only)
    sample: float = Field(0.01, ge=0.0, le=1.0)
    #: auto: integrated gradients where every node of the chain is differentiable, else KernelSHAP
    method: Literal["auto", "integrated_gradients", "kernel_shap"] = "auto"
    #: the explained output (default: the first floating-point one)
    output: str | None = None
    #: integrated gradients' steps along the path from the baseline to the input
    steps: int = Field(64, ge=4, le=4096)
    #: KernelSHAP's perturbed samples per row
    samples: int = Field(200, ge=16, le=100_000)
    #: the baseline input: every element of every attributed input set to this (0: a black image)
    baseline: float = 0.0


# -- nodes and the topology ------------------------------------------------------------------------

class JoinSpec(_Strict):
    """How a node with several input topics (or triggers) waits for them, per request.

    ``deadline`` (an ensemble's join) goes when every input is in, or when ``fraction`` of the request's
    remaining deadline (its ``fs-deadline`` header, from its first arrival here) has passed, with the
    inputs that arrived; a request without a deadline waits ``timeout_ms``. Absent inputs reach the
    component zero-filled and flagged (``Batch.present``); it must declare ``accepts_absent``.
    """

    type: Literal["inner", "outer", "any", "deadline"] = "inner"
    #: inner: give up (error result) after this; outer: go with what arrived after this; deadline: the
    #: longest any request waits, whatever its deadline says.
    window_ms: int = Field(5000, gt=0, le=3_600_000)
    #: deadline only: the share of the request's remaining deadline the join waits for slow inputs.
    fraction: float = Field(0.8, gt=0, le=1)
    #: deadline only: how long a request that carries no deadline waits for slow inputs.
    timeout_ms: int = Field(1000, gt=0, le=3_600_000)


class PortSpec(_Strict):
    datatype: str
    shape: list[int]
    allow_nan: bool = True


class BatchingSpec(_Strict):
    """How a node's worker sizes its batches (see flowserve.runtime.batching)."""

    #: slo: deadline-aware (profiled p99 per batch size, AIMD without a profile); lag: what is queued up to
    #: max_batch; fixed: up to `size` at a time; timeout: wait up to `max_wait_ms` for `size` records.
    policy: Literal["slo", "lag", "fixed", "timeout"] = "slo"
    size: int | None = Field(None, gt=0, le=65536)
    max_wait_ms: float = Field(0.0, ge=0, le=60_000)
    #: slo: time set aside per Kafka hop still ahead of a request.
    hop_ms: float = Field(2.0, ge=0, le=60_000)


class CacheSpec(_Strict):
    """A prediction cache (flowserve.cache): outputs kept by a hash of the inputs and the version.

    On a node: the worker answers a repeated input without ``process``. At the top level: the gateway
    answers a repeated request without a Kafka round trip. Only for outputs that are a function of the
    input tensors (and the component's version), not of headers, time or randomness.
    """

    #: bound on the bytes of cached outputs (and keys); the least recently used entries go first.
    max_mb: float = Field(64.0, gt=0, le=1_048_576)
    #: an entry older than this is a miss (None: kept until evicted or the version changes).
    ttl_s: float | None = Field(None, gt=0)
    #: request headers the outputs depend on (e.g. ``x-user`` for a per-user selector): part of the key.
    vary: list[str] = Field(default_factory=list)

    @field_validator("vary")
    @classmethod
    def _header_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_-]*$", name):
                raise ValueError(f"'{name}' is not a header name")
        return [n.lower() for n in names]  # headers travel lower-cased (HTTP and Kafka alike)


class ModelEntry(_Strict):
    """One model of a many-model node, by name; what is not given comes from the node's ``models:``."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    kind: str | None = None
    size_mb: float | None = Field(None, gt=0)
    load_ms: float | None = Field(None, ge=0)
    latency_ms: dict[int, float] | None = None


class ModelsSpec(_Strict):
    """A many-model node's model set (flowserve.models): ``names:`` lists them, or ``count:`` of them are
    named ``<prefix><i:05d>``; each one's size and batch table come from its ``kind`` (an emulated
    architecture of flowserve.models.catalogue) unless ``size_mb`` and ``latency_ms`` (batch size -> mean
    ms) say, and its load time is its size over ``link`` unless ``load_ms`` says (a real component's load
    reads and deserialises weights: measured, not a copy's bandwidth). ``kind`` reaches the component with
    each model (a real one builds that architecture). A request names its model in the ``fs-model`` header
    (``/v2/models/<model>/infer``)."""

    #: the models, each a name or ``{name, kind, size_mb, latency_ms}``
    names: list[ModelEntry | str] = Field(default_factory=list)
    count: int = Field(0, ge=0, le=100_000)
    prefix: str = Field("m-", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    #: an emulated architecture (resnet50, alexnet, ...) or ``mix`` (the catalogue's mix, model by model)
    kind: str = "mix"
    size_mb: float | None = Field(None, gt=0)
    latency_ms: dict[int, float] | None = None
    #: the mean time of one load, in ms (default: size over ``link``)
    load_ms: float | None = Field(None, ge=0)
    #: device memory for resident models, in MB (default: a tenth of the models' total)
    memory_mb: float | None = Field(None, gt=0)
    #: the host-to-device link a load crosses (flowserve.models.catalogue.BANDWIDTH)
    link: str = "pcie3-x16"
    #: the emulated device whose batch tables are used (flowserve.runtime.hardware)
    hardware: str = "gpu-small"
    #: a request without a deadline must be answered within this
    slo_ms: float = Field(100.0, gt=0)
    #: predicted times are the table's times this (>= 1: a high percentile over the mean)
    margin: float = Field(1.0, ge=1.0)
    max_batch: int = Field(16, ge=1, le=4096)

    @model_validator(mode="after")
    def _some(self) -> ModelsSpec:
        if bool(self.names) == bool(self.count):
            raise ValueError("list the models under 'names' or give their 'count' (one of the two)")
        names = self.model_names()
        if len(set(names)) != len(names):
            raise ValueError(f"model '{next(n for n in names if names.count(n) > 1)}' is listed twice")
        return self

    def entries(self) -> list[ModelEntry]:
        """Every model, in order, as an entry (a bare name: the node's defaults)."""
        if self.names:
            return [ModelEntry(name=m) if isinstance(m, str) else m for m in self.names]
        return [ModelEntry(name=n) for n in self.model_names()]

    def model_names(self) -> list[str]:
        """The models' names, in order."""
        if self.names:
            return [m if isinstance(m, str) else m.name for m in self.names]
        return [f"{self.prefix}{i:05d}" for i in range(self.count)]


class NodeSpec(_Strict):
    component: str
    params: dict[str, Any] = Field(default_factory=dict)
    #: port -> "node.port", "input.name", "other_topology.outputs.name", or a list of alternatives (any-join).
    inputs: dict[str, str | list[str]] = Field(default_factory=dict)
    #: references that gate this node without passing data.
    triggers: list[str] = Field(default_factory=list)
    join: JoinSpec = Field(default_factory=JoinSpec)
    max_batch: int | None = Field(None, gt=0, le=65536)
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    #: worker processes `flowserve run` starts for this node (more = more consumers in the group).
    replicas: int = Field(1, ge=1, le=64)
    #: OS priority of this node's worker processes (an ``os.nice`` increment, 0-19). Default: 0 on the
    #: critical path, 10 for a side branch (a node none of whose outputs reach the topology's outputs).
    nice: int | None = Field(None, ge=0, le=19)
    #: coded redundancy (ParM): a parity model node hides this node's slow or failed workers.
    parity: ParitySpec | None = None
    #: cache this node's outputs by its input tensors and version (``cache: {max_mb: 64, ttl_s: 60}``).
    #: Only for outputs that are a function of the inputs (and of the headers named under ``vary``).
    cache: CacheSpec | None = None
    #: a many-model node (flowserve.models): the models it serves, a bounded set resident at a time.
    models: ModelsSpec | None = None
    #: ``never``: the planner (``flowserve plan``) keeps this node a stage of its own, and a ``fuse:`` chain
    #: may not take it; ``auto`` (the default): the planner fuses it where the simulation says that pays.
    fuse: Literal["auto", "never"] = "auto"
    #: attributions of this node's output to the topology's inputs, in a side branch (flowserve.explain)
    explain: ExplainSpec | None = None

    @field_validator("fuse", mode="before")
    @classmethod
    def _fuse_policy(cls, value: Any) -> Any:
        if value not in ("auto", "never"):
            raise ValueError(f"{value!r} is not a fusion policy: write 'never' (the planner keeps this node a "
                             "stage of its own) or 'auto' (the default: the planner may fuse it)")
        return value


class TopologySpec(_Strict):
    name: str = Field(pattern=ID_PATTERN)
    version: str = "1"
    description: str = ""
    prefix: str = Field("fs", pattern=r"^[A-Za-z0-9_-]+$")
    #: every topic of the topology gets this many partitions, so joins are co-partitioned.
    partitions: int = Field(4, ge=1, le=1024)
    #: default end-to-end deadline of a request; a request may ask for less or more.
    deadline_ms: int = Field(10_000, gt=0)
    max_message_bytes: int = Field(1_048_576, gt=0, le=64 * 1_048_576)
    inputs: dict[str, PortSpec] = Field(default_factory=dict)
    nodes: dict[str, NodeSpec]
    outputs: dict[str, str]
    allow_cycles: bool = False
    max_revisits: int = Field(3, ge=1, le=100)
    #: "module:function" returning sample requests and labels for `flowserve run --sample`.
    sample: str | None = None
    #: capture of intermediate data, lineage and tracing (flowserve.capture); absent = nothing extra written.
    capture: CaptureSpec | None = None
    #: chains of nodes run as one node, in one worker, the edges inside in memory (flowserve.topology.fuse).
    fuse: dict[str, list[str]] = Field(default_factory=dict)
    #: the gateway's response cache for this topology (a repeated request is answered without Kafka).
    cache: CacheSpec | None = None
    #: attributions of an output to the topology's inputs, in a side branch (flowserve.explain)
    explain: ExplainSpec | None = None

    @field_validator("nodes")
    @classmethod
    def _node_ids(cls, nodes: dict[str, NodeSpec]) -> dict[str, NodeSpec]:
        for node_id in nodes:
            if not re.match(ID_PATTERN, node_id):
                raise ValueError(f"node id '{node_id}' must match {ID_PATTERN}")
            if node_id in RESERVED_IDS:
                raise ValueError(f"node id '{node_id}' is reserved; rename the node")
        if not nodes:
            raise ValueError("a topology needs at least one node")
        return nodes

    @field_validator("nodes")
    @classmethod
    def _join_options(cls, nodes: dict[str, NodeSpec]) -> dict[str, NodeSpec]:
        for node_id, node in nodes.items():
            join = node.join
            own = {"fraction", "timeout_ms"} & join.model_fields_set
            if own and join.type != "deadline":
                raise ValueError(f"node '{node_id}': join option(s) {', '.join(sorted(own))} apply to "
                                 f"'type: deadline' only, not '{join.type}'")
            if join.type == "deadline" and node.triggers:
                raise ValueError(f"node '{node_id}': a deadline join waits on data inputs only; move the "
                                 "triggers to another node or use another join type")
        return nodes

    @field_validator("fuse")
    @classmethod
    def _fuse_ids(cls, fuse: dict[str, list[str]]) -> dict[str, list[str]]:
        for name in fuse:
            if not re.match(ID_PATTERN, name) or name in RESERVED_IDS:
                raise ValueError(f"fused node id '{name}' must match {ID_PATTERN} and not be reserved")
        return fuse


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys (plain YAML silently keeps the last one)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key: construct_mapping below reports it as invalid YAML
            continue
        if duplicate:
            raise TopologyError(
                f"duplicate id '{key}' (line {key_node.start_mark.line + 1}, first at line {seen[key]}); "
                "ids must be unique",
                source=str(loader.name),
                node=str(key),
            )
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_spec_text(text: str, source: str = "<string>") -> TopologySpec:
    try:
        loader = _UniqueKeyLoader(text)
        loader.name = source
        try:
            raw = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise TopologyError(f"not valid YAML: {exc}", source=source) from None
    if not isinstance(raw, dict):
        raise TopologyError("a topology file must be a YAML mapping", source=source)
    try:
        return TopologySpec.model_validate(raw)
    except UnicodeEncodeError as exc:
        # YAML decodes each \uD800-style escape on its own, so a surrogate pair written as two escapes
        # (what JSON writers emit for characters past U+FFFF) arrives as two lone surrogates.
        raise TopologyError(f"the document holds text that is not valid Unicode ({exc.reason}: a lone surrogate, "
                            "e.g. a \\ud800 escape); write the character itself", source=source) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(p) for p in first["loc"]]
        node = loc[1] if len(loc) > 1 and loc[0] == "nodes" else None
        where = ".".join(loc)
        raise TopologyError(f"{where}: {first['msg']}", source=source, node=node) from None


def load_spec(path: str | Path) -> TopologySpec:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TopologyError(f"cannot read topology file: {exc.strerror}", source=str(path)) from None
    return load_spec_text(text, source=str(path))
