"""``POST /v2/models/{name}/explain`` on a real broker: the answer and its explanation in one response, from the
explain side branch, for a request its sample would have left out."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest

from flowserve.client.http import AsyncHttpClient
from flowserve.explain import Explanation
from flowserve.explain.service import Explainer
from flowserve.gateway import Gateway, GatewaySettings
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology_text
from flowserve.wire.v2 import build_request

pytest.importorskip("captum")
pytest.importorskip("flowserve_components")
pytestmark = pytest.mark.integration

DIGITS = """
name: NAME
partitions: 2
nodes:
  pre: {component: "flowserve_components.digits:Normalize", inputs: {pixels: input.pixels}}
  model:
    component: flowserve_components.torch_stage:TorchClassifier
    params: {model: digits-mlp, threads: 1}
    inputs: {x: pre.x}
  post: {component: "flowserve_components.postprocess:ArgMax", inputs: {logits: model.logits}}
outputs: {label: post.label, probs: post.probs}
explain: {sample: 0.0}
"""


async def test_explain_answers_the_request_with_its_attributions(kafka, unique_name) -> None:  # noqa: ANN001
    from flowserve_components.digits import sample

    topology = load_topology_text(DIGITS.replace("NAME", unique_name))
    (request,), _ = sample(1, seed=13)
    explainer = Explainer(topology, kafka)
    async with InlineHost(topology, kafka):
        task = asyncio.create_task(explainer.run())
        try:
            async with Gateway([topology], kafka, GatewaySettings(port=0)) as gateway, \
                    AsyncHttpClient(gateway.url) as client:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 90
                while (await client.get("/v2/health/ready")).status != 200:  # every stage has a live worker
                    assert loop.time() < deadline, "the topology did not become ready within 90 s"
                    await asyncio.sleep(0.1)  # polling readiness, bounded; the assertions are on the answers
                body, headers = build_request(request, request_id="why-1")
                response = await client.request("POST", f"/v2/models/{unique_name}/explain", body, headers)
                assert response.status == 200, response.body[:500]
                answer = response.json()
                probs = response.outputs()["probs"]
                missing = await client.request("POST", "/v2/models/nope/explain", body, headers)
        finally:
            explainer.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 30)
    assert answer["id"] == "why-1" and missing.status == 404
    e = Explanation.from_json(answer["explanation"])
    assert e.request_id == "why-1" and e.classes == [int(np.asarray(probs).argmax())]
    assert e.f_x[0] == pytest.approx(float(np.asarray(probs).max()), rel=1e-4)
    assert abs(e.delta[0]) <= 0.01 * abs(e.f_x[0] - e.f_baseline[0])
    assert explainer.explained == 1  # sample 0: only the request that asked
