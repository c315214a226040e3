"""flowserve: serve ML inference pipelines as streaming dataflow graphs on Kafka."""

from flowserve.component import Batch, Component, Port, Result
from flowserve.errors import FlowserveError
from flowserve.topology import Topology, load_topology

__all__ = ["Batch", "Component", "FlowserveError", "Port", "Result", "Topology", "load_topology"]
__version__ = "0.1.0"
