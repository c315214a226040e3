"""The ``flowserve ui`` web server: a page and its JSON data endpoints, on aiohttp.

A poller per topology reads the metrics topic every ``poll_s`` seconds (and, through the injected
:class:`UiSources`, the drift and control topics) and keeps :class:`~flowserve.ui.live.LiveState`; the
page polls the JSON endpoints, so a request only ever reads memory, except a lineage look-up, which
scans the lineage topic for that one request.

Endpoints (``T`` is a topology name)::

    GET /                        the page (static, holds no data)
    GET /api/topologies          the topologies served, each with its graph
    GET /api/T/stats             per node: health, workers, lag, batch size, exec/queue p50/p99, rate,
                                 counters; the drift detectors' latest windows; recent operator actions
    GET /api/T/history?last=N    per node and per detector: the last N points
    GET /api/T/lineage?id=RID    one request's hops (RID may be shortened to a unique prefix)

With tokens set, every ``/api`` call needs ``Authorization: Bearer <token>`` (the gateway's tokens);
the page takes the token from its address's fragment (``#token=...``), which browsers never send.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from flowserve.errors import ErrorKind, FlowserveError
from flowserve.runtime.metrics import model_rows
from flowserve.topology.graph import Topology
from flowserve.ui.graph import graph_view
from flowserve.ui.live import HISTORY, LiveState

log = logging.getLogger(__name__)

Snapshots = Callable[[Topology], Awaitable[list[dict[str, Any]]]]
Drift = Callable[[Topology], Awaitable[dict[str, dict[str, Any]]]]
Lineage = Callable[[Topology, str], Awaitable[dict[str, Any]]]
Actions = Callable[[Topology], Awaitable[list[dict[str, Any]]]]

STATIC = ("index.html", "app.js", "style.css")
#: the models panel's rows: the busiest models of many-model nodes
MODELS_SHOWN = 20
_TYPES = {"html": "text/html", "js": "text/javascript", "css": "text/css"}


class UiSettings(BaseModel):
    """Where the page listens and how often it reads the topics."""

    model_config = ConfigDict(frozen=True)

    host: str = Field("127.0.0.1", description="bind address; loopback unless told otherwise")
    port: int = Field(8090, ge=0, le=65535, description="0 picks a free port")
    poll_s: float = Field(2.0, gt=0, description="seconds between reads of the metrics, drift and control topics")
    tokens: tuple[SecretStr, ...] = Field((), description="bearer tokens; none = no authentication")


@dataclass(frozen=True)
class UiSources:
    """Where the figures come from. The command line wires the capture readers in (features do not
    import each other); a source left ``None`` is a panel the page leaves out."""

    snapshots: Snapshots
    drift: Drift | None = None
    lineage: Lineage | None = None
    actions: Actions | None = None


class TopologyView:
    """One topology's graph, live state and the drift and action history, refreshed by :meth:`poll`."""

    def __init__(self, topology: Topology, sources: UiSources) -> None:
        self.topology = topology
        self.sources = sources
        self.graph = graph_view(topology)
        self.live = LiveState(list(topology.nodes))
        self.drift: dict[str, dict[str, Any]] = {}
        self.drift_history: dict[str, deque[dict[str, Any]]] = {}
        self.actions: list[dict[str, Any]] = []
        #: the busiest models of many-model nodes, with where they are placed (``model_rows``)
        self.models: list[dict[str, Any]] = []
        self.error: str | None = None

    async def poll(self) -> None:
        try:
            snaps = await self.sources.snapshots(self.topology)
            self.live.update(snaps)
            self.models = model_rows(snaps)[:MODELS_SHOWN]
            if self.sources.drift is not None:
                self._fold_drift(await self.sources.drift(self.topology))
            if self.sources.actions is not None:
                self.actions = (await self.sources.actions(self.topology))[-50:]
            self.error = None
        except (TimeoutError, FlowserveError, OSError) as exc:
            self.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - a broker hiccup must not end the page's poller
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("polling %s failed: %s", self.topology.name, self.error,
                        exc_info=log.isEnabledFor(logging.DEBUG))

    def _fold_drift(self, state: dict[str, dict[str, Any]]) -> None:
        self.drift = state
        for key, entry in state.items():
            latest = entry.get("latest", {})
            history = self.drift_history.setdefault(key, deque(maxlen=HISTORY))
            if not history or history[-1]["window"] != latest.get("window"):
                history.append({"window": latest.get("window"), "ts_ms": latest.get("ts_ms"),
                                "p_val": latest.get("p_val"), "threshold": latest.get("threshold"),
                                "is_drift": bool(latest.get("is_drift"))})

    def stats(self) -> dict[str, Any]:
        drift = {k: {"windows": v.get("windows"), "drift_windows": v.get("drift_windows"), **v.get("latest", {})}
                 for k, v in self.drift.items()}
        return {**self.live.stats(), "drift": drift, "actions": self.actions, "models": self.models,
                "error": self.error,
                "panels": {"drift": self.sources.drift is not None, "lineage": self.sources.lineage is not None,
                           "actions": self.sources.actions is not None, "models": bool(self.models)}}

    def history(self, last: int | None) -> dict[str, Any]:
        drift = {k: list(h)[-last:] if last else list(h) for k, h in self.drift_history.items()}
        return {"nodes": self.live.series(last), "drift": drift}


