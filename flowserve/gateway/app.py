"""The V2 gateway: routes, authentication, admission, deadlines, and the mapping of errors to statuses.

Domain errors (:mod:`flowserve.errors`) and error results from the pipeline become HTTP statuses here and
nowhere else. Every error body is ``{"error": "..."}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Sequence
from typing import Any

from flowserve.errors import BrokerError, DeadlineExceeded, ErrorKind, FlowserveError, WireError
from flowserve.gateway.admission import check_inputs
from flowserve.gateway.bridge import KafkaBridge
from flowserve.gateway.cache import CACHE_HEADER, ResponseCache
from flowserve.gateway.explain import ExplanationWatch
from flowserve.gateway.health import Readiness, ReadinessProbe
from flowserve.gateway.repository import Repository, hosted_models
from flowserve.gateway.server import HttpServer, Request, Response, error_response, json_response
from flowserve.gateway.settings import GatewaySettings
from flowserve.gateway.tokens import Authorizer
from flowserve.kafka.replies import Reply
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.heap import settle
from flowserve.topology.graph import Topology
from flowserve.wire.envelope import (
    H_EXPLAIN,
    H_MODEL,
    H_RECONSTRUCTED,
    H_REPLY_TO,
    H_SERVED_BY,
    make_headers,
    new_request_id,
    new_traceparent,
    now_ms,
)
from flowserve.wire.feedback import decode_feedback, encode_feedback
from flowserve.wire.tensors import encode_tensors
from flowserve.wire.v2 import HEADER_LENGTH, InferRequest, encode_response, parse_infer

log = logging.getLogger("flowserve.gateway")

EXTENSIONS = ["binary_tensor_data", "health", "model_repository", "model_repository_metadata"]
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
_OPEN_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
#: how often readiness is probed while a model is refused (else every ``ready_cache_s``)
_RECOVER_POLL_S = 0.2


#: The HTTP status of each kind of failure: the one place where errors become statuses.
STATUS: dict[ErrorKind, int] = {
    ErrorKind.INVALID_INPUT: 400,      # the caller's input: it does not fit a port, or a component rejected it
    ErrorKind.OVERSIZE: 413,
    ErrorKind.REFUSED: 400,            # cannot finish before its deadline as asked
    ErrorKind.DEADLINE: 504,
    ErrorKind.JOIN_TIMEOUT: 504,
    ErrorKind.COMPONENT_FAILURE: 500,
    ErrorKind.REVISIT_LIMIT: 500,      # a topology fault, not the caller's
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.UNAUTHORIZED: 401,       # no valid bearer token
    ErrorKind.FORBIDDEN: 403,          # a valid token without the right to this model or action
    ErrorKind.RATE_LIMITED: 429,       # a token over its own rate limit (with Retry-After)
    ErrorKind.INVALID_TOPOLOGY: 500,
    ErrorKind.INVALID_SETTINGS: 500,   # the service's own configuration, not the caller's
    ErrorKind.UNKNOWN: 500,
}


def status_of(kind: ErrorKind) -> int:
    """The HTTP status for a failure of this kind (500 for a kind the table does not know)."""
    return STATUS.get(kind, 500)


class Gateway:
    """Serves the given topologies as V2 models. ``await gateway.start()``, then ``await gateway.stop()``."""

    def __init__(self, topologies: Sequence[Topology], kafka: KafkaSettings,
                 settings: GatewaySettings | None = None) -> None:
        self.settings = settings or GatewaySettings()
        names = [t.name for t in topologies]
        if len(set(names)) != len(names):
            raise WireError(f"two topologies share a name: {names}")
        self.models = {t.name: t for t in topologies}
        #: the models of many-model nodes, each served as a V2 model of its own (flowserve.gateway.repository)
        self.hosted = hosted_models(topologies)
        self.repository = Repository(self.models, self.hosted, kafka, self._not_ready)
        self.kafka = kafka
        self.bridge = KafkaBridge(list(topologies), kafka, self.settings.instance)
        self.probe = ReadinessProbe(list(topologies), kafka, self.settings.ready_cache_s)
        self.server = HttpServer(self.handle, self.settings.host, self.settings.port,
                                 max_body_bytes=self.settings.max_body_bytes,
                                 max_connections=self.settings.max_connections,
                                 header_timeout_s=self.settings.header_timeout_s,
                                 idle_timeout_s=self.settings.idle_timeout_s,
                                 reuse_port=self.settings.reuse_port)
        #: who may do what (flowserve.gateway.tokens); counts every refusal
        self.auth = Authorizer(self.settings.tokens, self.settings.grants, served=[*self.models, *self.hosted])
        self._metadata = {name: self._model_metadata(t) for name, t in self.models.items()}
        #: answers of topologies with a top-level ``cache:`` (flowserve.gateway.cache)
        self.responses = ResponseCache(list(topologies))
        #: model -> why it cannot answer now (a stage without any worker); refreshed by _watch_readiness
        self._down: dict[str, str] = {}
        self._watch: asyncio.Task[None] | None = None
        self._publisher: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.server.port}"

    async def start(self) -> None:
        await self.bridge.start()
        await self.server.start()
        if self.settings.fail_fast:
            self._watch = asyncio.create_task(self._watch_readiness(), name="gateway-readiness")
        if self.auth.enabled and self.settings.metrics_interval_s > 0:
            self._publisher = asyncio.create_task(self._publish_loop(), name="gateway-refusals")
        settle()
        for name, models in self.auth.unknown_models().items():  # a typo grants nothing: say so
            log.warning("gateway %s: token '%s' names model(s) not served here: %s", self.settings.instance,
                        name, ", ".join(models))
        log.info("gateway %s serving %s on %s (auth %s)", self.settings.instance, ", ".join(self.models),
                 self.url, "on" if self.auth.enabled else "off")

    async def stop(self) -> None:
        for task in (self._watch, self._publisher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._watch = self._publisher = None
        if any(self.auth.counts().values()):  # the last counts, which a stop between two ticks would lose
            await self.publish_refusals(timeout_s=2.0)
        await self.server.stop()
        await self.bridge.stop(delete_topics=self.settings.delete_reply_topics)
        await self.probe.close()

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- routing -----------------------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        path = request.path.rstrip("/") or "/"
        if path not in _OPEN_PATHS and (refusal := self.auth.check(path, request.headers.get("authorization", ""))):
            headers = {}
            if refusal.kind is ErrorKind.UNAUTHORIZED:
                headers["WWW-Authenticate"] = 'Bearer realm="flowserve"'
            elif refusal.kind is ErrorKind.RATE_LIMITED:
                headers["Retry-After"] = str(refusal.retry_after_s)
            return error_response(status_of(refusal.kind), refusal.message, headers, refusal.kind)
        parts = path.split("/")[1:]
        if not parts or parts[0] != "v2":
            return error_response(404, f"no route {request.path}; the API lives under /v2")
        rest = parts[1:]
        if not rest:
            return self._only(request, "GET") or json_response(200, {
                "name": "flowserve", "version": _version(), "extensions": EXTENSIONS})
        if rest == ["health", "live"]:
            return self._only(request, "GET") or json_response(200, {"live": True})
        if rest == ["health", "ready"]:
            return self._only(request, "GET") or await self._ready(None)
        if rest == ["gateway", "stats"]:
            return self._only(request, "GET") or json_response(200, self.stats())
        if rest[0] == "repository":
            return await self.repository.handle(rest[1:], request)
        if rest[0] != "models" or len(rest) < 2:
            return error_response(404, f"no route {request.path}")
        name = rest[1]
        topology = self.models.get(name)
        model = None  # a model of a many-model node: its topology's route, the model named in fs-model
        if topology is None and name in self.hosted:
            topology, model = self.hosted[name][0], name
        if topology is None:
            return error_response(404, f"unknown model '{name}' (models: {', '.join(self.models)})")
        tail = rest[2:]
        if len(tail) >= 2 and tail[0] == "versions":
            if tail[1] != topology.version:
                return error_response(404, f"model '{name}' has no version '{tail[1]}' "
                                           f"(versions: {topology.version})")
            tail = tail[2:]
        if not tail:
            return self._only(request, "GET") or json_response(200, {**self._metadata[topology.name], "name": name})
        if tail == ["ready"]:
            return self._only(request, "GET") or await self._ready(topology.name)
        if tail == ["infer"]:
            return self._only(request, "POST") or await self._infer(topology, request, model)
        if tail == ["feedback"]:
            return self._only(request, "POST") or await self._feedback(topology, request)
        if tail == ["explain"]:
            return self._only(request, "POST") or await self._explain(topology, request)
        return error_response(404, f"no route {request.path}")

    @staticmethod
    def _only(request: Request, method: str) -> Response | None:
        if request.method == method:
            return None
        return error_response(405, f"{request.method} is not allowed on {request.path}; use {method}",
                              {"Allow": method})

    def stats(self) -> dict[str, Any]:
        return {"instance": self.settings.instance, "in_flight": self.bridge.in_flight(),
                **self.bridge.counters.snapshot(), "cache": self.responses.counters(),
                "refusals": self.auth.snapshot()}

    # -- refusal counters for flowserve stats ------------------------------------------------------

    async def publish_refusals(self, timeout_s: float = 10.0) -> None:
        """Write this gateway's refusal counts to each model's metrics topic, where ``flowserve stats``
        reads them: a snapshot keyed ``gateway/<instance>``, role ``gateway``, and no node (so that
        readers of the workers' snapshots, which go by node, pass it by). Best effort, as the workers'."""
        for name, topology in self.models.items():
            snap = {"topology": name, "role": "gateway", "node": "", "worker": self.settings.instance,
                    "ts_ms": now_ms(), "counters": self.auth.counts(name),
                    "unattributed": self.auth.counts("")}  # refusals on paths naming no served model
            try:
                await self.bridge.router.send(topology.metrics_topic, f"gateway/{self.settings.instance}".encode(),
                                              json.dumps(snap).encode(), [], timeout_s)
            except BrokerError as exc:  # counters must never stop the gateway
                log.debug("gateway %s: refusal counters not published: %r", self.settings.instance, exc)

    async def _publish_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.metrics_interval_s)  # publishing period, not synchronisation
            await self.publish_refusals()

    # -- health and metadata -----------------------------------------------------------------------

    async def _ready(self, name: str | None) -> Response:
        states = await self._readiness()
        chosen = [states[name]] if name is not None else list(states.values())
        bad = [s.reason for s in chosen if not s.ready]
        if bad:
            return error_response(503, "not ready: " + "; ".join(bad))
        return json_response(200, {"ready": True})

    async def _not_ready(self) -> dict[str, str]:
        """Topology -> why it cannot answer now (the repository index's ``UNAVAILABLE``)."""
        return {name: s.reason for name, s in (await self._readiness()).items() if not s.ready}

    @staticmethod
    def _model_metadata(t: Topology) -> dict[str, Any]:
        return {
            "name": t.name,
            "versions": [t.version],
            "platform": "flowserve",
            "inputs": [{"name": n, "datatype": p.datatype, "shape": list(p.shape)} for n, p in t.inputs.items()],
            "outputs": [{"name": n, "datatype": p.datatype, "shape": list(p.shape)}
                        for n, p in t.output_ports().items()],
        }

    async def _readiness(self, max_age_s: float | None = None) -> dict[str, Readiness]:
        """Probe (or reuse a recent answer) and bring :attr:`_down` up to date with it.

        Every fresh answer updates what requests read, whoever asked: a caller told "ready" by
        ``/v2/.../ready`` is not then refused by a mark the watcher has not yet lifted.
        """
        states = await self.probe.check(max_age_s)
        down = {name: s.reason for name, s in states.items() if s.dead}
        if self.settings.fail_fast and down != self._down:
            for name in down.keys() - self._down.keys():
                log.warning("refusing requests to model '%s' (503) until it recovers: %s", name, down[name])
            for name in self._down.keys() - down.keys():
                log.info("model '%s' has a worker in every stage again: accepting requests", name)
            self._down = down
        return states

    async def _watch_readiness(self) -> None:
        """Keep :attr:`_down` current, off the request path: a request reads it and never awaits a probe.

        While a model is refused the probe runs every 0.2 s, so that it is accepted again soon after its
        worker joins (one FindCoordinator and one DescribeGroups per group: cheap at that rate).
        """
        while True:
            period = _RECOVER_POLL_S if self._down else max(self.settings.ready_cache_s, 0.1)
            await self._readiness(period)
            await asyncio.sleep(period)  # polling period, not synchronisation

    # -- inference ---------------------------------------------------------------------------------

    async def _explain(self, topology: Topology, request: Request) -> Response:
        """``infer``'s answer (JSON) with the explain side branch's ``explanation`` of it (docs/explain.md)."""
        if not topology.explained:
            return error_response(404, f"model '{topology.name}' has no explain: section (docs/explain.md)")
        try:
            async with ExplanationWatch(self.kafka, topology.explanations_topic) as watch:
                response = await self._infer(topology, request, explain=True)
                if response.status != 200 or response.content_type != "application/json":
                    return response if response.status != 200 else error_response(400, "explain answers in JSON "
                                                                                   "only: ask for JSON outputs")
                rid = response.headers["X-Request-Id"]
                explanation = await watch.wait(rid, topology.spec.deadline_ms / 1000)
        except FlowserveError as exc:
            return error_response(status_of(exc.kind), str(exc), None, exc.kind)
        return json_response(200, {**json.loads(response.body), "explanation": explanation}, response.headers)

    async def _infer(self, topology: Topology, request: Request, model: str | None = None, *,
                     explain: bool = False) -> Response:
        header_id = request.headers.get("x-request-id")
        echo = {"X-Request-Id": header_id} if header_id else {}
        if self.bridge.in_flight() >= self.settings.max_inflight:
            return error_response(429, f"the gateway has {self.settings.max_inflight} requests in flight, its "
                                       "limit; retry later", {"Retry-After": str(self.settings.retry_after_s),
                                                             **echo})
        down = self._down.get(topology.name)
        if down is not None:
            return error_response(status_of(ErrorKind.UNAVAILABLE), f"model '{topology.name}' cannot answer now: "
                                  f"{down}; retry later", {"Retry-After": str(self.settings.retry_after_s), **echo},
                                  ErrorKind.UNAVAILABLE)
        try:
            parsed = parse_infer(request.body, request.headers.get(HEADER_LENGTH))
        except WireError as exc:
            return error_response(status_of(exc.kind), str(exc), echo, exc.kind)
        rid = parsed.id or header_id or new_request_id()
        echo = {"X-Request-Id": rid}
        try:
            timeout_ms = self._timeout_ms(topology, parsed, request)
            check_inputs(parsed.tensors, topology.inputs)
            outputs = topology.outputs
            unknown = [n for n in parsed.outputs if n not in outputs]
            if unknown:
                raise WireError(f"output '{unknown[0]}' is not an output of model '{topology.name}' "
                                f"(outputs: {', '.join(outputs)})")
            value = encode_tensors(parsed.tensors)
        except WireError as exc:
            return error_response(status_of(exc.kind), str(exc), echo, exc.kind)
        if len(value) > topology.spec.max_message_bytes:
            return error_response(status_of(ErrorKind.OVERSIZE), f"the request's tensors take {len(value)} bytes, "
                                  f"more than model '{topology.name}' accepts ({topology.spec.max_message_bytes})",
                                  echo, ErrorKind.OVERSIZE)
        # a many-model node's answer depends on the model, which the cache does not key on
        cache_key = None if model or explain else self.responses.key(topology, parsed.tensors, request.headers)
        if cache_key is not None and (cached := self.responses.get(topology, cache_key)) is not None:
            return _answer(topology, rid, cached, parsed, None, {**echo, CACHE_HEADER: "hit"})
        if self.bridge.has(rid):
            return error_response(409, f"request id '{rid}' is already in flight; ids must be unique", echo)
        extra = {k: v for k, v in request.headers.items() if k.startswith("x-")}
        extra[H_REPLY_TO] = self.bridge.reply_topic(topology)
        if model is not None:
            extra[H_MODEL] = model
        if explain:  # the explain side branch explains it whatever its sample
            extra[H_EXPLAIN] = "1"
        traceparent = request.headers.get("traceparent", "")
        headers = make_headers(rid, topology=topology.name, version=topology.version,
                               deadline_ms=now_ms() + timeout_ms,
                               traceparent=traceparent if _TRACEPARENT.match(traceparent) else new_traceparent(),
                               extra=extra)
        future = self.bridge.submit(topology, rid, value, headers, timeout_ms / 1000, model)
        try:
            reply: Reply = await future
        except DeadlineExceeded as exc:
            return error_response(status_of(exc.kind), f"request '{rid}' to model '{topology.name}' got no reply "
                                                       f"within its deadline of {timeout_ms} ms", echo, exc.kind)
        except BrokerError as exc:
            return error_response(status_of(exc.kind), str(exc), echo, exc.kind)
        failure = reply.failure
        if failure is not None:
            where = f" at node '{reply.node}'" if reply.node else ""
            return error_response(status_of(failure.kind), f"request '{rid}' failed{where}: {failure.reason}", echo,
                                  failure.kind)
        # an output rebuilt from its parity group (flowserve.parity) says so, and names the group
        group = reply.headers.get(H_RECONSTRUCTED)
        params = {"reconstructed": True, "parity_group": group.decode("utf-8", "replace")} if group else None
        if cache_key is not None:  # a reconstruction approximates the real answer: it is not kept
            if group is None:
                self.responses.put(topology, cache_key, reply.tensors)
            echo[CACHE_HEADER] = "miss"
        served = reply.headers.get(H_SERVED_BY)  # the model that computed it, on a many-model node's answer
        return _answer(topology, rid, reply.tensors, parsed, params, echo,
                       served.decode("utf-8", "replace") if served else None)

    # -- feedback ----------------------------------------------------------------------------------

    async def _feedback(self, topology: Topology, request: Request) -> Response:
        """The true outputs of an answered request, to ``<base>.feedback``: 202 once the broker has them."""
        try:
            feedback = decode_feedback(None, request.body)
        except WireError as exc:
            return error_response(status_of(exc.kind), str(exc), None, exc.kind)
        unknown = [n for n in feedback.outputs if n not in topology.outputs]
        if unknown:
            return error_response(status_of(ErrorKind.INVALID_INPUT), f"feedback output '{unknown[0]}' is not an "
                                  f"output of model '{topology.name}' (outputs: {', '.join(topology.outputs)})",
                                  None, ErrorKind.INVALID_INPUT)
        key, value, headers = encode_feedback(feedback.request_id, feedback.outputs, context=feedback.context)
        try:
            await self.bridge.send_feedback(topology, key, value, headers)
        except BrokerError as exc:
            return error_response(status_of(ErrorKind.UNAVAILABLE), str(exc), None, ErrorKind.UNAVAILABLE)
        return json_response(202, {"id": feedback.request_id, "accepted": True})

    def _timeout_ms(self, topology: Topology, parsed: InferRequest, request: Request) -> int:
        raw: Any = parsed.parameters.get("timeout_ms")
        source = "parameters.timeout_ms"
        if raw is None and "x-timeout-ms" in request.headers:
            raw, source = request.headers["x-timeout-ms"], "X-Timeout-Ms"
            try:
                raw = int(raw)
            except ValueError:
                raise WireError(f"{source} must be an integer number of milliseconds, got {raw!r}") from None
        if raw is None:
            return topology.spec.deadline_ms
        if isinstance(raw, bool) or not isinstance(raw, int) or not 0 < raw <= self.settings.max_timeout_ms:
            raise WireError(f"{source} must be an integer between 1 and {self.settings.max_timeout_ms}, got {raw!r}")
        return raw


def _answer(topology: Topology, rid: str, tensors: dict[str, Any], parsed: InferRequest,
            params: dict[str, Any] | None, headers: dict[str, str], model: str | None = None) -> Response:
    """The V2 response to request ``rid`` (JSON, or binary when it asked for binary outputs); ``model_name``
    is ``model`` (the model of a many-model node that answered) or the topology's name."""
    body, header_length = encode_response(model or topology.name, topology.version, rid, tensors, parsed, params)
    if header_length is None:
        return Response(200, body, headers=headers)
    return Response(200, body, "application/octet-stream", {**headers, "Inference-Header-Content-Length":
                                                            str(header_length)})


def _version() -> str:
    from flowserve import __version__

    return __version__


async def serve(topologies: Sequence[Topology], kafka: KafkaSettings, settings: GatewaySettings,
                stop: asyncio.Event) -> None:
    """Run a gateway until ``stop`` is set."""
    async with Gateway(topologies, kafka, settings):
        await stop.wait()
