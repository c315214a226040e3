"""The gateway's HTTP framing, llhttp (httptools) vs the hand-written parser it replaced, in the same run.

Both parse the same bytes: keep-alive V2 infer requests (a head of typical headers and a JSON body),
in interleaved slices so that drift in this machine's speed falls on both alike; the figure is CPU
microseconds per request, median over slices. Also counts which request-smuggling shapes each refuses::

    python -m flowserve.bench.http_parse [REQUESTS_PER_SLICE] [SLICES]
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import httptools

_BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64],
                                "data": [0.5] * 64}]}).encode()
_REQUEST = (b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: bench\r\n"
            b"Accept: */*\r\nContent-Type: application/json\r\nAuthorization: Bearer abcdef0123456789\r\n"
            b"Content-Length: %d\r\n\r\n" % len(_BODY)) + _BODY

#: (name, request) shapes an HTTP/1.1 server must refuse (RFC 9112 6.1, 6.3)
SMUGGLING = [
    ("CL with TE", b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"),
    ("conflicting CL", b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n"),
    ("duplicate CL", b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n"),
    ("CL list", b"POST / HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\n"),
    ("space before colon", b"POST / HTTP/1.1\r\nContent-Length : 3\r\n\r\n"),
    ("obs-fold", b"POST / HTTP/1.1\r\nX: a\r\n b\r\nContent-Length: 3\r\n\r\n"),
    ("bare LF", b"POST / HTTP/1.1\nContent-Length: 3\n\n"),
    ("TE not last chunked", b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"),
]


def handwritten(buf: bytearray) -> int:
    """The framing step of the server before llhttp (flowserve 2026-11-30), reduced to parse-and-consume.

    Returns how many requests it took from ``buf``; raises ValueError where the old server answered 4xx.
    """
    n = 0
    while True:
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return n
        lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
        if not version.startswith("HTTP/1."):
            raise ValueError("version")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise ValueError("header line")
            headers[name.lower()] = value.strip()
        if "transfer-encoding" in headers:
            raise ValueError("chunked")
        raw_length = headers.get("content-length", "0")
        if not raw_length.isdigit():
            raise ValueError("length")
        length = int(raw_length)
        start = end + 4
        if len(buf) < start + length:
            return n
        _body = bytes(buf[start : start + length])
        del buf[: start + length]
        target.partition("?")
        n += 1


class _Sink:
    """The callbacks the gateway's server implements, doing the same work (collect head and body)."""

    __slots__ = ("body", "headers", "n", "parser", "url")

    def __init__(self) -> None:
        self.n = 0
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.parser = httptools.HttpRequestParser(self)

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        httptools.parse_url(self.url)
        self.parser.should_keep_alive()
        self.parser.get_method()
        b"".join(self.body)
        self.n += 1


def _slice_llhttp(data: bytes, chunk: int) -> float:
    sink = _Sink()
    t = time.process_time()
    for i in range(0, len(data), chunk):
        sink.parser.feed_data(data[i : i + chunk])
    return time.process_time() - t


def _slice_handwritten(data: bytes, chunk: int) -> float:
    buf = bytearray()
    t = time.process_time()
    for i in range(0, len(data), chunk):
        buf += data[i : i + chunk]
        handwritten(buf)
    return time.process_time() - t


def refuses(parse: Any, raw: bytes) -> bool:
    try:
        parse(raw + b"abc")
    except (ValueError, httptools.HttpParserError):
        return True
    return False


def _llhttp_once(raw: bytes) -> None:
    _Sink().parser.feed_data(raw)


def http_parse(requests: int = 20_000, slices: int = 10) -> dict[str, Any]:
    data = _REQUEST * requests
    per: dict[str, list[float]] = {"llhttp": [], "handwritten": []}
    for s in range(slices):
        order = [("llhttp", _slice_llhttp), ("handwritten", _slice_handwritten)]
        for name, fn in order if s % 2 == 0 else order[::-1]:
            per[name].append(fn(data, 64 * 1024) / requests * 1e6)
    med = {k: sorted(v)[len(v) // 2] for k, v in per.items()}
    strict = {name: sum(refuses(fn, raw) for _, raw in SMUGGLING)
              for name, fn in (("llhttp", _llhttp_once), ("handwritten", lambda r: handwritten(bytearray(r))))}
    return {"us_per_request": med, "refused_of": len(SMUGGLING), "refused": strict,
            "ratio_llhttp_over_handwritten": med["llhttp"] / med["handwritten"]}


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    requests = int(args[0]) if args else 20_000
    slices = int(args[1]) if len(args) > 1 else 10
    result = http_parse(requests, slices)
    us = result["us_per_request"]
    print(f"{len(_REQUEST)}-byte keep-alive infer requests, {requests} per slice, {slices} interleaved slices")
    print(f"  llhttp (httptools)  {us['llhttp']:.2f} us/request   refuses {result['refused']['llhttp']}"
          f"/{result['refused_of']} smuggling shapes")
    print(f"  hand-written        {us['handwritten']:.2f} us/request   refuses {result['refused']['handwritten']}"
          f"/{result['refused_of']} smuggling shapes")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
