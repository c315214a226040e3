"""Operator fusion: a linear chain of nodes runs in one worker, the edges inside it in memory.

Every edge of a topology is a Kafka topic by default: each stage scales on its own and its data is
observable. For a chain of cheap stages on one machine that costs a produce, a fetch and a commit per
hop for microseconds of work. ``fuse:`` names chains to run as one node (Flink's operator chaining, a
Kafka Streams sub-topology)::

    fuse:
      classify: [pre, model, post]   # one worker, one consumer group, topics only around the chain

The chain keeps every contract of its members: ports are checked as without fusion (at load time, and
between members as a worker checks the records it reads), an item a member fails becomes an error result
naming that member, an item a member routes away (a ``Result`` mask) stops there, and the fused node's
lineage describes every member. What it gives up: the members scale together, and the data between them
is not on Kafka. Where capture is on for the chain, it *taps* its inner edges: the chain also returns each
inner edge's tensors as an output port ``<member>.<port>``, which capture writes for the sampled requests
to a side topic ``<base>.<chain>.<member>.<port>`` (as it writes any port nobody reads). A node that says
``fuse: never`` is never a member (``flowserve plan`` chooses fusion on its own, and respects it too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from flowserve.component import Batch, Component, Result, load_component_class, read_result
from flowserve.errors import ComponentError, TopologyError, WireError
from flowserve.topology.capture import node_policy
from flowserve.topology.node import Node, Source
from flowserve.topology.spec import BatchingSpec, CacheSpec, NodeSpec, TopologySpec

CHAIN = "flowserve.topology.fuse:Chain"


class ChainStep(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    component: str
    params: dict[str, Any] = Field(default_factory=dict)
    #: this step's input port -> the previous step's output port (empty for the first step).
    wiring: dict[str, str] = Field(default_factory=dict)


class ChainParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: list[ChainStep] = Field(min_length=2)
    #: member -> its output ports also returned as the chain's port ``<member>.<port>`` (capture's taps of
    #: the inner edges: the rows that reached the member, masked where they did not).
    taps: dict[str, list[str]] = Field(default_factory=dict)


class Chain(Component):
    """The members of a fused chain, run one after the other on the same batch."""

    Params = ChainParams
    params: ChainParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        self.steps: list[tuple[ChainStep, Component]] = [
            (s, load_component_class(s.component).configure(s.params, node=s.id)) for s in self.params.steps
        ]
        members = [c for _, c in self.steps]
        self.inputs = dict(members[0].inputs)  # type: ignore[misc]
        self.outputs = dict(members[-1].outputs)  # type: ignore[misc]
        by_id = {s.id: c for s, c in self.steps[:-1]}
        for member, ports in self.params.taps.items():
            if member not in by_id or any(p not in by_id[member].outputs for p in ports):
                raise ComponentError(f"node '{node}': taps name '{member}' ports {', '.join(ports)}: a tap is an "
                                     f"output port of a member before the last ({', '.join(by_id)})")
            self.outputs.update({f"{member}.{p}": by_id[member].outputs[p] for p in ports})
        self.max_batch = min(c.max_batch for c in members)  # type: ignore[misc]
        self.offload = any(c.offload for c in members)  # type: ignore[misc]
        self._gather_hashes()

    @property
    def members(self) -> list[str]:
        return [s.id for s, _ in self.steps]

    def prepare(self) -> None:
        for _, c in self.steps:
            c.prepare()

    def setup(self) -> None:
        for _, c in self.steps:
            c.setup()
        # The chain runs where its device-bound member runs (one batch in flight per GPU).
        self.device = next((c.device for _, c in self.steps if c.device != "cpu"), "cpu")
        self._gather_hashes()  # members that load weights in setup know their hash only now

    def _gather_hashes(self) -> None:
        self.weights_hash = ",".join(c.weights_hash for _, c in self.steps if c.weights_hash) or None

    def close(self) -> None:
        for _, c in reversed(self.steps):
            c.close()

    def describe(self) -> str:
        inner = "; ".join(f"{s.id}={c.describe()}" for s, c in self.steps)
        return f"{super().describe()}[{inner}]"

    def process(self, batch: Batch) -> Mapping[str, np.ndarray] | Result:
        # As in Result, masks and error keys index rows; a request (of ``sizes[i]`` rows) fails when any of
        # its rows fails. ``origin`` maps each row still in the chain to its row in ``batch``.
        origin = np.arange(batch.rows)
        errors: dict[int, str] = {}
        current = batch
        outputs: dict[str, np.ndarray] = {}
        mask: dict[str, np.ndarray] = {}
        last = len(self.steps) - 1
        tapped: list[tuple[str, np.ndarray, np.ndarray, np.ndarray | None]] = []  # port, rows, origin, mask
        for k, (step, component) in enumerate(self.steps):
            try:
                result = component.process(current)
            except Exception as exc:
                raise ComponentError(f"node '{step.id}' ({type(component).__name__}): {exc!r}") from exc
            outputs, mask, errs = read_result(component, result, current.rows, node=step.id)
            for i, why in errs.items():
                errors.setdefault(int(origin[i]), f"node '{step.id}': {why}")
            if k == last:
                break
            tapped += [(f"{step.id}.{p}", outputs[p], origin, mask.get(p))
                       for p in self.params.taps.get(step.id, ()) if p in outputs]
            current, origin = self._handoff(current, origin, outputs, mask, errs, self.steps[k + 1], errors)
            if not current.sizes:
                outputs, mask = {}, {}
                break
        whole = len(current.sizes) == len(batch.sizes) and len(origin) == batch.rows  # nobody left the chain
        if whole:
            full, wide_mask = dict(outputs), dict(mask)
        else:
            full, wide_mask = self._widen(batch.rows, origin, outputs, mask)
        for port, rows, at, m in tapped:
            if len(at) == batch.rows and m is None:
                full[port] = rows
            else:
                tap, tap_mask = self._widen(batch.rows, at, {port: rows}, {} if m is None else {port: m})
                full.update(tap)
                wide_mask.update(tap_mask)
        return Result(full, wide_mask, errors) if wide_mask or errors or not whole else full

    @staticmethod
    def _handoff(current: Batch, origin: np.ndarray, outputs: dict[str, np.ndarray], mask: dict[str, np.ndarray],
                 errs: dict[int, str], nxt: tuple[ChainStep, Component], errors: dict[int, str]
                 ) -> tuple[Batch, np.ndarray]:
        """The batch the next member reads, without the requests that failed or were routed away from it.

        As across a topic: a request stops when a row of it failed or when none of its rows is emitted on
        the ports the next member reads (the rows that are go on alone), and the next member's input ports
        are checked, request by request, as a worker checks the records it reads.
        """
        step, component = nxt
        if not errs and all(src in outputs and src not in mask for src in step.wiring.values()):  # all go on
            tensors = {port: outputs[src] for port, src in step.wiring.items()}
            if not _violations(step.id, component, tensors, current.sizes, origin, errors).any():
                return Batch(tensors, current.sizes, current.request_ids, current.headers), origin
        sizes = np.asarray(current.sizes, dtype=np.intp)
        req = np.repeat(np.arange(len(sizes)), sizes)  # request of each row
        stop = np.zeros(len(sizes), dtype=bool)
        stop[req[list(errs)]] = True
        keep = np.ones(len(req), dtype=bool)
        masked = False
        for src in set(step.wiring.values()):
            if src not in outputs:  # nothing emitted on that port at all
                stop[:] = True
            elif src in mask:
                keep &= mask[src]
                masked = True
        left = np.bincount(req[keep & ~stop[req]], minlength=len(sizes))
        stop |= (left == 0) & ((sizes > 0) | masked)
        keep &= ~stop[req]
        tensors = {} if stop.all() else {port: outputs[src][keep] for port, src in step.wiring.items()}
        sizes, origin = left[~stop], origin[keep]
        ids = [r for r, s in zip(current.request_ids, stop, strict=True) if not s]
        headers = [h for h, s in zip(current.headers, stop, strict=True) if not s] if current.headers else []
        bad = _violations(step.id, component, tensors, sizes, origin, errors)
        if bad.any():
            rows = np.repeat(~bad, sizes)
            tensors = {port: a[rows] for port, a in tensors.items()}
            sizes, origin = sizes[~bad], origin[rows]
            ids = [r for r, b in zip(ids, bad, strict=True) if not b]
            headers = [h for h, b in zip(headers, bad, strict=True) if not b] if headers else []
        return Batch(tensors, [int(n) for n in sizes], ids, headers), origin

    @staticmethod
    def _widen(rows: int, origin: np.ndarray, outputs: dict[str, np.ndarray], mask: dict[str, np.ndarray]
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Outputs sized for the whole batch (``rows``) again, and their masks: the rows that left the
        chain (not in ``origin``) are masked out."""
        present = np.zeros(rows, dtype=bool)
        present[origin] = True
        full: dict[str, np.ndarray] = {}
        wide_mask: dict[str, np.ndarray] = {}
        for port, a in outputs.items():
            wide = np.zeros((rows, *a.shape[1:]), dtype=a.dtype)
            wide[origin] = a
            full[port] = wide
            m = present.copy()
            if port in mask:
                m[origin] &= mask[port]
            wide_mask[port] = m
        return full, wide_mask


