"""The tabular pipeline: Columns (named columns -> feature matrix), Classify (class names, threshold, top-k),
and topologies/tabular.yaml served on a broker with the same outputs as the XGBoost model run directly."""

from __future__ import annotations

import asyncio
import doctest
from pathlib import Path

import numpy as np
import pytest

from flowserve.client import TopologyClient
from flowserve.component import Batch, Port, Result
from flowserve.errors import ComponentError
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import InlineHost
from flowserve.topology import load_topology
from flowserve_components import iris, model_files, postprocess, tabular
from flowserve_components.postprocess import Classify
from flowserve_components.tabular import Columns

REPO = Path(__file__).resolve().parents[2]


def test_columns_from_tensors_in_declared_order() -> None:
    pre = Columns.configure({"columns": ["b", "a", "c"], "datatypes": {"c": "INT64"}})
    assert pre.inputs == {"b": Port("FP32", [-1]), "a": Port("FP32", [-1]), "c": Port("INT64", [-1])}
    assert pre.outputs == {"x": Port("FP32", [-1, 3])}
    batch = Batch({"a": np.array([1, 2], np.float32), "c": np.array([5, 6]), "b": np.array([3, 4], np.float32)},
                  [2], ["r0"])
    out = pre.process(batch)
    assert isinstance(out, Result) and not out.errors
    np.testing.assert_array_equal(out.outputs["x"], np.array([[3, 1, 5], [4, 2, 6]], np.float32))
    with pytest.raises(ComponentError, match="columns mean radius are not valid port names"):
        Columns.configure({"columns": ["mean radius"]})
    with pytest.raises(ComponentError, match="columns repeated: a"):
        Columns.configure({"columns": ["a", "a"]})


def test_columns_from_json_rows() -> None:
    pre = Columns.configure({"columns": ["mean radius", "age"], "source": "rows"}, node="pre")
    rows = np.array([b'{"age": 41, "mean radius": 2.5, "id": "x"}', b'{"age": 3}', b"[1, 2]", b"{no",
                     b'{"age": "old", "mean radius": 1}', b'{"age": true, "mean radius": -1e3}'], dtype=object)
    out = pre.process(Batch({"rows": rows}, [1] * 6, [f"r{i}" for i in range(6)]))
    assert isinstance(out, Result)
    assert out.outputs["x"][0].tolist() == [2.5, 41.0] and out.outputs["x"][5].tolist() == [-1000.0, 1.0]
    assert out.errors == {
        1: "node 'pre': row 1: no value for column 'mean radius' (set 'missing' to fill one in)",
        2: "node 'pre': row 2: a JSON list, not an object of columns",
        3: "node 'pre': row 3: not JSON (Expecting property name enclosed in double quotes at character 1)",
        4: "node 'pre': row 4: column 'age' holds \"old\", not a number",
    }
    filled = Columns.configure({"columns": ["mean radius", "age"], "source": "rows", "missing": float("nan")})
    out = filled.process(Batch({"rows": rows[1:2]}, [1], ["r"]))
    assert isinstance(out, Result) and not out.errors
    assert np.isnan(out.outputs["x"][0, 0]) and out.outputs["x"][0, 1] == 3.0


def test_classify_names_thresholds_and_top_k() -> None:
    probs = np.array([[0.1, 0.5, 0.4], [0.3, 0.3, 0.4], [0.34, 0.33, 0.33]], np.float32)
    post = Classify.configure({"classes": ["a", "b", "c"], "top_k": 2, "threshold": 0.35, "abstain": "?"})
    assert post.outputs["top_classes"] == Port("BYTES", [-1, 2])
    out = post.process(Batch({"probs": probs}, [3], ["r"]))
    assert out["label"].tolist() == [1, 2, -1]
    assert out["class"].tolist() == [b"b", b"c", b"?"]
    assert out["top_classes"].tolist() == [[b"b", b"c"], [b"c", b"a"], [b"a", b"b"]]  # ties: lower index first
    np.testing.assert_array_equal(out["top_probs"], np.array([[0.5, 0.4], [0.4, 0.3], [0.34, 0.33]], np.float32))
    logits = np.log(probs)
    by_logits = Classify.configure({"classes": ["a", "b", "c"], "input": "logits"})
    np.testing.assert_allclose(by_logits.process(Batch({"logits": logits}, [3], ["r"]))["probs"], probs, atol=1e-6)
    binary = Classify.configure({"classes": ["no", "yes"], "input": "positive", "threshold": 0.2})
    out = binary.process(Batch({"positive": np.array([0.1, 0.2, 0.9], np.float32)}, [3], ["r"]))
    assert out["class"].tolist() == [b"no", b"yes", b"yes"]
    np.testing.assert_allclose(out["probs"][:, 0], [0.9, 0.8, 0.1], atol=1e-7)
    with pytest.raises(ComponentError, match="input 'positive' is for two classes"):
        Classify.configure({"classes": ["a", "b", "c"], "input": "positive"})
    with pytest.raises(ComponentError, match="top_k 4 is more than the 3 classes"):
        Classify.configure({"classes": ["a", "b", "c"], "top_k": 4})


def test_docstring_examples_run() -> None:
    for module in (tabular, postprocess, model_files):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_iris_model_trains_once_into_the_cache(empty_cache: Path) -> None:
    pytest.importorskip("xgboost")
    path = iris.ensure_model()
    assert path == empty_cache / "models" / "iris-xgb.json"
    stamp = path.stat().st_mtime_ns
    assert iris.ensure_model() == path and path.stat().st_mtime_ns == stamp  # cached: not trained again
    requests, labels = iris.sample(60, seed=3)
    assert len(requests) == 60 and set(labels) <= {0, 1, 2}
    assert sorted(requests[0]) == sorted(iris.COLUMNS) and requests[0]["petal_width"].shape == (1,)


@pytest.mark.every_broker  # issue 36: the tabular topology's outputs are checked on both brokers
async def test_tabular_topology_on_a_broker(kafka: KafkaSettings, empty_cache: Path) -> None:
    xgboost = pytest.importorskip("xgboost")
    topology = load_topology(REPO / "topologies" / "tabular.yaml")
    model = xgboost.XGBClassifier()
    model.load_model(iris.model_path())  # trained into the empty cache when the topology loaded
    x_test, _ = iris.load_split("test")
    rng = np.random.default_rng(11)
    requests = [x_test[rng.integers(0, len(x_test), rows)] for rows in (1, 7, 64, 3, 1, 2)]
    async with InlineHost(topology, kafka), TopologyClient(topology, kafka) as client:
        futures = []
        for i, x in enumerate(requests):  # all at once, so the nodes run on batches of several requests
            futures.append(client.expect(f"r{i}"))
            columns = {c: np.ascontiguousarray(x[:, j]) for j, c in enumerate(iris.COLUMNS)}
            await client.queue(columns, request_id=f"r{i}", timeout_ms=60_000)
        await client.flush()
        replies = await asyncio.wait_for(asyncio.gather(*futures), 120)
    for x, reply in zip(requests, replies, strict=True):
        assert reply.error is None, reply.error
        np.testing.assert_array_equal(reply.tensors["label"], model.predict(x))
        np.testing.assert_allclose(reply.tensors["probs"], model.predict_proba(x), atol=1e-5, rtol=0)
        assert reply.tensors["class"].tolist() == [iris.CLASSES[k].encode() for k in model.predict(x)]
