"""The ``flowserve`` command line. Heavy imports (torch, aiokafka) happen inside commands, not here."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from rich.table import Table

from flowserve.console import make_console
from flowserve.errors import FlowserveError, SettingsError
from flowserve.tuning.rules import RULES

if TYPE_CHECKING:
    from flowserve.kafka.settings import KafkaSettings

console = make_console(stderr=True)
out = make_console()


def _topology(path: str, plan: str | None = None):  # noqa: ANN202 - returns flowserve.topology.Topology
    from flowserve.topology import load_topology

    topology = load_topology(path)
    if plan:
        from flowserve.tuning.plan import apply_plan, load_plan

        topology = apply_plan(topology, load_plan(plan))
    return topology


@contextlib.contextmanager
def _broker(address: str | None, kind: str, *, server_jvm: bool = False) -> Iterator[KafkaSettings]:
    """Yield how to reach the given broker, or one started here for the duration."""
    if address:
        yield _kafka(address)
        return
    from flowserve.errors import BrokerError
    from flowserve.kafka.brokers import start_broker
    from flowserve.kafka.brokers.apache_kafka import java_available, kafka_libs_dir, kafka_missing

    if kind in ("default", "kafka") and java_available() and kafka_missing():
        # the first run fetches Kafka's jars with a progress bar of its own, which a spinner would overdraw;
        # where the fetch fails the default broker says why and starts Tansu
        try:
            kafka_libs_dir()
        except BrokerError:
            if kind == "kafka":
                raise
    with console.status(f"starting the {kind} broker…"):
        broker = start_broker(kind, server_jvm=server_jvm)  # type: ignore[arg-type]
    note = " (a temporary broker: its data is gone when flowserve exits)"
    console.print(f"[green]broker[/] {broker.name} at {broker.bootstrap}{note}")
    try:
        yield broker.settings()
    finally:
        broker.stop()


def _kafka(bootstrap: str) -> KafkaSettings:
    from flowserve.kafka.settings import KafkaSettings

    return KafkaSettings.from_env(bootstrap)


def _stop_on_sigterm() -> None:
    """Make SIGTERM (a container stop, ``kill``) end this command as Ctrl-C does: by KeyboardInterrupt, so
    that its ``finally`` blocks stop the broker and workers it started instead of leaving them behind,
    re-parented to init. A handler, not a blocked signal: a blocked mask would be inherited by the
    processes the command starts."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def _wait_for_stop(announce: Callable[[], None] = lambda: None) -> None:
    """``announce`` (e.g. print an address), then return on SIGINT or SIGTERM (see :func:`_stop_on_sigterm`),
    also one that comes while announcing; a second SIGTERM while the caller cleans up is ignored, a
    second Ctrl-C still interrupts."""
    import time

    try:
        announce()
        while True:
            # Not signal.pause(): with other threads (the supervisor's) the kernel may deliver the signal to
            # one of them, and pause() in this thread would not return; a short sleep lets the handler run.
            time.sleep(0.5)
    except KeyboardInterrupt:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


# -- commands ---------------------------------------------------------------------------------------

def cmd_validate(args: argparse.Namespace) -> int:
    status = 0
    for path in args.topology:
        try:
            topology = _topology(path)
        except FlowserveError as exc:
            console.print(f"[red]✗[/] {exc}")
            status = 1
            continue
        out.print(f"[green]✓[/] {path}: topology '{topology.name}' with {len(topology.nodes)} nodes is valid")
    return status


def cmd_graph(args: argparse.Namespace) -> int:
    from flowserve.topology.render import RENDERERS

    print(RENDERERS[args.format](_topology(args.topology)))
    return 0