def _violations(node: str, component: Component, tensors: dict[str, np.ndarray], sizes: np.ndarray | list[int],
                origin: np.ndarray, errors: dict[int, str]) -> np.ndarray:
    """Which requests break ``component``'s input ports; each gets an error naming ``node``."""
    bad = np.zeros(len(sizes), dtype=bool)
    for port, array in tensors.items():
        spec = component.inputs[port]
        try:
            spec.check(port, array)
            continue
        except WireError:
            pass
        start = 0
        for i, n in enumerate(sizes):
            try:
                spec.check(port, array[start:start + n])
            except WireError as exc:
                bad[i] = True
                if n:  # an error is keyed by a row: a request without rows just stops
                    errors.setdefault(int(origin[start]), f"node '{node}': {exc}")
            start += n
    return bad


def fuse_spec(spec: TopologySpec, unfused: Mapping[str, Node], unfused_outputs: Mapping[str, Source],
              source: str) -> TopologySpec:
    """The spec with each chain under ``fuse:`` replaced by one node running :class:`Chain`.

    ``unfused`` and ``unfused_outputs`` are the nodes and outputs of the topology compiled without fusion (so ports
    and references are already checked); here only what fusion needs is checked: each chain is linear and
    nothing outside it reads inside it.
    """
    nodes: dict[str, NodeSpec] = dict(spec.nodes)
    rename: dict[str, str] = {}  # last member -> fused node id, for references from outside
    seen: dict[str, str] = {}
    tap_ports: list[str] = []  # "<chain>.<member>.<port>" of every tapped inner edge, for capture.ports
    for name, members in spec.fuse.items():
        if len(members) < 2:
            raise TopologyError(f"fuse.{name}: a chain needs at least two nodes", source=source, node=name)
        for m in members:
            if m not in spec.nodes:
                raise TopologyError(f"fuse.{name}: unknown node '{m}' (nodes: {', '.join(spec.nodes)})",
                                    source=source, node=name)
            if m in seen:
                where = f"twice in '{name}'" if seen[m] == name else f"in both '{seen[m]}' and '{name}'"
                raise TopologyError(f"fuse: node '{m}' is {where}; a node runs in one place, once", source=source,
                                    node=m)
            seen[m] = name
        if name in spec.nodes and name not in members:
            raise TopologyError(f"fuse.{name}: the name is already a node's id; pick another", source=source,
                                node=name)
        _check_chain(name, members, unfused, unfused_outputs, spec, source)
        steps = []
        wirings: list[dict[str, str]] = []
        for k, m in enumerate(members):
            ns = spec.nodes[m]
            bindings = unfused[m].bindings
            wiring = {} if k == 0 else {port: srcs[0].tensor for port, srcs in bindings.items()}
            wirings.append(wiring)
            steps.append({"id": m, "component": ns.component, "params": ns.params, "wiring": wiring})
        # capture on for the chain: its inner edges (what each member reads of the one before) are tapped
        taps = ({prev: sorted(set(w.values())) for prev, w in zip(members, wirings[1:], strict=False)}
                if node_policy(spec, name).active else {})
        tap_ports += [f"{name}.{m}.{p}" for m, ports in taps.items() for p in ports]
        head = spec.nodes[members[0]]
        if head.join.type == "deadline":  # its absent inputs would reach the chain's first step unflagged
            raise TopologyError(f"fuse.{name}: '{members[0]}' is behind a deadline join, which a chain cannot "
                                "take; start the chain at the node after it", source=source, node=name)
        specs = [spec.nodes[m] for m in members]
        # The chain batches as its first member that asks for something other than the default, at most as
        # many requests as its most limited member takes (its max_batch, or its component's), on as many
        # replicas as its most replicated member.
        batching = next((s.batching for s in specs if s.batching != BatchingSpec()), head.batching)
        fused = NodeSpec(component=CHAIN, params={"steps": steps, "taps": taps}, inputs=head.inputs,
                         triggers=head.triggers,
                         join=head.join, batching=batching, replicas=max(s.replicas for s in specs),
                         max_batch=min(unfused[m].max_batch for m in members),
                         cache=_chain_cache(name, members, spec, source))
        for m in members:
            nodes.pop(m)
        nodes[name] = fused
        rename[members[-1]] = name
    rebuilt = {nid: _renamed(ns, rename) for nid, ns in nodes.items()}
    outputs = {k: _ref(v, rename) for k, v in spec.outputs.items()}
    capture = spec.capture
    if capture is not None and tap_ports:
        capture = capture.model_copy(update={"ports": list(dict.fromkeys([*capture.ports, *tap_ports]))})
    return spec.model_copy(update={"nodes": rebuilt, "outputs": outputs, "fuse": {}, "capture": capture})


