"""The ``capture:`` section of a topology: which requests and ports are kept, lineage, tracing, retention.

Without a ``capture:`` section nothing extra is written. With one::

    capture:
      sample: 0.1              # fraction of requests, chosen by a hash of the request id (same at every node)
      ports: [post.probs]      # also give these ports a topic when no node reads them ("node.*", "*")
      lineage: true            # lineage records (one per batch) to <prefix>.<topology>.lineage
      tracing: true            # OpenTelemetry spans per batch and per request
      retention_ms: 86400000   # retention.ms of the topics capture reads, set when they are created
      nodes:                   # per-node overrides
        model: {sample: 1.0}
        post: {enabled: false}
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class NodeCaptureSpec(BaseModel):
    """Overrides of the topology-wide capture settings for one node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    sample: float | None = Field(None, ge=0.0, le=1.0)
    lineage: bool | None = None
    tracing: bool | None = None


class CaptureSpec(BaseModel):
    """Capture policy of a topology (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    #: fraction of requests captured; the choice hashes the request id, so a request is kept at every node.
    sample: float = Field(1.0, ge=0.0, le=1.0)
    #: "node.port", "node.*" or "*": ports that get a topic (for sampled requests) even when nothing reads them.
    ports: list[str] = Field(default_factory=list)
    lineage: bool = True
    tracing: bool = True
    #: retention.ms of edge, capture, lineage and drift topics, applied when they are created.
    retention_ms: int | None = Field(None, gt=0)
    nodes: dict[str, NodeCaptureSpec] = Field(default_factory=dict)
