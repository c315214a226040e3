"""``flowserve learn | shadow | versions | promote | rollback``: continual learning of one node's model."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
from collections.abc import Callable
from typing import Any

from rich.table import Table

from flowserve.console import make_console
from flowserve.errors import FlowserveError
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology import load_topology, names

console = make_console(stderr=True)
out = make_console()


def _setup(args: argparse.Namespace) -> tuple[Any, Any]:
    topology = load_topology(args.topology)
    if args.node not in topology.nodes:
        raise FlowserveError(f"topology '{topology.name}' has no node '{args.node}' "
                             f"(nodes: {', '.join(topology.nodes)})")
    return topology, KafkaSettings.from_env(args.broker) if getattr(args, "broker", None) else None


async def learn_once(topology: Any, node: str, kafka: Any, *, last: int | None) -> Any:
    """Build the training set from Kafka, retrain, register; returns (training set, manifest)."""
    from flowserve.capture.reader import Reader
    from flowserve.learning import retrain, training_set

    async with Reader(kafka) as reader:
        data = await training_set(topology, node, reader, last=last)
    manifest = await asyncio.to_thread(retrain, topology, node, data)
    return data, manifest


def _print_learned(data: Any, manifest: Any) -> None:
    m = manifest.metrics
    out.print(f"training set: {data.size} example(s) from {data.feedback} feedback record(s) "
              f"({data.missing} without captured inputs)")
    out.print(f"registered [bold]{manifest.version}[/] (parent {manifest.parent}, sha256 "
              f"{manifest.weights_sha256[:16]}): fit accuracy {m.get('fit_accuracy_before', float('nan')):.3f} -> "
              f"{m.get('fit_accuracy_after', float('nan')):.3f} in {m.get('train_seconds', 0):.1f} s")
    print(json.dumps({"version": manifest.version, "parent": manifest.parent, "training_size": data.size,
                      "metrics": m}))


def cmd_learn(args: argparse.Namespace) -> int:
    topology, kafka = _setup(args)
    if args.on_drift:
        return asyncio.run(_on_drift(topology, args.node, kafka, last=args.last, cooldown_s=args.cooldown))
    data, manifest = asyncio.run(learn_once(topology, args.node, kafka, last=args.last))
    _print_learned(data, manifest)
    return 0


async def _on_drift(topology: Any, node: str, kafka: Any, *, last: int | None, cooldown_s: float) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await follow_drift(topology, node, kafka, last=last, cooldown_s=cooldown_s, stop=stop,
                       ready=lambda topic: console.print(f"following {topic}: a drift alarm runs learn for node "
                                                         f"'{node}' (Ctrl-C to stop)"))
    return 0


async def follow_drift(topology: Any, node: str, kafka: Any, *, last: int | None, cooldown_s: float,
                       stop: asyncio.Event, ready: Callable[[str], None] = lambda topic: None,
                       learned: Callable[[Any], None] = lambda manifest: None) -> None:
    """Follow ``<base>.drift`` from its end (``ready`` is told once positioned there); on a window that
    drifted, learn (at most once per ``cooldown_s``; ``learned`` gets each new version) until ``stop``."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from flowserve.kafka.admin import describe_partitions, ensure_topics

    topic = names.side_topic(topology.base, "drift")
    await ensure_topics(kafka, [topic], topology.spec.partitions)
    consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, **kafka.client_kwargs())
    await consumer.start()
    loop = asyncio.get_running_loop()
    last_run = float("-inf")
    try:
        count = (await describe_partitions(kafka, [topic])).get(topic, 1)
        tps = [TopicPartition(topic, p) for p in range(count)]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:
            await consumer.position(tp)
        ready(topic)
        while not stop.is_set():
            fetched = await consumer.getmany(timeout_ms=500)
            alarms = [r for recs in fetched.values() for r in recs if _drifted(r.value)]
            if not alarms or loop.time() - last_run < cooldown_s:
                continue
            last_run = loop.time()
            console.print(f"drift alarm ({len(alarms)} window(s)): learning")
            try:
                data, manifest = await learn_once(topology, node, kafka, last=last)
            except FlowserveError as exc:
                console.print(f"[yellow]learn skipped:[/] {exc}")
                continue
            _print_learned(data, manifest)
            learned(manifest)
    finally:
        await consumer.stop()


def _drifted(value: bytes | None) -> bool:
    """Whether a drift detector's window record says the window drifted (anything else: no)."""
    try:
        body = json.loads(value or b"")
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("is_drift") is True


