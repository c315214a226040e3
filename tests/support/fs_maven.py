"""A Maven repository on 127.0.0.1 for the jar fetch's tests: serves given files at given paths, counts requests."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType


class MavenMirror:
    """``files``: path under the repository -> its bytes, or a file to read them from. Anything else is a 404.

    >>> with MavenMirror({"g/a/1/a-1.jar": b"jar"}) as mirror:  # doctest: +SKIP
    ...     fetch_jars(target, jars, base_url=mirror.url)
    """

    def __init__(self, files: Mapping[str, bytes | Path]) -> None:
        self.files = dict(files)
        #: the paths asked for, in order
        self.requests: list[str] = []
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
                path = self.path.removeprefix("/maven2/")
                mirror.requests.append(path)
                found = mirror.files.get(path)
                if found is None:
                    self.send_error(404)
                    return
                body = found.read_bytes() if isinstance(found, Path) else found
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's signature
                pass  # quiet: a test's output is its assertions

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="maven-mirror",
                                        daemon=True)  # a short poll: shutdown() returns sooner

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/maven2/"

    def __enter__(self) -> MavenMirror:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
