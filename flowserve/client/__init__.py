"""Clients: call a topology over Kafka (async path)."""

from flowserve.client.kafka import Reply, TopologyClient, new_request_id

__all__ = ["Reply", "TopologyClient", "new_request_id"]
