"""Shadow: a candidate version on a copy of a node's live traffic, as a side branch that answers nobody.

:func:`shadow_topology` adds the node ``<node>-shadow`` to a topology: the node's component class with
the node's params, reading the node's input topics in its own consumer group (so it sees every request
the live workers see, without taking any from them), writing ``<base>.<node>.shadow.<port>`` and nothing
else: no reply route, no topology outputs, no edge any node reads. :func:`shadow_worker` builds its
stage worker, pinned to one registered version (:class:`~flowserve.learning.hooks.VersionHooks`).
``flowserve versions`` then compares the live and shadow outputs against the feedback.
"""

from __future__ import annotations

from dataclasses import replace

from flowserve.errors import TopologyError
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.learning.hooks import VersionHooks
from flowserve.runtime.hooks import HookFactory, StageHooks, chain, no_hooks
from flowserve.runtime.worker import StageWorker
from flowserve.topology import names
from flowserve.topology.graph import Node, Topology


def shadow_topology(topology: Topology, node_id: str) -> Topology:
    """``topology`` with ``node_id``'s shadow node added (see the module docstring)."""
    node = topology.nodes.get(node_id)
    if node is None:
        raise TopologyError(f"topology '{topology.name}' has no node '{node_id}' (nodes: {', '.join(topology.nodes)})",
                            source=topology.source)
    if not node.component.retrainable:
        raise TopologyError(f"node '{node_id}' runs {type(node.component).__name__}, which has no versions "
                            "(it does not declare 'retrainable'): nothing to shadow", source=topology.source,
                            node=node_id)
    sid = names.shadow_node(node_id)
    if sid in topology.nodes:
        raise TopologyError(f"the shadow node would be named '{sid}', which is taken; rename that node",
                            source=topology.source, node=node_id)
    spec = topology.spec.nodes[node_id]
    component = type(node.component).configure(dict(spec.params), node=sid)
    shadow = replace(node, id=sid, component=component, replicas=1, emits_outputs={}, capture_topics={},
                     output_topics={p: names.shadow_topic(topology.base, node_id, p) for p in component.outputs})
    return replace(topology, nodes={**topology.nodes, sid: shadow})


def shadow_topics(topology: Topology, node_id: str) -> list[str]:
    """The topics a shadow of ``node_id`` writes (create them before its worker starts)."""
    component = topology.nodes[node_id].component
    return [names.shadow_topic(topology.base, node_id, p) for p in component.outputs]


def shadow_worker(topology: Topology, node_id: str, version: str, kafka: KafkaSettings,
                  settings: WorkerSettings | None = None, hooks: HookFactory = no_hooks) -> StageWorker:
    """The stage worker of ``node_id``'s shadow running registered ``version`` (``hooks``: other features,
    e.g. capture). ``await worker.run()`` until ``worker.stop()``."""
    shadowed = shadow_topology(topology, node_id)
    sid = names.shadow_node(node_id)
    # It answers nobody, so no deadline applies: replayed and late inputs are computed, not failed.
    settings = (settings or WorkerSettings()).model_copy(update={"honour_deadlines": False})

    def pinned(t: Topology, node: Node, component: object) -> list[StageHooks]:
        return [VersionHooks(t, node_id, node.component, None, settings, pinned=version)]

    return StageWorker(shadowed, sid, kafka, settings, hooks=chain(pinned, hooks))