def cmd_topics(args: argparse.Namespace) -> int:
    topology = _topology(args.topology)
    partitions = args.partitions or topology.spec.partitions
    if args.create:
        from flowserve.runtime.host import create_topology_topics

        if not args.broker:
            raise FlowserveError("--create needs --broker host:port")
        if args.partitions:
            topology = topology.with_partitions(args.partitions)
        kafka = _kafka(args.broker)
        if args.replication_factor or args.min_insync_replicas:
            kafka = kafka.model_copy(update={"replication_factor": args.replication_factor or kafka.replication_factor,
                                             "min_insync_replicas": args.min_insync_replicas
                                             or kafka.min_insync_replicas})
        created = asyncio.run(create_topology_topics(topology, kafka))
        copies = kafka.replication_factor or "min(3, brokers)"
        console.print(f"created {len(created)} topic(s) with {partitions} partitions, {copies} copies each")
    for topic in topology.topics():
        print(topic)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from flowserve.component import import_library

    import_library("flowserve_components.models").train_all(args.models or None)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from flowserve.kafka.settings import WorkerSettings
    from flowserve.runtime.worker import StageWorker

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    topology = _topology(args.topology, args.plan)
    if args.node not in topology.nodes:
        raise FlowserveError(f"topology '{topology.name}' has no node '{args.node}' "
                             f"(nodes: {', '.join(topology.nodes)})")

    settings = WorkerSettings.from_env(stats_interval_s=args.stats_interval)
    from flowserve.capture import capture_hooks
    from flowserve.learning import version_hooks
    from flowserve.parity import parity_hooks
    from flowserve.runtime.hooks import chain
    from flowserve.runtime.process import watch_parent, worker_process
    from flowserve.selection import selection_hooks

    settings = worker_process(topology, args.node, settings)  # OS priority: side branches yield the CPU
    watch_parent()  # a worker whose host was killed outright stops itself
    kafka = _kafka(args.broker)
    hooks = chain(capture_hooks, parity_hooks(kafka, settings), selection_hooks(kafka),
                  version_hooks(kafka, settings))
    if args.host == "faust":
        from flowserve.runtime.faust_host import run_worker

        run_worker(topology, args.node, _kafka(args.broker), settings, hooks=hooks,
                   loglevel="info" if args.verbose else "warn")
        return 0

    async def main() -> None:
        worker = StageWorker(topology, args.node, _kafka(args.broker), settings, hooks=hooks)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        await worker.run()

    from flowserve.runtime.eventloop import run

    run(main(), settings.event_loop)
    return 0


def cmd_control(args: argparse.Namespace) -> int:
    from flowserve.runtime.faust_host import send_command

    topology = _topology(args.topology)
    asyncio.run(send_command(topology, _kafka(args.broker), args.command, node=args.node))
    console.print(f"sent '{args.command}' to {args.node or 'every node'} of '{topology.name}'")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import os

    from flowserve.client.traffic import prepare_to_drive
    from flowserve.runtime.host import ProcessHost, create_topology_topics
    from flowserve.runtime.supervise import RestartPolicy, Supervisor

    _stop_on_sigterm()
    topology = _topology(args.topology, args.plan)
    with console.status("preparing components…"):
        prepare_to_drive(topology)  # before workers start; this process may send the sample traffic
    with _broker(args.broker, args.broker_kind) as kafka:
        host = ProcessHost(Path(args.topology), topology, kafka,
                           log_dir=Path(args.log_dir) if args.log_dir else None,
                           extra_args=["--plan", args.plan] if args.plan else [])
        asyncio.run(create_topology_topics(topology, kafka))
        host.start_processes()
        # A crash loop ends the run (exit status 1), through the same path as a SIGTERM, so that whatever
        # watches this command (a terminal, a container platform) sees it rather than a half-dead pipeline.
        supervisor = Supervisor(host, RestartPolicy(max_quick_deaths=args.max_restarts),
                                report=lambda line: console.print(f"[yellow]supervisor[/] {line}"),
                                on_give_up=lambda message: os.kill(os.getpid(), signal.SIGTERM))
        supervisor.start()
        workers = sum(len(p) for p in host.procs.values())
        console.print(f"[green]running[/] topology '{topology.name}': {workers} worker process(es), restarted "
                      f"when they die; send to [bold]{topology.inputs_topic}[/], "
                      f"read [bold]{topology.outputs_topic}[/]")
        status = 0
        try:
            if args.sample:
                status = _sample(topology, kafka, args)
            elif args.gateway_port is not None:
                from flowserve.cli.gateway import GatewaySettings, serve_blocking

                status = serve_blocking([topology], kafka, GatewaySettings.from_env(port=args.gateway_port))
            else:
                _wait_for_stop(lambda: console.print("Ctrl-C to stop"))
        except KeyboardInterrupt:
            # A signal that came before _wait_for_stop or serve_blocking took over its handling ends the
            # run as one that came after does; during --sample it is an interruption (130).
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if args.sample and not supervisor.gave_up:
                raise
        finally:
            supervisor.stop()
            with console.status("stopping workers…"):
                host.stop()
        if supervisor.gave_up:
            console.print(f"[red]stopped:[/] {'; '.join(supervisor.gave_up.values())}")
            return 1
        return status


