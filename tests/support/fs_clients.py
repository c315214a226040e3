"""Helpers of the client compatibility tests (tests/clients): the served topology and its V2 JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from flowserve.kafka.settings import KafkaSettings
from flowserve.topology import names
from flowserve.topology.graph import Topology


@dataclass(frozen=True)
class Served:
    topology: Topology
    kafka: KafkaSettings
    broker_kind: str  # "embedded" or "kafka"
    url: str  # the gateway, http://host:port

    @property
    def feedback_topic(self) -> str:
        return names.feedback_topic(self.topology.base)


def v2_request(request_id: str, x: np.ndarray) -> bytes:
    """A V2 JSON inference request for input ``x`` (what a hand-written client sends to ``<base>.inputs``)."""
    return json.dumps({"id": request_id, "inputs": [
        {"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}).encode()


def answer_of(value: bytes) -> np.ndarray:
    """The ``y`` output of a V2 JSON answer read from ``<base>.outputs``."""
    body = json.loads(value)
    (out,) = body["outputs"]
    assert out["name"] == "y", body
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def not_on_embedded(served: Served, request: pytest.FixtureRequest, reason: str) -> None:
    """Mark the running test as an expected failure on the embedded broker, with the reason."""
    if served.broker_kind == "embedded":
        request.applymarker(pytest.mark.xfail(reason=reason, strict=False))
