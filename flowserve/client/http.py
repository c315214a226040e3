"""A small Open Inference Protocol V2 client over HTTP/1.1: sync (``http.client``) and async (asyncio).

No dependencies beyond the standard library and numpy. Both keep connections alive::

    from flowserve.client.http import HttpClient

    with HttpClient("http://127.0.0.1:8080") as client:
        reply = client.infer("digits", {"pixels": pixels})
        reply.raise_for_status()
        print(reply.outputs()["label"])

``binary=True`` sends inputs with the binary tensor data extension; ``binary_outputs=True`` asks for
binary outputs. :meth:`V2Response.outputs` decodes either form into numpy arrays. This module is the
transport only: bodies are built and read by the V2 codec, :mod:`flowserve.wire.v2`.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from flowserve.errors import FlowserveError
from flowserve.wire.v2 import HEADER_LENGTH, build_request, decode_response


class HttpError(FlowserveError):
    """A non-2xx answer; ``status`` and the server's ``{"error": ...}`` message."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"HTTP {status}: {message}")


@dataclass(slots=True)
class V2Response:
    status: int
    #: header names lower-cased
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        n = self.headers.get(HEADER_LENGTH)
        return json.loads(self.body[: int(n)] if n else self.body)

    @property
    def error(self) -> str | None:
        if self.status < 300:
            return None
        try:
            return str(self.json().get("error"))
        except (ValueError, AttributeError):
            return self.body.decode("utf-8", "replace")

    def raise_for_status(self) -> V2Response:
        if self.status >= 300:
            raise HttpError(self.status, self.error or "")
        return self

    def outputs(self) -> dict[str, np.ndarray]:
        """The response's output tensors by name (JSON or binary); :class:`WireError` when they do not decode."""
        return decode_response(self.body, self.headers.get(HEADER_LENGTH) or None)


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise FlowserveError(f"url {url!r} must look like http://host:port")
    return parts.hostname, parts.port or 80


def _infer_path(model: str, version: str | None) -> str:
    return f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"


class HttpClient:
    """Synchronous V2 client over one keep-alive connection (not thread-safe: one per thread)."""

    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 60.0) -> None:
        self.host, self.port = _host_port(url)
        self.timeout_s = timeout_s
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: Mapping[str, str] | None = None) -> V2Response:
        for attempt in (0, 1):  # a kept-alive connection the server closed meanwhile: reconnect once
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            try:
                self._conn.request(method, path, body=body, headers={**self._auth, **(headers or {})})
                resp = self._conn.getresponse()
                data = resp.read()
            except (ConnectionError, http.client.RemoteDisconnected, http.client.CannotSendRequest):
                self.close()
                if attempt:
                    raise
                continue
            hdrs = {k.lower(): v for k, v in resp.getheaders()}
            if hdrs.get("connection", "").lower() == "close":
                self.close()
            return V2Response(resp.status, hdrs, data)
        raise AssertionError("unreachable")

    def get(self, path: str) -> V2Response:
        return self.request("GET", path)

    def infer(self, model: str, tensors: Mapping[str, np.ndarray], *, version: str | None = None,
              headers: Mapping[str, str] | None = None, **kwargs: Any) -> V2Response:
        body, extra = build_request(tensors, **kwargs)
        return self.request("POST", _infer_path(model, version), body, {**extra, **(headers or {})})


class AsyncHttpClient:
    """Asynchronous V2 client: a pool of keep-alive connections, one request per connection at a time."""

    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 60.0) -> None:
        self.host, self.port = _host_port(url)
        self.timeout_s = timeout_s
        self._auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def __aenter__(self) -> AsyncHttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(self, method: str, path: str, body: bytes = b"",
                      headers: Mapping[str, str] | None = None) -> V2Response:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{self._auth}{extra}"
                f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1")
        for attempt in (0, 1):
            # A kept-alive connection the server closed meanwhile (its idle timeout) fails at once: retry on
            # a new one, not on another pooled connection that may have been closed just the same.
            reused = bool(self._idle) and not attempt
            reader, writer = self._idle.pop() if reused else await asyncio.open_connection(self.host, self.port)
            try:
                writer.write(head + body)
                response, keep = await asyncio.wait_for(_read_response(reader), self.timeout_s)
            except (ConnectionError, asyncio.IncompleteReadError):
                writer.close()
                if attempt or not reused:
                    raise
                continue
            except BaseException:
                writer.close()
                raise
            if keep:
                self._idle.append((reader, writer))
            else:
                writer.close()
            return response
        raise AssertionError("unreachable")

    async def get(self, path: str) -> V2Response:
        return await self.request("GET", path)

    async def infer(self, model: str, tensors: Mapping[str, np.ndarray], *, version: str | None = None,
                    headers: Mapping[str, str] | None = None, **kwargs: Any) -> V2Response:
        body, extra = build_request(tensors, **kwargs)
        return await self.request("POST", _infer_path(model, version), body, {**extra, **(headers or {})})


async def _read_response(reader: asyncio.StreamReader) -> tuple[V2Response, bool]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return V2Response(status, headers, body), headers.get("connection", "").lower() != "close"


__all__ = ["AsyncHttpClient", "HttpClient", "HttpError", "V2Response"]