def _sample(topology: Any, kafka: Any, args: argparse.Namespace) -> int:
    from flowserve.client.traffic import run_sample

    with console.status(f"waiting for the pipeline, then sending {args.sample} sample requests…"):
        shift = {"shift": args.shift, "amount": args.amount} if getattr(args, "shift", None) else None
        report = asyncio.run(run_sample(topology, kafka, args.sample, concurrency=args.concurrency,
                                        sampler_kwargs=shift))
    table = Table(title=f"{topology.name}: first predictions")
    table.add_column("request id")
    table.add_column("predicted")
    table.add_column("label")
    for rid, predicted, label in report.predictions:
        mark = "" if label is None else (" ✓" if predicted == label else " ✗")
        table.add_row(rid[:12], f"{predicted}{mark}", str(label))
    out.print(table)
    summary = report.to_dict()
    acc = f"{summary['accuracy']:.3f}" if summary["accuracy"] is not None else "n/a"
    out.print(f"sent {report.sent}  ok {report.ok}  errors {report.errors}  timeouts {report.timeouts}  "
              f"accuracy {acc}  latency p50 {summary['p50_ms']:.1f} ms  p99 {summary['p99_ms']:.1f} ms  "
              f"throughput {summary['throughput_rps']:.0f} req/s (concurrency {args.concurrency})")
    for err in report.error_samples:
        console.print(f"[red]error:[/] {err}")
    print(json.dumps(summary))
    return 0 if report.ok == report.sent else 1


def cmd_broker(args: argparse.Namespace) -> int:
    from flowserve.kafka.brokers import ApacheKafka, EmbeddedBroker, start_default
    from flowserve.kafka.settings import KafkaSettings

    _stop_on_sigterm()
    if args.kind == "default":
        broker: Any = start_default(port=args.port)
    elif args.kind == "embedded":
        broker = EmbeddedBroker.start(port=args.port)
    else:
        broker = ApacheKafka.start(nodes=args.nodes, port=args.port)

    def announce() -> None:
        print(broker.bootstrap, flush=True)
        if broker.fetch_max_wait_ms != KafkaSettings.model_fields["fetch_max_wait_ms"].default:
            # it answers a fetch only when the fetch's wait ends: clients elsewhere must keep the wait short
            print(f"clients of this broker: export FLOWSERVE_FETCH_MAX_WAIT_MS={broker.fetch_max_wait_ms}",
                  file=sys.stderr, flush=True)
        if broker.supports_transactions:
            print("clients of this broker: export FLOWSERVE_IDEMPOTENCE=1 (idempotent producers)",
                  file=sys.stderr, flush=True)

    try:
        _wait_for_stop(announce)
    finally:
        broker.stop()
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from flowserve.bench import run_bench

    _stop_on_sigterm()  # a killed bench still stops the broker and workers it started

    if args.workload == "chaos":  # it starts, faults and stops its own Apache Kafka
        from flowserve.bench.chaos import chaos_bench

        result = chaos_bench(args)
    elif args.workload == "tuner" and args.simulated:  # the contenders in the simulated cluster: no broker
        from flowserve.bench.tuner_sim import DEFAULT_PIPELINES, simulated_bench

        result = simulated_bench(args.pipelines or DEFAULT_PIPELINES, trace_file=args.trace, log=console.print)
    elif args.workload == "tuner" and args.part == "planner":  # the planner and simulator alone: no broker
        from flowserve.bench.planner_speed import planner_bench

        result = planner_bench(log=console.print)
    else:  # Apache Kafka as its start script runs it: the test suite's fast-start JVM would be measured instead
        with _broker(args.broker, args.broker_kind, server_jvm=True) as kafka:
            result = run_bench(args.workload, kafka, args)
    if args.plot:
        from flowserve.bench.plot import plot_result

        plot_result(result, args.plot)
        console.print(f"plot written to {args.plot}")
    if args.save:
        from flowserve.bench.results import save

        console.print(f"result written to {save(args.save, args.workload, result)}")
    print(json.dumps(result))
    return 0


