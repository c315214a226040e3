"""``flowserve ui``: a live web page of running topologies, served from the topics they already publish."""

from flowserve.ui.graph import graph_view
from flowserve.ui.live import LiveState
from flowserve.ui.server import UiServer, UiSettings, UiSources

__all__ = ["LiveState", "UiServer", "UiSettings", "UiSources", "graph_view"]
