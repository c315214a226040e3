"""Broker-free parts of the gateway: status mapping, the V2 codec, the HTTP server's framing."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from flowserve.client.http import build_request
from flowserve.errors import WireError
from flowserve.gateway import status_of
from flowserve.gateway.codec import InferRequest, encode_response, parse_infer
from flowserve.gateway.server import HttpServer, Request, Response, json_response


@pytest.mark.parametrize(("reason", "status"), [
    ("deadline exceeded before node 'b'", 504),
    ("node 'outputs': inner join window of 5000 ms closed before every input arrived", 504),
    ("Fail.process failed: RuntimeError('boom')", 500),
    ("node 'a' revisited more than 3 times", 500),
    ("record of 9000 bytes exceeds max_message_bytes 4096", 413),
    ("port 'x' takes FP32, got int32", 400),
    ("Fail: row 0 holds -1.0 on 'x'", 400),
])
def test_status_of_error_results(reason: str, status: int) -> None:
    assert status_of(reason) == status


def test_binary_request_round_trip_and_errors() -> None:
    tensors = {"a": np.arange(6, dtype=np.int16).reshape(2, 3), "b": np.array([b"x", b""], dtype=object)}
    body, headers = build_request(tensors, binary=True, request_id="r")
    parsed = parse_infer(body, headers["Inference-Header-Content-Length"])
    assert parsed.id == "r"
    np.testing.assert_array_equal(parsed.tensors["a"], tensors["a"])
    assert list(parsed.tensors["b"]) == [b"x", b""]
    with pytest.raises(WireError, match="does not fit a body"):
        parse_infer(body, str(len(body) + 1))
    with pytest.raises(WireError, match="stray|after the last binary input"):
        parse_infer(body + b"\x00", headers["Inference-Header-Content-Length"])
    with pytest.raises(WireError, match="not valid JSON"):
        parse_infer(b"{", None)


def test_binary_response_layout() -> None:
    out = {"y": np.array([[1.5, 2.5]], np.float32)}
    body, n = encode_response("m", "1", "r", out, InferRequest("r", {}, {}, binary_outputs=True))
    assert n is not None and body[n:] == out["y"].tobytes()


async def _raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


@pytest.mark.asyncio(loop_scope="session")
async def test_http_framing_errors_and_keep_alive() -> None:
    async def handler(request: Request) -> Response:
        return json_response(200, {"path": request.path, "n": len(request.body)})

    server = HttpServer(handler, port=0, max_body_bytes=1024)
    await server.start()
    try:
        two = await _raw(server.port, b"POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
                                      b"GET /b HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert two.count(b"HTTP/1.1 200 OK") == 2 and b'"path":"/b"' in two
        assert b"411 Length Required" in await _raw(
            server.port, b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        big = await _raw(server.port, b"POST /a HTTP/1.1\r\nContent-Length: 5000\r\n\r\n")
        assert b"413" in big and b"larger than the limit of 1024 bytes" in big
        assert b"400 Bad Request" in await _raw(server.port, b"NONSENSE\r\n\r\n")
    finally:
        await server.stop()
