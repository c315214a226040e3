"""The chaos run's core for under a minute: HTTP and async traffic through a worker SIGKILLed, a worker
SIGSTOPped and the gateway restarted, on each broker kind. Every request ends with exactly one outcome at
its caller, every request id on the inputs topic is answered on a reply topic, and the lag returns to zero."""

from __future__ import annotations

import pytest

from flowserve.bench.chaos import ChaosConfig, chaos

pytestmark = pytest.mark.slow


async def test_requests_are_answered_once_through_random_faults(broker: object, unique_name: str) -> None:
    cfg = ChaosConfig(seconds=40, seed=3, http_rate=10, async_rate=10, fault_every_s=6, settle_s=120)
    result = await chaos(cfg, broker=broker, name=unique_name)  # type: ignore[arg-type]

    assert result["faults"], "no fault was injected"
    assert {f["kind"] for f in result["faults"]} <= {"kill-worker", "stop-worker", "restart-gateway"}
    http, calls = result["http"], result["async"]
    assert http["sent"] > 0 and calls["sent"] > 0
    assert http["ok"] + http["error"] + http["failed"] == http["sent"], http
    assert calls["ok"] + calls["error"] == calls["sent"], calls
    assert result["lost"] == 0, result["lost_ids"]
    assert result["wrong_values"] == 0
    assert result["topics"]["unanswered_ids"] == 0
    assert result["targets"]["lost_zero"] and result["targets"]["every_request_answered_once"]
    assert result["targets"]["lag_zero"], result["lag"]
