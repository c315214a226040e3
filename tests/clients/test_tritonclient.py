"""NVIDIA's tritonclient (HTTP) against the gateway: liveness, readiness, model metadata, and inference
with JSON and with binary tensor data (the V2 binary extension), results asked for both ways."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import numpy as np
import pytest
from fs_clients import Served

httpclient = pytest.importorskip("tritonclient.http")

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def _client(served: Served):  # noqa: ANN202
    return httpclient.InferenceServerClient(url=urlsplit(served.url).netloc, network_timeout=60.0)


def _health_and_metadata(served: Served) -> tuple[bool, bool, bool, dict]:
    client = _client(served)
    try:
        name = served.topology.name
        return (client.is_server_live(), client.is_server_ready(), client.is_model_ready(name),
                client.get_model_metadata(name))
    finally:
        client.close()


def _infer(served: Served, x: np.ndarray, *, binary_in: bool, binary_out: bool) -> np.ndarray:
    client = _client(served)
    try:
        tensor = httpclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary_in)
        result = client.infer(served.topology.name, [tensor], request_id="triton-1",
                              outputs=[httpclient.InferRequestedOutput("y", binary_data=binary_out)])
        assert result.get_response()["id"] == "triton-1"
        return result.as_numpy("y")
    finally:
        client.close()


async def test_tritonclient_health_and_metadata(served: Served) -> None:
    live, ready, model_ready, metadata = await asyncio.to_thread(_health_and_metadata, served)
    assert (live, ready, model_ready) == (True, True, True)
    assert metadata["name"] == served.topology.name
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [("x", "FP32", [-1, 4])]
    assert [t["name"] for t in metadata["outputs"]] == ["y"]


@pytest.mark.parametrize(("binary_in", "binary_out"), [(False, False), (True, True), (True, False), (False, True)])
async def test_tritonclient_infers_json_and_binary(served: Served, binary_in: bool, binary_out: bool) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    y = await asyncio.to_thread(_infer, served, x, binary_in=binary_in, binary_out=binary_out)
    np.testing.assert_array_equal(y, x + 1)
