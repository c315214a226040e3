"""Real models on a many-model node, on a real broker: 100 digits variants from the version registry
(topologies/many-models-digits.yaml), ten resident at a time; every answer, on the Kafka path and through the
gateway, equals the variant it named run alone in this process, and no other variant's."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from flowserve.client import TopologyClient
from flowserve.client.http import AsyncHttpClient
from flowserve.gateway import Gateway, GatewaySettings
from flowserve.models import ModelHooks, model_hooks
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology
from flowserve.wire.envelope import H_MODEL, H_SERVED_BY
from flowserve_components import digit_variants as dv
from flowserve_components import models
from flowserve_components.digits import PIXEL_MAX, load_split
from flowserve_components.torch_models import TorchModels

pytestmark = pytest.mark.integration

TOPOLOGY = Path(__file__).resolve().parents[2] / "topologies" / "many-models-digits.yaml"
PER_MODEL = 3
RTOL, ATOL = 1e-5, 1e-4


@pytest.fixture
def variants(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The topology's 100 variants registered in a fresh cache (the base MLP: the user's cached one, which
    seeded training reproduces, else trained here)."""
    cached = models.model_path("digits-mlp")
    (tmp_path / "models").mkdir()
    monkeypatch.setenv("FLOWSERVE_CACHE", str(tmp_path))
    if cached.exists():
        shutil.copyfile(cached, models.model_path("digits-mlp"))
    return dv.produce(100).names


async def test_every_answer_is_its_own_variants_output(kafka, write_topology, variants) -> None:  # noqa: ANN001
    topology = load_topology(write_topology(TOPOLOGY.read_text().replace("name: many_digits", "name: NAME")))
    component = cast(TorchModels, topology.nodes["zoo"].component)
    x, _ = load_split("test")
    rng = np.random.default_rng(7)
    order = rng.permutation(len(variants) * PER_MODEL)  # every variant, interleaved: loads and evictions
    requests = [(variants[k % len(variants)], (x[k:k + 1] / np.float32(PIXEL_MAX)).astype(np.float32))
                for k in order]
    over_http = variants[::10]
    async with InlineHost(topology, kafka, hooks=model_hooks()) as host, \
            TopologyClient(topology, kafka) as client, \
            Gateway([topology], kafka, GatewaySettings(port=0)) as gateway, AsyncHttpClient(gateway.url) as http:
        (hook,) = [h for h in host.workers[0].hooks if isinstance(h, ModelHooks)]
        futures = []
        for i, (model, row) in enumerate(requests):
            rid = f"r{i}-{uuid.uuid4().hex[:6]}"
            futures.append(client.expect(rid))
            await client.queue({"x": row}, request_id=rid, headers={H_MODEL: model}, timeout_ms=60_000)
        await client.flush()
        replies = await asyncio.wait_for(asyncio.gather(*futures), 120)
        http_x = (x[-1:] / np.float32(PIXEL_MAX)).astype(np.float32)
        answers = [await http.infer(model, {"x": http_x}) for model in over_http]
        counters = hook.counters()
        resident = sorted(hook.scheduler.memory.resident)
        on_device = component.resident()  # before the worker closes it

    stacked = np.concatenate([row for _, row in requests])
    every = dv.outputs(variants, stacked, alone=False)
    for i, ((model, row), reply) in enumerate(zip(requests, replies, strict=True)):
        assert reply.error is None, (model, reply.error)
        assert reply.headers[H_SERVED_BY] == model.encode()
        logits = reply.tensors["logits"]
        np.testing.assert_allclose(logits, dv.outputs([model], row)[model], rtol=RTOL, atol=ATOL)  # run alone
        assert [m for m in variants if np.allclose(logits, every[m][i:i + 1], rtol=RTOL, atol=ATOL)] == [model]
    alone = dv.outputs(over_http, http_x)
    for model, answer in zip(over_http, answers, strict=True):
        assert answer.status == 200, answer.json()
        assert answer.json()["model_name"] == model
        np.testing.assert_allclose(answer.outputs()["logits"], alone[model], rtol=RTOL, atol=ATOL)

    assert counters["model_answers"] == len(requests) + len(over_http)
    assert counters["model_refusals"] == 0
    assert counters["model_loads"] >= len(variants)  # each loaded at least once, ten at a time
    assert counters["model_evictions"] >= len(variants) - 10
    assert counters["models_resident"] == len(resident) <= 10
    assert on_device == resident  # what the scheduler holds is what is on the device
