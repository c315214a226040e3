"""``flowserve explain`` (one request's attributions, on demand) and ``flowserve explainer`` (the side branch
that ``flowserve run`` starts for a topology with an ``explain:`` section). docs/explain.md."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from typing import Any

import numpy as np

from flowserve.cli import common
from flowserve.cli.common import console, out
from flowserve.errors import ErrorKind, FlowserveError
from flowserve.topology.graph import compile_spec
from flowserve.topology.spec import ExplainSpec

#: characters from low to high attribution of an image's pixels (a text heat map)
SHADES = " .:-=+*#%@"


def register(sub: Any) -> None:
    p = sub.add_parser("explain", help="attributions of one request's output to its inputs, from its captured inputs")
    p.add_argument("topology", help="topology YAML file (its explain: section, or the defaults)")
    p.add_argument("request_id")
    p.add_argument("--broker", required=True, help="bootstrap host:port")
    p.add_argument("--method", choices=["auto", "integrated_gradients", "kernel_shap"],
                   help="default: the explain: section's (auto: integrated gradients where every node is "
                   "differentiable)")
    p.add_argument("--output", help="the topology output to explain (default: the section's, else the first float one)")
    p.add_argument("--publish", action="store_true",
                   help="also write it to the explanations topic (flowserve lineage joins it)")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("explainer", help="run a topology's explain side branch (flowserve run starts it)")
    p.add_argument("topology")
    p.add_argument("--broker", required=True)
    p.set_defaults(func=cmd_explainer)


def cmd_explain(args: argparse.Namespace) -> int:
    # the readers bring aiokafka; the chain's components bring torch and captum
    from flowserve.capture.reader import Reader
    from flowserve.explain import Chain, explain, targets

    topology = common.load(args.topology)
    found = targets(topology)
    if args.output is not None or not found:  # explain the topology's output even where no section asks for it
        spec = (topology.spec.explain or ExplainSpec(sample=0.0)).model_copy(update={"output": args.output})
        topology = compile_spec(topology.spec.model_copy(update={"explain": spec}), source=topology.source)
        found = targets(topology)
    target = found[0]
    kafka = common.kafka(args.broker)

    async def inputs() -> dict[str, np.ndarray]:
        async with Reader(kafka) as reader:
            records = await reader.read([topology.inputs_topic], key=args.request_id)
        usable = [r for r in records if r.tensors]
        if not usable:
            raise FlowserveError(f"no request '{args.request_id}' on {topology.inputs_topic} (gone past retention, or "
                                 "another id?)", kind=ErrorKind.INVALID_INPUT)
        return usable[-1].tensors

    tensors = asyncio.run(inputs())
    chain = Chain(topology, target)
    with console.status("setting up the chain's components…"):
        chain.setup()
    try:
        e = explain(chain, tensors, request_id=args.request_id, method=args.method)
    finally:
        chain.close()
    if args.publish:
        asyncio.run(_publish(kafka, topology.explanations_topic, args.request_id,
                             json.dumps(e.to_json(), separators=(",", ":")).encode()))
    if args.format == "json":
        print(json.dumps(e.to_json(), separators=(",", ":")))
        return 0
    out.print(f"request {e.request_id}: {e.method} of {e.output} ({topology.name}, baseline {e.baseline:g})")
    classes: list[int | None] = [*e.classes] or [None] * len(e.f_x)
    for row, (c, fx, fb, d) in enumerate(zip(classes, e.f_x, e.f_baseline, e.delta, strict=True)):
        at = "" if c is None else f" at class {c}"
        out.print(f"  row {row}{at}: f(x) {fx:.4g}  f(baseline) {fb:.4g}  sum of attributions {fx - fb + d:.4g}  "
                  f"completeness gap {d:.2g} ({abs(d) / max(abs(fx - fb), 1e-12) * 100:.3f}%)")
        for name, a in e.attributions.items():
            out.print(f"  {name}:")
            for line in heat_map(a[row]):
                out.print(f"    {line}", markup=False, highlight=False)
    return 0


def heat_map(attribution: np.ndarray) -> list[str]:
    """A square image's attributions as text, two characters a pixel, darkest where the magnitude is largest;
    a flat list of the ten largest otherwise."""
    flat = np.asarray(attribution, dtype=np.float64).ravel()
    side = int(round(len(flat) ** 0.5))
    peak = float(np.abs(flat).max()) or 1.0
    if side * side != len(flat) or side < 2:
        top = np.argsort(-np.abs(flat))[:10]
        return [", ".join(f"[{i}] {flat[i]:+.3g}" for i in top)]
    levels = np.minimum((np.abs(flat) / peak * len(SHADES)).astype(int), len(SHADES) - 1)
    return ["".join(SHADES[v] * 2 for v in levels[r * side:(r + 1) * side]) for r in range(side)]


async def _publish(kafka: Any, topic: str, request_id: str, value: bytes) -> None:
    from flowserve.kafka.clients import make_producer, start_client
    from flowserve.kafka.settings import WorkerSettings

    producer = make_producer(kafka, WorkerSettings(), max_message_bytes=len(value) + 1024)
    await start_client(producer, kafka)
    try:
        await producer.send_and_wait(topic, value, key=request_id.encode())
    finally:
        await producer.stop()


def cmd_explainer(args: argparse.Namespace) -> int:
    from flowserve.explain.service import Explainer
    from flowserve.kafka.settings import WorkerSettings
    from flowserve.runtime.process import SIDE_NICE, watch_parent

    topology = common.load(args.topology)  # unfused: the chain is composed of the topology's own nodes
    os.nice(SIDE_NICE)  # a side branch: the critical path's workers come first
    watch_parent()  # started by flowserve run: stop when it is gone

    async def main() -> None:
        explainer = Explainer(topology, common.kafka(args.broker), WorkerSettings.from_env())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, explainer.stop)
        await explainer.run()

    asyncio.run(main())
    return 0
