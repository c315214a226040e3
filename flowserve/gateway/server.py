"""A small asyncio HTTP/1.1 server on llhttp (httptools): keep-alive, pipelining, chunked request bodies.

Chosen over aiohttp and uvicorn+starlette after measuring them on the gateway's workload (docs/gateway.md,
"Clients and server", says where the figures are): per-request overhead in the HTTP layer is what limits
throughput on two cores, and a protocol-level server with no middleware stack costs the least.
Framing is llhttp's (Node.js's parser), not ours: it refuses the request-smuggling shapes
(``Content-Length`` with ``Transfer-Encoding``, duplicate or malformed lengths, bare LF line ends, spaces
before a colon); this module adds only what llhttp leaves to the server:

- bounds: request heads (``max_head_bytes``, 431), bodies (``max_body_bytes``, 413, refused before they
  are read when a length is declared), open connections (``max_connections``; one more is answered 503 and
  closed), pipelined requests queued per connection (reading pauses beyond them);
- time: a request head must arrive whole within ``header_timeout_s`` of its first byte (408), however
  slowly it trickles; a body may not stall for ``idle_timeout_s``; a keep-alive connection with no request
  is closed after ``idle_timeout_s``;
- transfer codings other than ``chunked`` are refused (501); no TLS (put a proxy in front), no HTTP/2.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

import httptools

log = logging.getLogger("flowserve.gateway.http")

_REASONS = {s.value: s.phrase for s in HTTPStatus}
#: complete requests a pipelining client may have queued on one connection before reading pauses
_MAX_QUEUED = 16
_NEVER = float("inf")
#: how long a connection closed after a refusal keeps reading (and dropping) what its client still sends
_LINGER_S = 2.0


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: str
    #: header names lower-cased; repeated headers joined with ", " (RFC 9110 5.3)
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


class _Refuse(Exception):
    """Raised from a parser callback: answer ``status`` with ``message`` and close the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Connection(asyncio.Protocol):
    """One client connection: llhttp calls the ``on_*`` methods as it parses; requests are answered in order."""

    __slots__ = ("_body", "_body_len", "_closing", "_deadline", "_failure", "_head_len", "_headers",
                 "_in_message", "_loop", "_on_expire", "_parser", "_queue", "_server", "_task", "_transport", "_url")

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        #: when the current timeout runs out (loop time; inf: none), and what to do then; checked by the
        #: server's sweep rather than a timer per request, which cost more than the parsing
        self._deadline = _NEVER
        self._on_expire: Callable[[], None] | None = None
        self._queue: collections.deque[tuple[Request, bool]] = collections.deque()
        self._failure: tuple[int, str] | None = None  # a parse error to answer once queued requests are
        self._closing = False
        self._in_message = False
        self._url = b""
        self._headers: dict[str, str] = {}
        self._head_len = 0
        self._body: list[bytes] = []
        self._body_len = 0

    # -- transport events --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        server = self._server
        if len(server._connections) >= server.max_connections:
            # Refuse rather than hold: a client told 503 can go elsewhere; one left waiting ties up a socket.
            self._write(error_response(503, f"the gateway holds its limit of {server.max_connections} "
                                            "connections; retry later", {"Retry-After": "1"}), keep_alive=False)
            self._close()
            return
        server._connections.add(self)
        self._arm(server.idle_timeout_s, self._on_idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._connections.discard(self)
        self._closing = True
        self._transport = None
        self._disarm()

    def data_received(self, data: bytes) -> None:
        if self._closing or self._failure is not None:
            return
        if self._in_message and self._deadline != _NEVER and self._headers_done():
            self._arm(self._server.idle_timeout_s, self._on_idle)  # a body that is still moving
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(505, "protocol upgrades and HTTP/2 are not supported; use HTTP/1.1")
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _Refuse):
                self._refuse(cause.status, cause.message)
            else:  # a bug in a callback: answer, close, keep the server up
                log.error("HTTP callback failed", exc_info=cause)
                self._refuse(500, "internal error in the gateway's HTTP layer")
        except httptools.HttpParserError as exc:
            self._refuse(400, f"malformed HTTP request: {exc}")
        else:
            if len(self._queue) >= _MAX_QUEUED and self._transport is not None:
                self._transport.pause_reading()
        self._pump()

    # -- llhttp callbacks --------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_message = True
        self._url = b""
        self._headers = {}
        self._head_len = 0
        self._body = []
        self._body_len = 0
        self._arm(self._server.header_timeout_s, self._on_header_timeout)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self._headers.get(key)
        self._headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        server = self._server
        self._head_len = -1  # marks "head complete" for the timers
        coding = self._headers.get("transfer-encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            raise _Refuse(501, f"transfer coding '{coding}' is not supported; send chunked or a Content-Length")
        length = self._headers.get("content-length")
        if length is not None and int(length) > server.max_body_bytes:  # llhttp has checked the digits
            raise _Refuse(413, f"request body of {length} bytes is larger than the limit of "
                               f"{server.max_body_bytes} bytes")
        if self._headers.get("expect", "").lower() == "100-continue" and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._arm(server.idle_timeout_s, self._on_idle)

    def on_body(self, body: bytes) -> None:
        self._body_len += len(body)
        if self._body_len > self._server.max_body_bytes:
            raise _Refuse(413, f"request body is larger than the limit of {self._server.max_body_bytes} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        self._head_len = 0
        self._disarm()
        url = httptools.parse_url(self._url)
        path = url.path.decode("latin-1") if url.path else "/"
        query = url.query.decode("latin-1") if url.query else ""
        keep_alive = self._parser.should_keep_alive()
        method = self._parser.get_method().decode("latin-1")
        self._queue.append((Request(method, path, query, self._headers, b"".join(self._body)), keep_alive))
        self._body = []

    # -- answering ---------------------------------------------------------------------------------

    def _pump(self) -> None:
        """Start on the next queued request, or answer a pending parse error once the queue is empty."""
        if self._task is not None or self._closing:
            return
        if self._queue:
            request, keep_alive = self._queue.popleft()
            self._task = asyncio.ensure_future(self._run(request, keep_alive))
        elif self._failure is not None:
            status, message = self._failure
            self._write(error_response(status, message), keep_alive=False)
            self._close(linger=True)

    async def _run(self, request: Request, keep_alive: bool) -> None:
        try:
            response = await self._server.handler(request)
        except Exception:  # a handler bug answers 500 and keeps the server up
            log.exception("unhandled error answering %s %s", request.method, request.path)
            response = error_response(500, "internal error in the gateway")
        self._write(response, keep_alive)
        self._task = None
        if not keep_alive:
            self._close(linger=True)
            return
        if self._transport is not None and len(self._queue) < _MAX_QUEUED:
            self._transport.resume_reading()
        if not self._queue and not self._in_message and self._failure is None:
            self._arm(self._server.idle_timeout_s, self._on_idle)
        self._pump()

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

    def _refuse(self, status: int, message: str) -> None:
        """Stop parsing (the stream position is no longer known); answer after the requests queued before."""
        self._disarm()
        self._failure = (status, message)
        if self._transport is not None:
            self._transport.pause_reading()

    def _close(self, *, linger: bool = False) -> None:
        """Close the connection; ``linger``: after the last response, half-close first and read (dropping
        it) what the client still sends for up to ``_LINGER_S``.

        Closing a socket whose input was not all read makes the kernel answer with a reset, and a reset can
        destroy the response just written before the client reads it (the "TCP reset problem" of RFC 9112
        section 9.6). A client still sending after a refusal (a trickled head, a body we will not read) is
        exactly that case, so those responses end with a lingering close, as nginx's ``lingering_close``.
        """
        self._closing = True
        self._disarm()
        transport = self._transport
        if transport is None:
            return
        if linger and transport.can_write_eof():
            transport.write_eof()
            transport.resume_reading()  # data_received drops input once closing
            self._arm(_LINGER_S, self._close)  # the client's own close usually comes first
        else:
            transport.close()

    # -- timers ------------------------------------------------------------------------------------

    def _headers_done(self) -> bool:
        return self._head_len < 0

    def _count_head(self, n: int) -> None:
        self._head_len += n
        if self._head_len > self._server.max_head_bytes:
            raise _Refuse(431, "request head is larger than the server accepts")

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        self._deadline = self._loop.time() + delay
        self._on_expire = callback

    def _disarm(self) -> None:
        self._deadline = _NEVER

    def expire(self, now: float) -> None:
        """Called by the server's sweep: run the timeout's action if its deadline has passed."""
        if now >= self._deadline and self._on_expire is not None:
            self._deadline = _NEVER
            self._on_expire()

    def _on_header_timeout(self) -> None:
        self._refuse(408, f"the request head did not arrive within {self._server.header_timeout_s:g} s")
        self._pump()

    def _on_idle(self) -> None:
        if self._task is not None:
            return  # a request is being answered: its response re-arms the timer
        if self._in_message:  # a body that stalled
            self._refuse(408, f"the request body stalled for {self._server.idle_timeout_s:g} s")
            self._pump()
        else:
            self._close()


class HttpServer:
    """Serve ``handler`` on ``host:port``. ``port=0`` picks a free port (see :attr:`port` after start)."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1", port: int = 8080, *,
                 max_body_bytes: int = 16 * 1024 * 1024, max_head_bytes: int = 64 * 1024,
                 max_connections: int = 10_000, header_timeout_s: float = 10.0,
                 idle_timeout_s: float = 60.0, reuse_port: bool = False) -> None:
        self.handler = handler
        #: SO_REUSEPORT: several processes listen on one port and the kernel spreads connections over them
        self.reuse_port = reuse_port
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.max_head_bytes = max_head_bytes
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), self.host, self.port,
                                                reuse_address=True, reuse_port=self.reuse_port or None,
                                                backlog=1024)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        self._sweep()

    def _sweep(self) -> None:
        """Expire the connections whose timeout has run out; timeouts fire up to one tick late."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for conn in list(self._connections):
            conn.expire(now)
        tick = min(self.header_timeout_s, self.idle_timeout_s, 4.0) / 4
        self._sweeper = loop.call_later(tick, self._sweep)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let requests in progress answer (up to ``grace_s``), close connections."""
        if self._server is None:
            return
        self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        tasks = [c._task for c in self._connections if c._task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        for conn in list(self._connections):
            conn._close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), grace_s)
        self._server = None
