"""Intermediate data: capture policy, ``inspect``, lineage with OpenTelemetry spans, drift state.

Every edge of a topology is a Kafka topic, so the intermediate data of every request already exists;
this package decides what else to keep (``capture:`` in the YAML), records lineage (one record per batch) and
trace spans as stages run, and reads it all back (``flowserve inspect``, ``lineage``, ``drift``).
Heavy dependencies (the OpenTelemetry SDK, alibi-detect) are imported only when used.
"""

from __future__ import annotations

from flowserve.capture.capabilities import FilesReports
from flowserve.capture.stage import StageCapture, capture_hooks
from flowserve.topology.capture import NodePolicy, node_policy, sample_point
from flowserve.topology.spec import CaptureSpec, NodeCaptureSpec

__all__ = ["CaptureSpec", "FilesReports", "NodeCaptureSpec", "NodePolicy", "StageCapture", "capture_hooks",
           "node_policy", "sample_point"]
