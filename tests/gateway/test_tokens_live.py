"""Scoped tokens through a running gateway: 403 and 429 with their kinds, and the refusals in `flowserve stats`."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from typing import Any

import numpy as np
import pytest
from conftest import unique, wait_ready
from pydantic import SecretStr

from flowserve.client.http import AsyncHttpClient
from flowserve.gateway import Gateway, GatewaySettings
from flowserve.gateway.tokens import Grant, RateLimit, hash_token
from flowserve.runtime.host import InlineHost
from flowserve.runtime.metrics import read_snapshots
from flowserve.topology import load_topology

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

IDENTITY = """
name: NAME
deadline_ms: 30000
nodes:
  a: {component: flowserve.builtin:Identity, params: {ports: {x: {datatype: FP32, shape: [-1, 4]}}},
      inputs: {x: input.x}}
outputs: {x: a.x}
"""
X = {"x": np.ones((1, 4), np.float32)}


async def test_scoped_tokens_refuse_by_kind_and_count_in_stats(broker: Any, write_topology: Any) -> None:
    kafka = broker.settings()
    path = write_topology(IDENTITY)
    model_a, model_b = load_topology(path), unique(IDENTITY)
    a, b = model_a.name, model_b.name
    grants = (Grant(token=SecretStr(hash_token("a-only")), name="a-app", models=(a,), actions=("infer",)),
              Grant(token=SecretStr("slow"), name="slow-app", models=(a,), actions=("infer",),
                    rate=RateLimit(per_s=0.001, burst=1)))
    settings = GatewaySettings(port=0, tokens=(SecretStr("full"),), grants=grants, metrics_interval_s=0)
    async with InlineHost(model_a, kafka), Gateway([model_a, model_b], kafka, settings) as gateway, \
            AsyncHttpClient(gateway.url, token="full") as full, \
            AsyncHttpClient(gateway.url, token="a-only") as scoped, \
            AsyncHttpClient(gateway.url, token="slow") as slow:
        await wait_ready(full, f"/v2/models/{a}/ready")
        assert (await scoped.infer(a, X)).status == 200
        for reply in (await scoped.infer(b, X), await scoped.get(f"/v2/models/{b}"),
                      await scoped.request("POST", f"/v2/repository/models/{a}/load"),
                      await scoped.get("/v2/gateway/stats")):
            assert (reply.status, reply.json()["kind"]) == (403, "forbidden"), reply.error
            assert "a-app" in reply.error and "a-only" not in reply.error
        # the old kind of token still opens everything
        answered = await full.infer(a, X)
        assert answered.status == 200
        np.testing.assert_array_equal(answered.outputs()["x"], X["x"])
        assert (await full.get(f"/v2/models/{b}")).status == 200
        # over its rate limit: 429 with its kind and when to come back (recovery: tests/gateway/test_tokens.py)
        assert (await slow.infer(a, X)).status == 200
        limited = await slow.infer(a, X)
        assert (limited.status, limited.json()["kind"]) == (429, "rate_limited")
        assert int(limited.headers["retry-after"]) >= 1
        async with AsyncHttpClient(gateway.url) as anonymous:
            denied = await anonymous.infer(a, X)
            assert (denied.status, denied.json()["kind"]) == (401, "unauthorized")
            assert (await anonymous.get("/v2/health/live")).status == 200  # probes need no secret
        stats = (await full.get("/v2/gateway/stats")).json()["refusals"]
        assert (stats["unauthorized"], stats["forbidden"], stats["rate_limited"]) == (1, 4, 1)
        assert stats["models"][a] == {"unauthorized": 1, "forbidden": 1, "rate_limited": 1}
        assert stats["models"][b] == {"unauthorized": 0, "forbidden": 2, "rate_limited": 0}
        assert stats["tokens"]["a-app"]["forbidden"] == 4
        await gateway.publish_refusals()

        snaps = [s for s in await read_snapshots(model_b, kafka) if s.get("role") == "gateway"]
        assert [(s["worker"], s["counters"]) for s in snaps] == [
            (gateway.settings.instance, {"unauthorized": 0, "forbidden": 2, "rate_limited": 0})]
        assert snaps[0]["unattributed"]["forbidden"] == 1  # /v2/gateway/stats names no model
        env = {**os.environ, "COLUMNS": "200", "FLOWSERVE_FETCH_MAX_WAIT_MS": str(kafka.fetch_max_wait_ms)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "flowserve", "stats", str(path), "--broker", kafka.bootstrap, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out = (await asyncio.wait_for(proc.communicate(), 120))[0].decode()
        assert "gateways' refusals" in out, out
        row = next(line for line in out.splitlines() if gateway.settings.instance in line)
        cells = [c.strip() for c in re.split("[│┃|]", row) if c.strip()]
        # unauthorized, forbidden, rate limited on model a; and the one refusal naming no model
        assert cells[2:] == ["1", "1", "1", "1"], out