def _chain_cache(name: str, members: list[str], spec: TopologySpec, source: str) -> CacheSpec | None:
    """A chain is cached as one node when every member declares ``cache:`` (a chain of functions of their
    inputs is one too): the smallest bound, the shortest TTL, every header a member varies by. Some members
    only: refused, since what the others compute between the cached ones never leaves the worker."""
    caches = [spec.nodes[m].cache for m in members]
    if all(c is None for c in caches):
        return None
    bare = [m for m, c in zip(members, caches, strict=True) if c is None]
    if bare:
        raise TopologyError(f"fuse.{name}: a fused chain is cached as a whole, so every member needs 'cache:' "
                            f"or none does; '{bare[0]}' has none", source=source, node=bare[0])
    ttls = [c.ttl_s for c in caches if c is not None and c.ttl_s is not None]
    vary = list(dict.fromkeys(h for c in caches if c is not None for h in c.vary))
    return CacheSpec(max_mb=min(c.max_mb for c in caches if c is not None), ttl_s=min(ttls) if ttls else None,
                     vary=vary)


def _check_chain(name: str, members: list[str], unfused: Mapping[str, Node], outputs: Mapping[str, Source],
                 spec: TopologySpec, source: str) -> None:
    for m in members:
        if spec.nodes[m].fuse == "never":
            raise TopologyError(f"fuse.{name}: node '{m}' says 'fuse: never'; take it out of the chain or drop "
                                "its 'fuse: never'", source=source, node=m)
        if spec.nodes[m].models is not None:  # its worker schedules its own models (flowserve.models)
            raise TopologyError(f"fuse.{name}: node '{m}' serves many models and is a stage of its own; take it "
                                "out of the chain", source=source, node=m)
    for prev, m in zip(members, members[1:], strict=False):
        node = unfused[m]
        if node.triggers or any(len(srcs) != 1 or srcs[0].node != prev for srcs in node.bindings.values()):
            raise TopologyError(f"fuse.{name}: every input of '{m}' must come from '{prev}', the node before it "
                                "in the chain (a chain is linear)", source=source, node=m)
    inner = set(members[:-1])
    for node in unfused.values():
        if node.id not in spec.nodes:  # the implicit Collect node: the outputs are checked below
            continue
        for src in node.sources:
            if src.node in inner and node.id != members[members.index(src.node) + 1]:
                raise TopologyError(f"fuse.{name}: '{node.id}' reads '{src.ref}', inside the chain; only the "
                                    f"chain's last node may feed other nodes", source=source, node=node.id)
    for out, src in outputs.items():
        if src.node in inner:
            raise TopologyError(f"fuse.{name}: outputs.{out} reads '{src.ref}', inside the chain; only the "
                                "chain's last node may feed the outputs", source=source, node=src.node)
    cap = spec.capture
    if cap is not None:
        named = set(cap.nodes) | {p.partition(".")[0] for p in cap.ports if p != "*"}
        if clash := sorted(named & set(members)):
            raise TopologyError(f"fuse.{name}: capture names '{clash[0]}', which is fused: data inside a chain "
                                f"is not on Kafka; capture '{name}' or take '{clash[0]}' out of the chain",
                                source=source, node=clash[0])


def _ref(ref: str, rename: dict[str, str]) -> str:
    node, dot, rest = ref.partition(".")
    return f"{rename[node]}.{rest}" if dot and node in rename else ref


def _renamed(ns: NodeSpec, rename: dict[str, str]) -> NodeSpec:
    if not rename:
        return ns
    inputs = {p: _ref(r, rename) if isinstance(r, str) else [_ref(x, rename) for x in r] for p, r in ns.inputs.items()}
    return ns.model_copy(update={"inputs": inputs, "triggers": [_ref(t, rename) for t in ns.triggers]})
