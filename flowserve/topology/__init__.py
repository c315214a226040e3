"""Graph model, YAML loading, validation, topic naming."""

from flowserve.topology.graph import Topology, load_topology, load_topology_text
from flowserve.topology.node import Node, Source
from flowserve.topology.spec import JoinSpec, NodeSpec, TopologySpec

__all__ = ["JoinSpec", "Node", "NodeSpec", "Source", "Topology", "TopologySpec", "load_topology",
           "load_topology_text"]
