"""One base error for flowserve; each subclass says what went wrong and where.

Domain errors never carry HTTP status codes: the gateway maps them.
"""

from __future__ import annotations


class FlowserveError(Exception):
    """Base class of every error flowserve raises on purpose."""


class TopologyError(FlowserveError):
    """A topology file is invalid. The message names the file and node and says what to fix."""

    def __init__(self, message: str, *, source: str = "<topology>", node: str | None = None) -> None:
        self.source = source
        self.node = node
        where = f"{source}: node '{node}'" if node else source
        super().__init__(f"{where}: {message}")


class ComponentError(FlowserveError):
    """A component could not be imported, configured or set up."""


class WireError(FlowserveError):
    """Bytes or JSON could not be decoded into tensors, or tensors do not match a port."""

    def __init__(self, message: str, *, request_id: str | None = None) -> None:
        self.request_id = request_id
        prefix = f"request {request_id}: " if request_id else ""
        super().__init__(prefix + message)


class BrokerError(FlowserveError):
    """A broker could not be started, reached or used."""
