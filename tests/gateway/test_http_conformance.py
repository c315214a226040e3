"""HTTP/1.1 conformance of the gateway's server, spoken as raw bytes over a socket (no broker needed).

Timeouts are set small and every wait is on the server's own answer or close, never on a sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from flowserve.gateway.server import HttpServer, Request, Response, json_response

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _echo(request: Request) -> Response:
    return json_response(200, {"path": request.path, "body": request.body.decode("latin-1")})


@pytest_asyncio.fixture(loop_scope="session")
async def server() -> AsyncIterator[HttpServer]:
    srv = HttpServer(_echo, port=0, max_body_bytes=1024, max_head_bytes=2048, max_connections=8,
                     header_timeout_s=0.5, idle_timeout_s=0.5)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


async def _exchange(port: int, data: bytes) -> bytes:
    """Send ``data``, read until the server closes (bounded, so a server that never closes fails the test)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def test_chunked_request_body_is_accepted(server: HttpServer) -> None:
    out = await _exchange(server.port, b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                                       b"3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\nTrailer: x\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 OK") and b'"body":"abcdefg"' in out


async def test_chunked_then_keep_alive_request(server: HttpServer) -> None:
    out = await _exchange(server.port, b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
                                       b"GET /b HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert out.count(b"HTTP/1.1 200 OK") == 2 and b'"body":"hi"' in out and b'"path":"/b"' in out


async def test_chunked_body_over_the_limit_is_413(server: HttpServer) -> None:
    chunk = b"400\r\n" + b"x" * 1024 + b"\r\n"
    out = await _exchange(server.port, b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 2)
    assert out.startswith(b"HTTP/1.1 413")


@pytest.mark.parametrize(("head", "status"), [
    # request smuggling shapes: both framings, duplicate or conflicting or list-valued lengths
    (b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", b"400"),
    (b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n", b"400"),
    (b"Content-Length: 3\r\nContent-Length: 4\r\n", b"400"),
    (b"Content-Length: 3\r\nContent-Length: 3\r\n", b"400"),
    (b"Content-Length: 3, 3\r\n", b"400"),
    (b"Content-Length: +3\r\n", b"400"),
    (b"Content-Length: -1\r\n", b"400"),
    (b"Transfer-Encoding : chunked\r\n", b"400"),
    (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", b"400"),
    (b"Transfer-Encoding: chunked, gzip\r\n", b"400"),
    (b" Content-Length: 3\r\n", b"400"),
    # codings the server does not decode
    (b"Transfer-Encoding: gzip, chunked\r\n", b"501"),
])
async def test_ambiguous_framing_is_refused_and_closed(server: HttpServer, head: bytes, status: bytes) -> None:
    out = await _exchange(server.port, b"POST /a HTTP/1.1\r\n" + head + b"\r\n3\r\nabc\r\n0\r\n\r\n"
                                       b"GET /smuggled HTTP/1.1\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 " + status), out
    assert b"/smuggled" not in out and out.count(b"HTTP/1.1 ") == 1


async def test_bare_lf_and_http2_are_refused(server: HttpServer) -> None:
    assert (await _exchange(server.port, b"GET / HTTP/1.1\nHost: x\n\n")).startswith(b"HTTP/1.1 400")
    assert (await _exchange(server.port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")).startswith(b"HTTP/1.1 400")


async def test_large_head_is_431(server: HttpServer) -> None:
    out = await _exchange(server.port, b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 431")


async def test_partial_head_times_out_with_408(server: HttpServer) -> None:
    out = await _exchange(server.port, b"GET / HTTP/1.1\r\nHost: x\r\n")
    assert out.startswith(b"HTTP/1.1 408") and b"Connection: close" in out


async def test_trickled_head_is_not_kept_alive_by_its_trickle(server: HttpServer) -> None:
    """A header line every 50 ms does not reset the head's deadline: the server answers 408 and closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET / HTTP/1.1\r\n")
    read = asyncio.ensure_future(reader.read())
    sent = 0
    try:
        while not read.done():
            writer.write(b"X-Line-%d: y\r\n" % sent)
            sent += 1
            await asyncio.wait({read}, timeout=0.05)  # pacing of the trickle, not synchronisation
            assert sent < 400, "the server held a trickling head open for 20 s"
        assert read.result().startswith(b"HTTP/1.1 408")
    finally:
        read.cancel()
        writer.close()


async def test_stalled_body_times_out(server: HttpServer) -> None:
    out = await _exchange(server.port, b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
    assert out.startswith(b"HTTP/1.1 408")


async def test_idle_keep_alive_connection_is_closed(server: HttpServer) -> None:
    out = await _exchange(server.port, b"GET /a HTTP/1.1\r\n\r\n")  # keep-alive: the server closes when idle
    assert out.count(b"HTTP/1.1 200 OK") == 1
    assert await _exchange(server.port, b"") == b""  # a connection that never sends is closed too


async def test_connections_beyond_the_bound_are_refused(server: HttpServer) -> None:
    held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(server.max_connections)]
    try:
        # the 8 held connections are counted once the server has accepted them: a request on each proves it
        for reader, writer in held:
            writer.write(b"GET /held HTTP/1.1\r\n\r\n")
            assert (await asyncio.wait_for(reader.readuntil(b"}"), 10)).startswith(b"HTTP/1.1 200")
        assert server.open_connections == server.max_connections
        out = await _exchange(server.port, b"GET / HTTP/1.1\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 503") and b"Retry-After" in out
    finally:
        for _, writer in held:
            writer.close()


async def test_expect_100_continue(server: HttpServer) -> None:
    out = await _exchange(server.port, b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n"
                                       b"Connection: close\r\n\r\nok")
    assert out.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")


async def test_pipelined_requests_are_answered_in_order(server: HttpServer) -> None:
    many = b"".join(b"GET /%d HTTP/1.1\r\n\r\n" % i for i in range(40))
    many += b"GET /last HTTP/1.1\r\nConnection: close\r\n\r\n"
    out = await _exchange(server.port, many)
    paths = [int(p.split(b'"')[0]) for p in out.split(b'"path":"/')[1:-1]]
    assert paths == list(range(40)) and out.count(b"HTTP/1.1 200 OK") == 41
