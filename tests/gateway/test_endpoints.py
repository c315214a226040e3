"""Every V2 endpoint and error status, through a real HTTP client, against a running gateway."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer

from flowserve.client.http import HttpClient
from flowserve.wire.v2 import build_request

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

# One tensor per V2 datatype, with edge values; BYTES includes empty and non-UTF-8 elements.
TENSORS = {
    "t_bool": np.array([[True, False, True]]),
    "t_uint8": np.array([[0, 1, 255]], np.uint8),
    "t_uint16": np.array([[0, 1, 65535]], np.uint16),
    "t_uint32": np.array([[0, 1, 2**32 - 1]], np.uint32),
    "t_uint64": np.array([[0, 1, 2**64 - 1]], np.uint64),
    "t_int8": np.array([[-128, 0, 127]], np.int8),
    "t_int16": np.array([[-(2**15), 0, 2**15 - 1]], np.int16),
    "t_int32": np.array([[-(2**31), 0, 2**31 - 1]], np.int32),
    "t_int64": np.array([[-(2**63), 0, 2**63 - 1]], np.int64),
    "t_fp16": np.array([[-1.5, 0.0, 65504.0]], np.float16),
    "t_fp32": np.array([[0.1, -3.25, 3.4e38]], np.float32),
    "t_fp64": np.array([[0.1, -1e-300, 1e300]], np.float64),
    "t_bytes": np.array([[b"", b"hello", "ünï".encode()]], dtype=object),
}
BINARY_BYTES = np.array([[b"\x00\xff\xfe", b"", b"x"]], dtype=object)  # not UTF-8: binary extension only


def _assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for name, array in want.items():
        assert got[name].shape == array.shape, name
        if array.dtype == object:
            assert [bytes(v) for v in got[name].reshape(-1)] == list(array.reshape(-1)), name
        else:
            assert got[name].dtype == array.dtype, name
            np.testing.assert_array_equal(got[name], array, err_msg=name)


async def test_health_and_metadata(echo) -> None:
    gateway, client = echo
    name = gateway.models and next(iter(gateway.models))
    live = await client.get("/v2/health/live")
    assert (live.status, live.json()) == (200, {"live": True})
    ready = await client.get("/v2/health/ready")
    assert (ready.status, ready.json()) == (200, {"ready": True})
    server = (await client.get("/v2")).json()
    assert server["name"] == "flowserve" and "binary_tensor_data" in server["extensions"]
    for path in (f"/v2/models/{name}", f"/v2/models/{name}/versions/1"):
        meta = await client.get(path)
        assert meta.status == 200
        body = meta.json()
        assert body["name"] == name and body["platform"] == "flowserve" and body["versions"] == ["1"]
        assert {i["name"]: (i["datatype"], i["shape"]) for i in body["inputs"]} == {
            n: (DT, [-1, -1]) for n, DT in ((n, n[2:].upper()) for n in TENSORS)}
        assert [o["name"] for o in body["outputs"]] == list(TENSORS)
    for path in (f"/v2/models/{name}/ready", f"/v2/models/{name}/versions/1/ready"):
        ready = await client.get(path)
        assert (ready.status, ready.json()) == (200, {"ready": True})


async def test_not_found_and_method(echo) -> None:
    gateway, client = echo
    name = next(iter(gateway.models))
    unknown = await client.get("/v2/models/nope")
    assert unknown.status == 404 and "unknown model 'nope'" in unknown.error
    infer_unknown = await client.infer("nope", {"x": np.ones((1, 1), np.float32)})
    assert infer_unknown.status == 404 and "unknown model 'nope'" in infer_unknown.error
    for path in (f"/v2/models/{name}/versions/7", f"/v2/models/{name}/versions/7/ready"):
        wrong = await client.get(path)
        assert wrong.status == 404 and "has no version '7'" in wrong.error
    wrong = await client.infer(name, TENSORS, version="7")
    assert wrong.status == 404 and "has no version '7'" in wrong.error
    route = await client.get("/v1/models")
    assert route.status == 404 and route.json() == {"error": route.error}
    method = await client.request("GET", f"/v2/models/{name}/infer")
    assert method.status == 405 and method.headers["allow"] == "POST"


@pytest.mark.parametrize("binary_in", [False, True])
@pytest.mark.parametrize("binary_out", [False, True])
async def test_every_datatype_round_trips_exactly(echo, binary_in: bool, binary_out: bool) -> None:
    gateway, client = echo
    name = next(iter(gateway.models))
    tensors = dict(TENSORS)
    if binary_in and binary_out:
        tensors["t_bytes"] = BINARY_BYTES
    reply = await client.infer(name, tensors, binary=binary_in, binary_outputs=binary_out, request_id="rt-1")
    assert reply.status == 200, reply.error
    body = reply.json()
    assert (body["model_name"], body["model_version"], body["id"]) == (name, "1", "rt-1")
    assert ("inference-header-content-length" in reply.headers) == binary_out
    assert [o["datatype"] for o in body["outputs"]] == [n[2:].upper() for n in TENSORS]
    _assert_same(reply.outputs(), tensors)


async def test_output_selection_and_per_output_binary(echo) -> None:
    gateway, client = echo
    name = next(iter(gateway.models))
    body, headers = build_request(TENSORS)
    doc = json.loads(body)
    doc["outputs"] = [{"name": "t_int8"}, {"name": "t_fp16", "parameters": {"binary_data": True}}]
    reply = await client.request("POST", f"/v2/models/{name}/infer", json.dumps(doc).encode(), headers)
    assert reply.status == 200, reply.error
    outs = reply.json()["outputs"]
    assert [o["name"] for o in outs] == ["t_int8", "t_fp16"]
    assert "data" in outs[0] and outs[1]["parameters"] == {"binary_data_size": 6}
    _assert_same(reply.outputs(), {"t_int8": TENSORS["t_int8"], "t_fp16": TENSORS["t_fp16"]})
    doc["outputs"] = [{"name": "nope"}]
    bad = await client.request("POST", f"/v2/models/{name}/infer", json.dumps(doc).encode(), headers)
    assert bad.status == 400 and "output 'nope'" in bad.error


async def test_request_ids_and_headers_reach_kafka(echo, broker) -> None:
    gateway, client = echo
    name = next(iter(gateway.models))
    topology = gateway.models[name]
    by_body = await client.infer(name, TENSORS, request_id="from-body", headers={"X-Request-Id": "ignored"})
    assert by_body.json()["id"] == "from-body" and by_body.headers["x-request-id"] == "from-body"
    by_header = await client.infer(name, TENSORS, headers={"X-Request-Id": "from-header", "X-Tenant": "acme",
                                                           "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"})
    assert by_header.json()["id"] == "from-header" and by_header.headers["x-request-id"] == "from-header"
    generated = await client.infer(name, TENSORS)
    rid = generated.json()["id"]
    assert len(rid) == 32 and generated.headers["x-request-id"] == rid

    consumer = AIOKafkaConsumer(topology.inputs_topic, group_id=None, auto_offset_reset="earliest",
                                fetch_max_wait_ms=5, bootstrap_servers=broker.bootstrap)
    await consumer.start()
    try:
        found: dict[str, dict[str, bytes]] = {}
        async with asyncio.timeout(30):
            while "from-header" not in found:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    found.update({r.key.decode(): dict(r.headers) for r in records})
    finally:
        await consumer.stop()
    headers = found["from-header"]
    assert headers["x-tenant"] == b"acme" and headers["x-request-id"] == b"from-header"
    assert headers["traceparent"] == ("00-" + "a" * 32 + "-" + "b" * 16 + "-01").encode()
    assert headers["fs-reply-to"] == topology.reply_topic(gateway.settings.instance).encode()
    assert int(headers["fs-deadline"]) > 0


BAD_REQUESTS = [
    (b'{"inputs": [', "not valid JSON"),
    (b"[]", "must be a JSON object"),
    (b'{"inputs": []}', "non-empty 'inputs'"),
    (b'{"id": 5, "inputs": [{"name": "t_int8", "shape": [1], "datatype": "INT8", "data": [1]}]}', "'id'"),
]


@pytest.mark.parametrize(("body", "message"), BAD_REQUESTS)
async def test_malformed_requests_are_400(echo, body: bytes, message: str) -> None:
    gateway, client = echo
    reply = await client.request("POST", f"/v2/models/{next(iter(gateway.models))}/infer", body)
    assert reply.status == 400 and message in reply.error
    assert reply.json() == {"error": reply.error, "kind": "invalid_input"}


def _with(**override: np.ndarray) -> dict[str, np.ndarray]:
    return {**TENSORS, **override}


MISMATCHES = [
    (_with(t_int8=np.ones((1, 3), np.int16)), "input 't_int8': datatype INT16 does not match the model's INT8"),
    (_with(t_fp32=np.ones((3,), np.float32)), "input 't_fp32': shape [3] does not fit the model's [-1, -1]"),
    ({k: v for k, v in TENSORS.items() if k != "t_bool"}, "input 't_bool' is missing"),
    (_with(extra=np.ones((1, 1), np.float32)), "input 'extra' is not an input of this model"),
    (_with(t_int32=np.ones((2, 3), np.int32)), "disagree on the batch dimension"),
]


@pytest.mark.parametrize(("tensors", "message"), MISMATCHES)
@pytest.mark.parametrize("binary", [False, True])
async def test_tensors_not_matching_the_ports_are_400_naming_the_input(echo, tensors, message: str,
                                                                        binary: bool) -> None:
    gateway, client = echo
    reply = await client.infer(next(iter(gateway.models)), tensors, binary=binary)
    assert reply.status == 400
    assert message in reply.error


async def test_bad_values_and_timeouts_are_400(echo) -> None:
    gateway, client = echo
    name = next(iter(gateway.models))
    doc = json.loads(build_request(TENSORS)[0])
    doc["inputs"][5]["data"] = [1, 2, 3.5]  # t_int8 gets a float
    reply = await client.request("POST", f"/v2/models/{name}/infer", json.dumps(doc).encode())
    assert reply.status == 400 and "input 't_int8'" in reply.error
    for params in ({"timeout_ms": -1}, {"timeout_ms": "soon"}):
        reply = await client.infer(name, TENSORS, parameters=params)
        assert reply.status == 400 and "timeout_ms" in reply.error
    reply = await client.infer(name, TENSORS, headers={"X-Timeout-Ms": "abc"})
    assert reply.status == 400 and "X-Timeout-Ms" in reply.error
    body, headers = build_request(TENSORS, binary=True)
    reply = await client.request("POST", f"/v2/models/{name}/infer", body[:-2], headers)
    assert reply.status == 400 and "binary" in reply.error


async def test_body_over_the_limit_is_413(echo) -> None:
    gateway, client = echo
    big = {**TENSORS, "t_uint8": np.zeros((1, 100_000), np.uint8)}
    reply = await client.infer(next(iter(gateway.models)), big, binary=True)
    assert reply.status == 413 and "larger than the limit of 65536 bytes" in reply.error
    ok = await client.infer(next(iter(gateway.models)), TENSORS)  # the client reconnects; the gateway goes on
    assert ok.status == 200


async def test_sync_client(echo) -> None:
    gateway, _ = echo
    name = next(iter(gateway.models))

    def call() -> tuple[int, dict[str, np.ndarray], int]:
        with HttpClient(gateway.url) as client:
            reply = client.infer(name, TENSORS, binary=True, binary_outputs=True)
            missing = client.get("/v2/models/nope")
            return reply.status, reply.outputs(), missing.status

    status, outputs, missing = await asyncio.to_thread(call)
    assert (status, missing) == (200, 404)
    _assert_same(outputs, TENSORS)
