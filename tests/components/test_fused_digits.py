"""topologies/digits-fused.yaml classifies as topologies/digits.yaml does, in process and on a broker.

Here, beside the ``model_cache`` fixture, so the session's trained models are reused.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from flowserve.client import TopologyClient
from flowserve.component import Batch
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import InlineHost
from flowserve.topology import Topology, load_topology
from flowserve.topology.fuse import Chain
from flowserve.topology.graph import compile_spec
from flowserve_components.digits import sample

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"
N = 40


def unfused_predictions(pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Labels and probabilities of digits.yaml's stages, one request at a time."""
    digits = load_topology(TOPOLOGIES / "digits.yaml")
    for node in digits.nodes.values():
        node.component.setup()
    try:
        labels, probs = [], []
        for row in pixels:
            tensors = {"pixels": row[None]}
            for node in digits.nodes.values():
                (port, (src,)), = node.bindings.items()
                tensors = dict(node.component.process(Batch({port: tensors[src.tensor]}, [1], ["r"])))
            labels.append(tensors["label"])
            probs.append(tensors["probs"])
    finally:
        for node in digits.nodes.values():
            node.component.close()
    return np.concatenate(labels), np.concatenate(probs)


@pytest.fixture
def held_out() -> tuple[np.ndarray, list[int]]:
    requests, labels = sample(N, seed=11)
    return np.concatenate([r["pixels"] for r in requests]), labels


@pytest.mark.usefixtures("model_cache", "torch_threads")
def test_fused_chain_in_process(held_out: tuple[np.ndarray, list[int]]) -> None:
    pixels, labels = held_out
    fused = load_topology(TOPOLOGIES / "digits-fused.yaml")
    chain = fused.nodes["classify"].component
    assert isinstance(chain, Chain)
    chain.setup()
    try:
        out = chain.process(Batch({"pixels": pixels}, [1] * N, [f"r{i}" for i in range(N)]))
    finally:
        chain.close()
    assert isinstance(out, dict)
    want_labels, want_probs = unfused_predictions(pixels)
    np.testing.assert_array_equal(out["label"], want_labels)
    np.testing.assert_allclose(out["probs"], want_probs, rtol=1e-5, atol=1e-6)
    assert np.mean(out["label"] == np.array(labels)) >= 0.9
    assert chain.weights_hash and "weights=sha256:" in chain.describe()


@pytest.mark.integration
@pytest.mark.usefixtures("model_cache", "torch_threads")
async def test_fused_topology_on_a_broker(kafka: KafkaSettings, unique_name: str,
                                          held_out: tuple[np.ndarray, list[int]]) -> None:
    pixels, labels = held_out
    spec = load_topology(TOPOLOGIES / "digits-fused.yaml").spec
    topology: Topology = compile_spec(spec.model_copy(update={"name": unique_name}))
    async with InlineHost(topology, kafka), TopologyClient(topology, kafka) as client:
        futures = []
        for i in range(N):  # all at once, so the chain runs on batches of several requests
            futures.append(client.expect(f"r{i}"))
            await client.queue({"pixels": pixels[i:i + 1]}, request_id=f"r{i}", timeout_ms=60_000)
        await client.flush()
        replies = await asyncio.wait_for(asyncio.gather(*futures), 120)
    assert all(r.error is None for r in replies)
    got = np.array([int(r.tensors["label"][0]) for r in replies])
    want_labels, want_probs = unfused_predictions(pixels)
    np.testing.assert_array_equal(got, want_labels)
    np.testing.assert_allclose(np.concatenate([r.tensors["probs"] for r in replies]), want_probs,
                               rtol=1e-5, atol=1e-6)
    assert np.mean(got == np.array(labels)) >= 0.9
