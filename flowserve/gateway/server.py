"""A small asyncio HTTP/1.1 server: keep-alive, ``Content-Length`` bodies, one request at a time per connection.

Chosen over aiohttp and uvicorn+starlette after measuring them on the gateway's workload (see the README's
gateway section): with the whole pipeline on two cores, per-request overhead in the HTTP layer is what
limits throughput, and a protocol-level parser with no middleware stack costs the least. It implements
only what the V2 protocol needs: no chunked request bodies (411), no TLS (put a proxy in front), no
HTTP/2. Request heads are bounded (``max_head_bytes``) and bodies are refused before they are read when
their declared length exceeds ``max_body_bytes`` (413).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

log = logging.getLogger("flowserve.gateway.http")

_REASONS = {s.value: s.phrase for s in HTTPStatus}


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: str
    #: header names lower-cased
    headers: dict[str, str]
    body: bytes


@dataclass(slots=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


def json_response(status: int, obj: object, headers: dict[str, str] | None = None) -> Response:
    return Response(status, json.dumps(obj, separators=(",", ":")).encode(), headers=headers or {})


def error_response(status: int, message: str, headers: dict[str, str] | None = None,
                   kind: str | None = None) -> Response:
    """``{"error": message}``, with the failure's machine-readable ``kind`` when there is one."""
    return json_response(status, {"error": message, "kind": kind} if kind else {"error": message}, headers)


Handler = Callable[[Request], Awaitable[Response]]


class _Connection(asyncio.Protocol):
    __slots__ = ("_buf", "_busy", "_closing", "_server", "_task", "_transport")

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._buf = bytearray()
        self._busy = False
        self._closing = False
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._server._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._connections.discard(self)
        self._closing = True
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if not self._busy:
            self._next()
        elif (len(self._buf) > self._server.max_head_bytes + self._server.max_body_bytes
              and self._transport is not None):
            # A client pipelining more than one request's worth while we work: stop reading until we are done.
            self._transport.pause_reading()

    def _next(self) -> None:
        """Parse one complete request from the buffer, if there is one, and start handling it."""
        server = self._server
        buf = self._buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > server.max_head_bytes:
                self._fail(431, "request head is larger than the server accepts")
            return
        if end > server.max_head_bytes:
            self._fail(431, "request head is larger than the server accepts")
            return
        try:
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ")
        except ValueError:
            self._fail(400, "malformed HTTP request line")
            return
        if not version.startswith("HTTP/1."):
            self._fail(505, f"{version} is not supported; use HTTP/1.1")
            return
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                self._fail(400, "malformed HTTP header line")
                return
            headers[name.lower()] = value.strip()
        if "transfer-encoding" in headers:
            self._fail(411, "chunked request bodies are not supported; send a Content-Length")
            return
        raw_length = headers.get("content-length", "0")
        if not raw_length.isdigit():
            self._fail(400, "Content-Length must be a non-negative integer")
            return
        length = int(raw_length)
        if length > server.max_body_bytes:
            self._fail(413, f"request body of {length} bytes is larger than the limit of "
                            f"{server.max_body_bytes} bytes")
            return
        start = end + 4
        if len(buf) < start + length:
            return  # wait for the rest of the body
        body = bytes(buf[start : start + length])
        del buf[: start + length]
        keep_alive = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1" or (
            headers.get("connection", "").lower() == "keep-alive")
        path, _, query = target.partition("?")
        self._busy = True
        self._task = asyncio.ensure_future(self._run(Request(method, path, query, headers, body), keep_alive))

    async def _run(self, request: Request, keep_alive: bool) -> None:
        try:
            response = await self._server.handler(request)
        except Exception:  # a handler bug answers 500 and keeps the server up
            log.exception("unhandled error answering %s %s", request.method, request.path)
            response = error_response(500, "internal error in the gateway")
        self._write(response, keep_alive)
        self._busy = False
        self._task = None
        if not keep_alive:
            self._close()
            return
        if self._transport is not None:
            self._transport.resume_reading()
        if self._buf and not self._closing:
            self._next()

    def _write(self, response: Response, keep_alive: bool) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        status = response.status
        head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
                f"Content-Type: {response.content_type}\r\nContent-Length: {len(response.body)}\r\n"]
        for name, value in response.headers.items():
            head.append(f"{name}: {value}\r\n")
        if not keep_alive:
            head.append("Connection: close\r\n")
        head.append("\r\n")
        self._transport.write("".join(head).encode("latin-1") + response.body)

    def _fail(self, status: int, message: str) -> None:
        """Answer a request that cannot be parsed, then close: the stream position is no longer known."""
        self._buf.clear()
        self._write(error_response(status, message), keep_alive=False)
        self._close()

    def _close(self) -> None:
        self._closing = True
        if self._transport is not None:
            self._transport.close()


class HttpServer:
    """Serve ``handler`` on ``host:port``. ``port=0`` picks a free port (see :attr:`port` after start)."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1", port: int = 8080, *,
                 max_body_bytes: int = 16 * 1024 * 1024, max_head_bytes: int = 64 * 1024) -> None:
        self.handler = handler
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.max_head_bytes = max_head_bytes
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), self.host, self.port,
                                                reuse_address=True, backlog=1024)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let requests in progress answer (up to ``grace_s``), close connections."""
        if self._server is None:
            return
        self._server.close()
        tasks = [c._task for c in self._connections if c._task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        for conn in list(self._connections):
            conn._close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), grace_s)
        self._server = None