def _status(kind: ErrorKind) -> int:
    return 400 if kind is ErrorKind.INVALID_INPUT else 404


class UiServer:
    """The page's server. ``async with UiServer(...) as ui: ...``; ``ui.url`` is where it listens."""

    def __init__(self, topologies: Sequence[Topology], sources: UiSources, settings: UiSettings | None = None
                 ) -> None:
        self.settings = settings or UiSettings()
        self.views = {t.name: TopologyView(t, sources) for t in topologies}
        self.app = self._build_app()
        self._runner: web.AppRunner | None = None
        self._poller: asyncio.Task[None] | None = None
        self.url = ""

    def _build_app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/", self._index)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/api/topologies", self._topologies)
        app.router.add_get("/api/{topology}/stats", self._stats)
        app.router.add_get("/api/{topology}/history", self._history)
        app.router.add_get("/api/{topology}/lineage", self._lineage)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
        if self.settings.tokens and request.path.startswith("/api/"):
            given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip().encode()
            if not any(hmac.compare_digest(given, t.get_secret_value().encode()) for t in self.settings.tokens):
                return web.json_response({"error": "missing or wrong bearer token"}, status=401,
                                         headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    async def _index(self, _: web.Request) -> web.Response:
        return self._file("index.html")

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC:  # a fixed list: no path from the request reaches the file system
            raise web.HTTPNotFound()
        return self._file(name)

    @staticmethod
    def _file(name: str) -> web.Response:
        body = resources.files("flowserve.ui").joinpath("static", name).read_bytes()
        return web.Response(body=body, content_type=_TYPES[name.rsplit(".", 1)[1]], charset="utf-8",
                            headers={"Cache-Control": "no-cache"})

    def _view(self, request: web.Request) -> TopologyView:
        name = request.match_info["topology"]
        if name not in self.views:
            raise web.HTTPNotFound(text=f'{{"error": "no topology \'{name}\' here (serving: '
                                        f'{", ".join(self.views)})"}}', content_type="application/json")
        return self.views[name]

    async def _topologies(self, _: web.Request) -> web.Response:
        return web.json_response({"poll_s": self.settings.poll_s,
                                  "topologies": [v.graph for v in self.views.values()]})

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response({"now_ms": int(time.time() * 1000), **self._view(request).stats()})

    async def _history(self, request: web.Request) -> web.Response:
        try:
            last = int(request.query.get("last", "0")) or None
        except ValueError:
            return web.json_response({"error": "last must be a whole number"}, status=400)
        return web.json_response(self._view(request).history(last))

    async def _lineage(self, request: web.Request) -> web.Response:
        view = self._view(request)
        rid = request.query.get("id", "").strip()
        if view.sources.lineage is None:
            return web.json_response({"error": "lineage is not available here"}, status=404)
        if len(rid) < 4:
            return web.json_response({"error": "give at least 4 characters of a request id"}, status=400)
        try:
            return web.json_response(await view.sources.lineage(view.topology, rid))
        except FlowserveError as exc:
            return web.json_response({"error": str(exc), "kind": str(exc.kind)}, status=_status(exc.kind))

    async def poll_once(self) -> None:
        await asyncio.gather(*(v.poll() for v in self.views.values()))

    async def _poll_forever(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.settings.poll_s)

    async def __aenter__(self) -> UiServer:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{self.settings.host}:{port}"
        self._poller = asyncio.create_task(self._poll_forever())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._runner is not None:
            await self._runner.cleanup()
