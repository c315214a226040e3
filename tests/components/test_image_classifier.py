"""topologies/image-classifier.yaml: PNG bytes -> DecodeImage -> the CNN served from ONNX -> Classify, equal to
the exported model run directly with ONNX Runtime, in process and on the brokers (bad bytes dead-lettered)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from flowserve.client import TopologyClient
from flowserve.component import Batch, Result
from flowserve.errors import ComponentError, ErrorKind
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology
from flowserve_components import image_model
from flowserve_components.images import DecodeImage
from flowserve_components.onnx import OnnxModel
from flowserve_components.postprocess import Classify, softmax
from flowserve_components.training import train_in_child

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = REPO / "topologies" / "image-classifier.yaml"


@pytest.fixture(scope="module")
def cnn_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A model cache holding the CNN, trained and exported once for the module (seconds)."""
    cache = tmp_path_factory.mktemp("image-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLOWSERVE_CACHE", str(cache))
        image_model.ensure_model()
        yield cache


@pytest.fixture
def cnn(cnn_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLOWSERVE_CACHE", str(cnn_cache))
    return image_model.model_path()


def direct(path: Path, pngs: list[bytes]) -> np.ndarray:
    """The exported CNN run directly with ONNX Runtime on the same pre-processing: logits."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"x": image_model.preprocess(pngs)})[0]


def test_topology_params_match_what_the_model_was_trained_on(cnn: Path) -> None:
    topology = load_topology(TOPOLOGY)
    assert dict(topology.spec.nodes["pre"].params) == image_model.PRE
    assert list(topology.spec.nodes["post"].params["classes"]) == image_model.CLASSES
    assert topology.sampler() is image_model.sample


def test_model_trains_once_exports_onnx_and_classifies_held_out_digits(cnn: Path) -> None:
    assert cnn.read_bytes()[:2] != b"PK" and cnn.stat().st_size > 1000
    stamp = cnn.stat().st_mtime_ns
    assert image_model.ensure_model() == cnn and cnn.stat().st_mtime_ns == stamp  # cached: not trained again
    pngs, labels = image_model.load_pngs("test")
    accuracy = float((direct(cnn, pngs).argmax(axis=1) == labels).mean())
    assert accuracy >= 0.9, accuracy
    requests, labels = image_model.sample(5, seed=2)
    assert requests[0]["image"].dtype == object and requests[0]["image"][0].startswith(b"\x89PNG")
    assert len(requests) == 5 and set(labels) <= set(range(10))


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_nodes_equal_the_model_run_directly(cnn: Path, rows: int) -> None:
    pre = DecodeImage.configure(image_model.PRE)
    model = OnnxModel.configure({"model_from": "flowserve_components.image_model:ensure_model"})
    post = Classify.configure({"classes": image_model.CLASSES, "input": "logits", "top_k": 3})
    model.setup()
    pngs = image_model.load_pngs("test")[0][:rows]
    x = pre.process(Batch({"image": np.array(pngs, dtype=object)}, [rows], ["r"]))
    assert isinstance(x, Result) and not x.errors
    logits = model.process(Batch(x.outputs, [rows], ["r"]))["logits"]
    want = direct(cnn, pngs)
    np.testing.assert_allclose(logits, want, atol=1e-5, rtol=0)
    out = post.process(Batch({"logits": logits}, [rows], ["r"]))
    np.testing.assert_array_equal(out["label"], want.argmax(axis=1))
    np.testing.assert_allclose(out["probs"], softmax(want), atol=1e-5, rtol=0)


def test_model_from_failing_is_reported() -> None:
    with pytest.raises(ComponentError, match="cannot import module 'no_such_module'"):
        OnnxModel.configure({"model_from": "no_such_module:f"})


@pytest.mark.every_broker  # issue 36: the image topology's outputs are checked on both brokers
async def test_image_topology_on_a_broker(kafka: KafkaSettings, cnn: Path) -> None:
    topology = load_topology(TOPOLOGY)
    pngs, _ = image_model.load_pngs("test")
    rng = np.random.default_rng(5)
    requests = [[pngs[i] for i in rng.integers(0, len(pngs), rows)] for rows in (1, 7, 64, 2)]
    bad = [pngs[0], b"\x89PNG\r\n\x1a\n but then nothing"]  # one good image and one broken: the request fails
    async with InlineHost(topology, kafka), TopologyClient(topology, kafka) as client:
        futures = []
        for i, images in enumerate([*requests, bad]):  # all at once, so the nodes see batches of several
            futures.append(client.expect(f"r{i}"))
            await client.queue({"image": np.array(images, dtype=object)}, request_id=f"r{i}", timeout_ms=60_000)
        await client.flush()
        replies = await asyncio.wait_for(asyncio.gather(*futures), 120)
    for images, reply in zip(requests, replies, strict=False):
        assert reply.error is None, reply.error
        want = direct(cnn, images)
        np.testing.assert_array_equal(reply.tensors["label"], want.argmax(axis=1))
        np.testing.assert_allclose(reply.tensors["probs"], softmax(want), atol=1e-5, rtol=0)
        assert reply.tensors["class"].tolist() == [image_model.CLASSES[k].encode() for k in want.argmax(axis=1)]
        assert reply.tensors["top_classes"].shape == (len(images), 3)
    failed = replies[-1]
    assert failed.error_kind == ErrorKind.INVALID_INPUT
    assert failed.error is not None and "node 'pre': image 1: a truncated or corrupt PNG" in failed.error


def test_training_in_a_child_that_fails_says_why() -> None:
    with pytest.raises(ComponentError, match=r"training the model of flowserve_components\.no_such_module failed "
                       r"\(exit 1\): .*No module named flowserve_components\.no_such_module"):
        train_in_child("flowserve_components.no_such_module")