def cmd_shadow(args: argparse.Namespace) -> int:
    import os

    from flowserve.kafka.admin import ensure_topics
    from flowserve.learning import Registry, shadow_topics, shadow_worker

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    topology, kafka = _setup(args)
    Registry(topology.name, args.node).manifest(args.version)  # exists, before anything starts

    if args.nice:
        # A side branch yields the CPU to the live path, but only niced, not SCHED_IDLE as a drift detector
        # is: on a busy machine an idle-class process starves, and a shadow must keep up to be compared.
        os.nice(args.nice)

    async def main() -> None:
        await ensure_topics(kafka, shadow_topics(topology, args.node), topology.spec.partitions)
        worker = shadow_worker(topology, args.node, args.version, kafka)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        console.print(f"shadow of '{args.node}' running {args.version}: outputs to "
                      f"{', '.join(shadow_topics(topology, args.node))} (Ctrl-C to stop)")
        await worker.run()

    asyncio.run(main())
    return 0


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def cmd_versions(args: argparse.Namespace) -> int:
    from flowserve.learning import Registry

    topology, kafka = _setup(args)
    registry = Registry(topology.name, args.node)
    live = registry.live()
    table = Table(title=f"{topology.name} / {args.node}: registered versions")
    for column in ("version", "parent", "examples", "sha256", "fit accuracy", "live"):
        table.add_column(column)
    for m in registry.versions():
        table.add_row(m.version, m.parent, str(m.training_size), m.weights_sha256[:12],
                      _fmt(m.metrics.get("fit_accuracy_after"), ".3f"), "●" if m.version == live else "")
    out.print(table)
    out.print(f"live: [bold]{live}[/]; rollback returns to: {(registry.history() or ['-'])[-1]}")
    if kafka is None:
        return 0
    rows = asyncio.run(_compare(topology, args.node, kafka))
    table = Table(title="on the feedback: live and shadow")
    for column in ("role", "version", "requests", "accuracy", "live on the same requests", "latency p50 ms",
                   "latency p99 ms"):
        table.add_column(column)
    for r in rows:
        table.add_row(r.role, r.version, str(r.requests), _fmt(r.accuracy, ".3f"), _fmt(r.live_accuracy, ".3f"),
                      _fmt(r.latency(50), ".1f"), _fmt(r.latency(99), ".1f"))
    out.print(table)
    print(json.dumps([{"role": r.role, "version": r.version, "requests": r.requests, "accuracy": r.accuracy,
                       "live_accuracy": r.live_accuracy, "p50_ms": r.latency(50), "p99_ms": r.latency(99)}
                      for r in rows]))
    return 0


async def _compare(topology: Any, node: str, kafka: Any) -> Any:
    from flowserve.capture.reader import Reader
    from flowserve.learning import compare

    async with Reader(kafka) as reader:
        return await compare(topology, node, reader)


def cmd_promote(args: argparse.Namespace) -> int:
    from flowserve.learning import Registry, send_version

    topology, kafka = _setup(args)
    before = Registry(topology.name, args.node).promote(args.version)
    asyncio.run(send_version(topology, kafka, args.node, args.version))
    console.print(f"'{args.node}' of '{topology.name}': {before} -> [bold]{args.version}[/] "
                  "(workers switch between batches)")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from flowserve.learning import Registry, send_version

    topology, kafka = _setup(args)
    before, after = Registry(topology.name, args.node).rollback()
    asyncio.run(send_version(topology, kafka, args.node, after))
    console.print(f"'{args.node}' of '{topology.name}': {before} -> [bold]{after}[/] (rolled back)")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("learn", help="retrain a node from feedback joined with its captured inputs; register a version")
    p.add_argument("topology")
    p.add_argument("node")
    p.add_argument("--broker", required=True)
    p.add_argument("--last", type=int, metavar="N", help="only the last N feedback records")
    p.add_argument("--on-drift", action="store_true",
                   help="keep running: learn whenever a drift detector's window (<base>.drift) drifted")
    p.add_argument("--cooldown", type=float, default=300.0, metavar="S",
                   help="--on-drift: at most one learn per S seconds")
    p.set_defaults(func=cmd_learn)

    p = sub.add_parser("shadow", help="run a registered version on a copy of a node's live traffic (answers nobody)")
    p.add_argument("topology")
    p.add_argument("node")
    p.add_argument("version")
    p.add_argument("--broker", required=True)
    p.add_argument("--nice", type=int, default=10, help="lower this process's priority by N (default 10)")
    p.set_defaults(func=cmd_shadow)

    p = sub.add_parser("versions", help="a node's registered versions; with --broker, live and shadow on the feedback")
    p.add_argument("topology")
    p.add_argument("node")
    p.add_argument("--broker")
    p.set_defaults(func=cmd_versions)

    p = sub.add_parser("promote", help="make a registered version live (workers switch between batches)")
    p.add_argument("topology")
    p.add_argument("node")
    p.add_argument("version")
    p.add_argument("--broker", required=True)
    p.set_defaults(func=cmd_promote)

    p = sub.add_parser("rollback", help="return a node to the version live before the current one")
    p.add_argument("topology")
    p.add_argument("node")
    p.add_argument("--broker", required=True)
    p.set_defaults(func=cmd_rollback)
