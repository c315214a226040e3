"""``flowserve run``: every node of a topology in local worker processes, restarted when they die."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.table import Table

from flowserve.cli import common
from flowserve.cli.common import console, out
from flowserve.cli.gateway import serve_blocking
from flowserve.gateway.settings import GatewaySettings
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology import Topology


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run every node of a topology locally (one process per worker)")
    p.add_argument("topology")
    common.broker_options(p)
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


def cmd_run(args: argparse.Namespace) -> int:
    # the process host and the client bring aiokafka: not for --help
    from flowserve.client.traffic import prepare_to_drive
    from flowserve.runtime.host import ProcessHost, create_topology_topics
    from flowserve.runtime.supervise import RestartPolicy, Supervisor

    common.stop_on_sigterm()
    topology = common.load(args.topology, args.plan)
    with console.status("preparing components…"):
        prepare_to_drive(topology)  # before workers start; this process may send the sample traffic
    with common.broker(args.broker, args.broker_kind) as kafka:
        host = ProcessHost(Path(args.topology), topology, kafka,
                           log_dir=Path(args.log_dir) if args.log_dir else None,
                           extra_args=["--plan", args.plan] if args.plan else [])
        asyncio.run(create_topology_topics(topology, kafka))
        host.start_processes()
        explainer = _start_explainer(args, topology, kafka, host.environment())
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
                status = serve_blocking([topology], kafka, GatewaySettings.from_env(port=args.gateway_port))
            else:
                common.wait_for_stop(lambda: console.print("Ctrl-C to stop"))
        except KeyboardInterrupt:
            # A signal that came before wait_for_stop or serve_blocking took over its handling ends the
            # run as one that came after does; during --sample it is an interruption (130).
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if args.sample and not supervisor.gave_up:
                raise
        finally:
            supervisor.stop()
            with console.status("stopping workers…"):
                host.stop(also=[explainer])  # the niced explainer's shutdown overlaps the workers'
        if supervisor.gave_up:
            console.print(f"[red]stopped:[/] {'; '.join(supervisor.gave_up.values())}")
            return 1
        return status


def _start_explainer(args: argparse.Namespace, topology: Topology, kafka: KafkaSettings,
                     env: dict[str, str]) -> subprocess.Popen[bytes] | None:
    """The explain side branch (``flowserve explainer``) in a process of its own, when the topology has an
    ``explain:`` section: it reads the requests in its own consumer group, so callers never wait for it."""
    if not topology.explained:
        return None
    log: int | object = subprocess.DEVNULL
    if args.log_dir:
        Path(args.log_dir).mkdir(parents=True, exist_ok=True)
        log = open(Path(args.log_dir) / "explainer.log", "ab")  # noqa: SIM115 - owned by the child
    console.print(f"[green]explaining[/] sampled requests to [bold]{topology.explanations_topic}[/]")
    return subprocess.Popen([sys.executable, "-m", "flowserve", "explainer", args.topology, "--broker",  # noqa: S603
                             kafka.bootstrap], stdout=log, stderr=subprocess.STDOUT, env=env)  # type: ignore[arg-type]


def _sample(topology: Topology, kafka: KafkaSettings, args: argparse.Namespace) -> int:
    from flowserve.client.traffic import run_sample

    with console.status(f"waiting for the pipeline, then sending {args.sample} sample requests…"):
        shift = {"shift": args.shift, "amount": args.amount} if args.shift else None
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
