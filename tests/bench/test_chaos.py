"""The chaos run's core for under a minute: HTTP and async traffic through a worker SIGKILLed, a worker
SIGSTOPped and a gateway restarted (two gateways share one port, so one always serves). Every input request
id is answered on a reply topic, no async request is lost, no answer reaches a caller twice, no HTTP call is
refused, and the lag returns to zero."""

from __future__ import annotations

import pytest

from flowserve_bench.chaos import ChaosConfig, chaos

pytestmark = pytest.mark.slow


async def test_requests_are_answered_once_through_random_faults(broker: object, unique_name: str) -> None:
    cfg = ChaosConfig(seconds=40, seed=3, http_rate=10, async_rate=10, fault_every_s=6, settle_s=120)
    result = await chaos(cfg, broker=broker, name=unique_name)  # type: ignore[arg-type]

    assert result["faults"], "no fault was injected"
    assert {f["kind"] for f in result["faults"]} <= {"kill-worker", "stop-worker", "restart-gateway"}
    http, calls = result["http"], result["async"]
    assert http["sent"] > 0 and calls["sent"] > 0
    # a send the client was told failed is its own outcome, not an error result
    assert calls["ok"] + calls["error"] + calls["send_failed"] == calls["sent"], calls
    assert (calls["lost"], calls["send_failed"]) == (0, 0), calls
    assert result["lost"] == 0, result["lost_ids"]
    assert result["wrong_values"] == 0
    assert result["duplicates_reaching_callers"] == 0
    assert result["topics"]["unanswered_ids"] == 0
    # two gateways behind one port: a restart of one refuses nobody
    assert (http["refused"], http["unanswered"]) == (0, 0), http
    assert result["targets"] == {"every_input_id_answered": True, "lost_zero": True, "caller_duplicates_zero": True,
                                 "lag_zero": True, "memory_bounded": True, "http_refused_zero": True}, result["lag"]
