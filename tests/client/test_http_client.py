"""The asynchronous V2 client retries a request whose pooled connection the server had closed, on a new
connection: another pooled one may have been closed the same way (a server's idle timeout closes them all)."""

from __future__ import annotations

import asyncio

from flowserve.client.http import AsyncHttpClient

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def test_a_retry_after_stale_pooled_connections_uses_a_new_one() -> None:
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            writer.write(RESPONSE)
            await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, AsyncHttpClient(f"http://127.0.0.1:{port}") as client:
        first = await asyncio.gather(*(client.get("/") for _ in range(3)))  # three pooled connections
        assert [r.status for r in first] == [200, 200, 200]
        for writer in writers:  # the server closes every idle connection, as its idle timeout would
            writer.close()
        await asyncio.sleep(0.05)
        reply = await client.get("/")
    assert reply.status == 200 and reply.body == b"ok"
