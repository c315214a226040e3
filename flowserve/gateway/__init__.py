"""The Open Inference Protocol V2 over HTTP, answered by topologies over Kafka (request-reply).

    from flowserve.gateway import Gateway, GatewaySettings

    async with Gateway([topology], kafka, GatewaySettings(port=8080)) as gw:
        ...  # POST {gw.url}/v2/models/<name>/infer

The Kafka side is imported on first use, so ``flowserve --help`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowserve.gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from flowserve.gateway.app import Gateway, serve, status_of

__all__ = ["Gateway", "GatewaySettings", "serve", "status_of"]


def __getattr__(name: str) -> Any:
    if name in ("Gateway", "serve", "status_of"):
        from flowserve.gateway import app

        return getattr(app, name)
    raise AttributeError(f"module 'flowserve.gateway' has no attribute '{name}'")