# -- parser -----------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flowserve", description=__doc__.splitlines()[0] if __doc__ else "")
    sub = parser.add_subparsers(dest="command", required=True)

    def broker_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--broker", help="bootstrap host:port of a running Kafka (default: start one here)")
        p.add_argument("--broker-kind", choices=["default", "embedded", "kafka"], default="default",
                       help="which broker to start when --broker is not given (default: Apache Kafka where "
                       "Java and its jars are here, else embedded)")

    p = sub.add_parser("run", help="run every node of a topology locally (one process per worker)")
    p.add_argument("topology")
    broker_opts(p)
    p.add_argument("--sample", type=int, default=0, metavar="N",
                   help="send N sample requests, print predictions, accuracy and latency, then exit")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight during --sample")
    p.add_argument("--log-dir", help="write each worker's log here")
    p.add_argument("--shift", choices=["noise", "brightness"], help="--sample: distort the sample inputs (drift demo)")
    p.add_argument("--amount", type=float, default=0.0, help="--sample: size of the --shift")
    p.add_argument("--gateway-port", type=int, metavar="PORT",
                   help="also serve the topology over HTTP (Open Inference Protocol V2) on 127.0.0.1:PORT")
    p.add_argument("--plan", help="apply a plan file (flowserve plan): partitions, consumers, batch, hardware and "
                   "the chains it fused")
    p.add_argument("--max-restarts", type=int, default=5, metavar="N",
                   help="a worker that dies N times in a row within 30 s of starting is a crash loop: stop the run")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("worker", help="run one node of a topology (scale out: start more in the same group)")
    p.add_argument("topology")
    p.add_argument("node")
    p.add_argument("--broker", required=True)
    p.add_argument("--stats-interval", type=float, help="log counters every N seconds "
                   "(default: FLOWSERVE_WORKER_STATS_INTERVAL_S, else 0: only at exit)")
    p.add_argument("--host", choices=["faust", "asyncio"], default="faust",
                   help="process host: faust (control-topic agent, lifecycle) or a bare asyncio loop")
    p.add_argument("--plan", help="apply a plan file (flowserve plan): batch and hardware of this node")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("control", help="send an operator command to a topology's workers (faust host)")
    p.add_argument("topology")
    p.add_argument("command", choices=["pause", "resume", "stats", "stop"])
    p.add_argument("--node", help="only this node's workers (default: all)")
    p.add_argument("--broker", required=True)
    p.set_defaults(func=cmd_control)

    p = sub.add_parser("validate", help="validate topology files")
    p.add_argument("topology", nargs="+")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("graph", help="print the FBP graph of a topology")
    p.add_argument("topology")
    p.add_argument("--format", choices=["text", "mermaid", "dot"], default="text")
    p.set_defaults(func=cmd_graph)

    p = sub.add_parser("topics", help="list a topology's topics, or create them")
    p.add_argument("topology")
    p.add_argument("--create", action="store_true")
    p.add_argument("--partitions", type=int)
    p.add_argument("--replication-factor", type=int,
                   help="copies of each partition (default: min(3, brokers); FLOWSERVE_REPLICATION_FACTOR)")
    p.add_argument("--min-insync-replicas", type=int,
                   help="copies a write needs with acks=all (default: 2 where 3 copies, else 1)")
    p.add_argument("--broker")
    p.set_defaults(func=cmd_topics)

    p = sub.add_parser("train", help="train and cache the bundled models (digits), printing held-out accuracy")
    p.add_argument("models", nargs="*")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("broker", help="start a broker on loopback and keep it running")
    p.add_argument("--kind", choices=["default", "embedded", "kafka"], default="default")
    p.add_argument("--nodes", type=int, default=1, help="Apache Kafka only: 1 or 3 brokers")
    p.add_argument("--port", type=int)
    p.set_defaults(func=cmd_broker)

    from flowserve.cli.deploy import add_arguments as deploy_arguments
    from flowserve.cli.gateway import add_arguments as gateway_arguments
    from flowserve.cli.gateway import cmd_gateway

    p = sub.add_parser("deploy", help="render a topology's deployment: Dockerfiles, Kubernetes objects or Compose")
    deploy_arguments(p)

    p = sub.add_parser("gateway", help="serve topologies over HTTP (Open Inference Protocol V2), request-reply")
    gateway_arguments(p)
    p.set_defaults(func=cmd_gateway)

    from flowserve.cli.health import add_arguments as health_arguments
    from flowserve.cli.health import cmd_health

    p = sub.add_parser("health", help="probe a topology's stages (exit 0 live/ready, 1 not): for container platforms")
    health_arguments(p)
    p.set_defaults(func=cmd_health)

    from flowserve.cli.capture import register as capture_commands

    capture_commands(sub)  # inspect, lineage, drift

    from flowserve.cli.ui import add_arguments as ui_arguments
    from flowserve.cli.ui import cmd_ui

    p = sub.add_parser("ui", help="a live web page of running topologies: graph, figures, charts, lineage")
    ui_arguments(p)
    p.set_defaults(func=cmd_ui)
    from flowserve.cli.parity import register as parity_commands

    parity_commands(sub)  # parity train
    from flowserve.cli.learning import register as learning_commands

    learning_commands(sub)  # learn, shadow, versions, promote, rollback
    from flowserve.cli.importing import register as import_commands

    import_commands(sub)  # import: topologies from an MLServer or Triton model repository

    from flowserve.cli.measure import cmd_profile, cmd_stats

    p = sub.add_parser("profile", help="measure each node's execution time per batch size (saved beside the topology)")
    p.add_argument("topology")
    p.add_argument("node", nargs="?", help="only this node (default: every node)")
    p.add_argument("--max-batch", type=int, help="largest batch size to profile (default: the node's max_batch)")
    p.add_argument("--repeats", type=int, default=30, help="timed calls per batch size")
    p.add_argument("--out", help="profile file (default: <topology>.profile.json beside the topology)")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("stats", help="latest metrics snapshot of every worker of a topology")
    p.add_argument("topology")
    p.add_argument("--broker", required=True)
    p.add_argument("--json", action="store_true", help="print the snapshots as JSON")
    p.set_defaults(func=cmd_stats)

    from flowserve.cli.planning import register as planning_commands

    planning_commands(sub)  # trace, simulate, plan, tune

    p = sub.add_parser("bench", help="benchmarks: flowserve and its baseline in one run, with the ratio")
    from flowserve.bench import WORKLOADS

    p.add_argument("workload", choices=WORKLOADS)
    broker_opts(p)
    p.add_argument("--records", type=int, default=200_000, help="passthrough: records per contender")
    p.add_argument("--rate", type=float, default=50.0, help="latency, capture's detector part: requests per second")
    p.add_argument("--seconds", type=float, default=20.0,
                   help="latency: how long to send; gateway: per level; capture: per configuration")
    p.add_argument("--cell-seconds", type=float, default=3.0, help="batching: seconds per slice of a load cell")
    p.add_argument("--slice-seconds", type=float, default=None,
                   help="capture, parity, scale, broker, learn-cache: configurations take turns in slices this "
                   "long (default 2 s, 4 s, 2 s, 2 s, 2 s)")
    p.add_argument("--rounds", type=int, default=4,
                   help="parity, scale, broker, batching, learn-cache: slices per contender and scenario")
    p.add_argument("--k", type=int, default=2, help="parity: requests per parity group")
    p.add_argument("--encoder", choices=("sum", "concat"), default="sum", help="parity: the parity query's encoder")
    p.add_argument("--stage", choices=("digits", "emulated"), default="digits",
                   help="parity: protect the digits classifier, or an emulated accelerator stage before it")
    p.add_argument("--stop-seconds", type=float, default=1.5,
                   help="parity: how long the 'stopped' scenario SIGSTOPs a model worker")
    p.add_argument("--blocks", type=int, default=3,
                   help="capture: deploy afresh this many times per part (deployments differ on their own)")
    p.add_argument("--only", choices=["saturation", "detector"], help="capture: run one part of the bench")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the result to this image (needs matplotlib)")
    p.add_argument("--save", metavar="PATH", help="also write the result with its command, date and machine to "
                   "this JSON file (a folder: PATH/WORKLOAD.json); docs/benchmarks.md is generated from "
                   "benchmarks/results/")
    p.add_argument("--part", choices=["simulate", "tuner", "planner"],
                   help="tuner: run one section of the bench (planner: how long planning 2,000 and 10,000 req/s takes)")
    p.add_argument("--simulated", action="store_true",
                   help="tuner: static, KEDA, the tuner and a clairvoyant oracle at cluster scale in the simulated "
                   "cluster, one-hour traces peaking at 2,000 req/s (no broker)")
    p.add_argument("--trace", metavar="FILE",
                   help="tuner --simulated: also run this trace file (flowserve trace record)")
    p.add_argument("--pipelines", nargs="+", default=None,
                   help="tuner --simulated: the emulated pipelines (default image-processing)")
    p.add_argument("--tuner-rate", type=float, default=30.0, help="tuner, simulate: base request rate")
    p.add_argument("--trace-seconds", type=float, default=40.0, help="tuner, simulate: length of each trace")
    p.add_argument("--slo-ms", type=float, default=600.0, help="tuner: end-to-end SLO")
    p.add_argument("--tuner-rule", choices=RULES, default=RULES[0],
                   help="tuner: the tuner contender's rule (flowserve tune --rule)")
    p.add_argument("--sim-repeats", type=int, default=3,
                   help="simulate: traces replayed per pipeline (the p99 compared is over all of them)")
    from flowserve.cli.chaos import add_arguments as chaos_arguments

    chaos_arguments(p)  # chaos --minutes M --nodes N
    from flowserve.cli.bench_against import add_arguments as against_arguments

    against_arguments(p)  # gateway --against URL
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Components are referenced as module:Class; let modules beside the user resolve like `python -m` does.
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return int(args.func(args) or 0)
    except FlowserveError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    except ValidationError as exc:  # settings built from flags: say which, not a traceback
        console.print(f"[red]error:[/] {SettingsError.from_validation(exc)}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
