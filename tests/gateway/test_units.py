"""Broker-free parts of the gateway: status mapping, the HTTP server's framing (the V2 codec: tests/wire)."""

from __future__ import annotations

import asyncio

import pytest

from flowserve.errors import ErrorKind
from flowserve.gateway import status_of
from flowserve.gateway.app import STATUS
from flowserve.gateway.server import HttpServer, Request, Response, json_response


@pytest.mark.parametrize(("kind", "status"), [
    (ErrorKind.DEADLINE, 504),
    (ErrorKind.JOIN_TIMEOUT, 504),
    (ErrorKind.COMPONENT_FAILURE, 500),
    (ErrorKind.REVISIT_LIMIT, 500),
    (ErrorKind.OVERSIZE, 413),
    (ErrorKind.INVALID_INPUT, 400),
    (ErrorKind.REFUSED, 400),
    (ErrorKind.UNAVAILABLE, 503),
    (ErrorKind.UNKNOWN, 500),
])
def test_status_of_error_kinds(kind: ErrorKind, status: int) -> None:
    assert status_of(kind) == status


def test_every_error_kind_has_a_status() -> None:
    assert set(STATUS) == set(ErrorKind)


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
        big = await _raw(server.port, b"POST /a HTTP/1.1\r\nContent-Length: 5000\r\n\r\n")
        assert b"413" in big and b"larger than the limit of 1024 bytes" in big
        assert b"400 Bad Request" in await _raw(server.port, b"NONSENSE\r\n\r\n")
    finally:
        await server.stop()


def test_gateway_settings_name_a_bad_variable_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    from flowserve.errors import SettingsError
    from flowserve.gateway import GatewaySettings

    monkeypatch.setenv("FLOWSERVE_GATEWAY_MAX_INFLIGHT", "12")
    monkeypatch.setenv("FLOWSERVE_GATEWAY_PORT", "abc")
    assert GatewaySettings.from_env(port=0).max_inflight == 12  # the flag's port wins over the bad variable
    with pytest.raises(SettingsError, match=r"^invalid setting: FLOWSERVE_GATEWAY_PORT: Input should be a valid "):
        GatewaySettings.from_env()
