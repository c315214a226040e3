"""``flowserve ui``: wires the capture readers into the page's server (features do not import each other)."""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import TYPE_CHECKING, Any

from flowserve.cli.common import console
from flowserve.errors import ErrorKind, FlowserveError, SettingsError
from flowserve.gateway.settings import GatewaySettings
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology import Topology, load_topology, names

if TYPE_CHECKING:  # the page's server and its sources bring aiokafka: imported where they are used
    from flowserve.ui import UiSettings, UiSources


def register(sub: Any) -> None:
    p = sub.add_parser("ui", help="a live web page of running topologies: graph, figures, charts, lineage")
    p.add_argument("topology", nargs="+", help="topology files of running topologies")
    p.add_argument("--broker", required=True, help="bootstrap host:port of the Kafka they run on")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8090, help="port (default 8090; 0 picks a free one)")
    p.add_argument("--token-file", help="bearer tokens, one per line (the gateway's); without it (and "
                                        "FLOWSERVE_GATEWAY_TOKENS) there is no authentication")
    p.add_argument("--poll", type=float, default=2.0, help="seconds between reads of the topics")
    p.set_defaults(func=cmd_ui)


def lineage_json(steps: list[Any]) -> dict[str, Any]:
    """The page's view of :func:`flowserve.capture.lineage.lineage`'s steps: hops, timings, tensor summaries."""
    from flowserve.capture.inspect import summarize

    first = min((s.record.get("timing", {}).get("start_ms") or 0 for s in steps), default=0)
    out = []
    for s in steps:
        r = s.record
        timing, batch = r.get("timing", {}), r.get("batch", {})
        inputs = []
        for (topic, partition, offset), d in zip(r.get("inputs", []), s.inputs or [None] * len(r.get("inputs", [])),
                                                 strict=False):
            tensors = [] if d is None else [summarize(n, a) for n, a in d.tensors.items()]
            inputs.append({"topic": topic, "partition": partition, "offset": offset, "tensors": tensors})
        start = timing.get("start_ms")
        out.append({"node": s.node, "component": r.get("component"), "start_ms": start,
                    "offset_ms": (start - first) if start is not None else None, "batch_ms": timing.get("batch_ms"),
                    "batch_size": batch.get("size"), "batch_index": batch.get("index"),
                    "inputs": inputs, "error": r.get("error"),
                    "outputs": [{"topic": t, "partition": p, "port": port} for t, p, port in r.get("outputs", [])]})
    rid = str(steps[0].record.get("request_id")) if steps else ""
    return {"request_id": rid, "trace_id": steps[0].record.get("trace_id") if steps else None, "steps": out}


def sources(kafka: KafkaSettings) -> UiSources:
    """The page's sources: metrics snapshots, drift detectors, lineage look-ups, control commands."""
    from flowserve.capture.drift import drift_state
    from flowserve.capture.inspect import inspect_records
    from flowserve.capture.lineage import explanations, lineage
    from flowserve.runtime.metrics import read_snapshots
    from flowserve.ui import UiSources

    async def snapshots(topology: Topology) -> list[dict[str, Any]]:
        return await read_snapshots(topology, kafka, timeout_s=5.0)

    async def drift(topology: Topology) -> dict[str, dict[str, Any]]:
        return await drift_state(kafka, topology.name, prefix=topology.spec.prefix, timeout_s=5.0)

    async def look_up(topology: Topology, request_id: str) -> dict[str, Any]:
        steps = await lineage(kafka, request_id, topology.name, prefix=topology.spec.prefix, timeout_s=10.0)
        if not steps:
            raise FlowserveError(f"no lineage for request '{request_id}' in {topology.lineage_topic}: is "
                                 "'capture: {lineage: true}' set and was the request sampled?",
                                 kind=ErrorKind.UNKNOWN)
        view = lineage_json(steps)
        view["explanations"] = await explanations(kafka, view["request_id"], topology.name, prefix=topology.spec.prefix,
                                                  timeout_s=10.0)
        return view

    async def actions(topology: Topology) -> list[dict[str, Any]]:
        """Operators' commands (the control topic) and what features did on their own (the actions topic:
        the tuner's scaling, the parity decoder's reconstructions), oldest first."""
        out: list[dict[str, Any]] = []
        for topic in (names.CONTROL, names.ACTIONS):
            try:
                records = await inspect_records(kafka, f"{topology.name}.{topic}", prefix=topology.spec.prefix,
                                                last=50, timeout_s=5.0)
            except FlowserveError:  # no such topic yet: nobody sent a command, no feature acted
                continue
            for r in records:
                if topic == names.CONTROL and r.body is not None:
                    out.append({"ts_ms": r.timestamp_ms, "source": "control", "action": r.body})
                elif isinstance(r.body, dict):
                    out.append({"ts_ms": r.body.get("ts_ms", r.timestamp_ms), "source": r.body.get("source", "?"),
                                "node": r.body.get("node"), "action": r.body.get("action")})
        return sorted(out, key=lambda a: a["ts_ms"] or 0)

    return UiSources(snapshots=snapshots, drift=drift, lineage=look_up, actions=actions)


def serve_blocking(topologies: list[Topology], kafka: KafkaSettings, settings: UiSettings) -> int:
    from flowserve.ui import UiServer

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with UiServer(topologies, sources(kafka), settings) as ui:
            console.print(f"[green]ui[/] {', '.join(t.name for t in topologies)} at [bold]{ui.url}/[/] "
                          f"(auth {'on: open ' + ui.url + '/#token=TOKEN' if settings.tokens else 'off'}); "
                          "Ctrl-C to stop")
            print(ui.url, flush=True)
            await stop.wait()

    asyncio.run(main())
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    from flowserve.ui import UiSettings

    gateway = GatewaySettings.from_env(args.token_file)  # the gateway's tokens, from the same places
    if gateway.grants:
        # The page checks plain tokens only: started with scoped ones it would run with no authentication.
        raise SettingsError("flowserve ui takes unscoped tokens only (a file with one token per line, or "
                            "FLOWSERVE_GATEWAY_TOKENS); the token file given has scoped tokens (models/actions): "
                            "give the UI a token file of its own")
    tokens = gateway.tokens
    settings = UiSettings(host=args.host, port=args.port, poll_s=args.poll, tokens=tokens)
    return serve_blocking([load_topology(p) for p in args.topology], KafkaSettings.from_env(args.broker), settings)
