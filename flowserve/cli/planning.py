"""``flowserve trace``, ``simulate``, ``plan`` and ``tune`` (registered in flowserve.cli)."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from flowserve.console import make_console
from flowserve.errors import FlowserveError
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology import load_topology
from flowserve.tuning import curves
from flowserve.tuning.rules import RULES

out = make_console()
err = make_console(stderr=True)


def cmd_trace_generate(args: argparse.Namespace) -> int:
    from flowserve.tuning.traces import generate, save_trace

    trace = generate(args.kind, rate=args.rate, seconds=args.seconds, seed=args.seed, cv=args.cv,
                     factor=args.factor, at=args.at, length=args.length, low=args.low, dwell=args.dwell)
    path = save_trace(trace, args.out)
    err.print(f"{len(trace.arrivals)} arrivals over {trace.seconds:g} s ({trace.rate:.1f}/s, {trace.kind}) -> {path}")
    return 0


def cmd_trace_record(args: argparse.Namespace) -> int:
    from flowserve.capture.reader import Reader
    from flowserve.tuning.traces import from_timestamps, save_trace

    topology = load_topology(args.topology)

    async def read() -> list[int]:
        async with Reader(KafkaSettings.from_env(args.broker)) as reader:
            records = await reader.read([topology.inputs_topic], last=args.last)
        return [r.timestamp_ms for r in records]

    trace = from_timestamps(asyncio.run(read()))
    path = save_trace(trace, args.out)
    err.print(f"{len(trace.arrivals)} arrivals from {topology.inputs_topic} over {trace.seconds:.1f} s -> {path}")
    return 0


def cmd_trace_replay(args: argparse.Namespace) -> int:
    from flowserve.client.kafka import TopologyClient
    from flowserve.client.replay import replay
    from flowserve.tuning.traces import load_trace

    topology = load_topology(args.topology)
    trace = load_trace(args.trace)
    if args.speed != 1.0:
        trace = trace.scaled(args.speed)
    requests, _ = topology.sampler()(min(len(trace.arrivals), 1000))
    if not requests:
        raise FlowserveError(f"topology '{topology.name}' has no sample requests to replay")

    async def go() -> Any:
        async with TopologyClient(topology, KafkaSettings.from_env(args.broker)) as client:
            return await replay(client, trace.arrivals, lambda i: requests[i % len(requests)],
                                timeout_ms=args.timeout_ms)

    report = asyncio.run(go())
    summary = {"sent": report.sent, "ok": report.ok, "errors": report.errors, "timeouts": report.timeouts,
               "p50_ms": report.percentile(50) * 1000, "p99_ms": report.percentile(99) * 1000}
    if args.slo_ms:
        summary["attainment"] = report.attainment(args.slo_ms / 1000)
    out.print("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in summary.items()))
    print(json.dumps(summary))
    return 0 if report.ok == report.sent else 1


def _stage_table(title: str, plan: Any, stats: dict[str, Any]) -> Table:
    table = Table(title=title)
    for col in ("stage", "hardware", "max batch", "consumers", "utilisation", "mean batch", "mean wait ms",
                "p99 wait ms"):
        table.add_column(col, justify="left" if col in ("stage", "hardware") else "right")
    for node, cfg in plan.stages.items():
        s = stats[node]
        table.add_row(node, cfg.hardware, str(cfg.max_batch), str(cfg.consumers), f"{s.utilisation:.2f}",
                      f"{s.mean_batch:.1f}", f"{s.mean_wait_s * 1000:.1f}", f"{s.p99_wait_s * 1000:.1f}")
    return table


def cmd_simulate(args: argparse.Namespace) -> int:
    from flowserve.tuning.fusion_plan import fused_options
    from flowserve.tuning.plan import load_plan, stage_options
    from flowserve.tuning.simulate import simulate
    from flowserve.tuning.stages import sim_stages
    from flowserve.tuning.traces import load_trace

    topology = load_topology(args.topology)
    plan = load_plan(args.plan)
    trace = load_trace(args.trace)
    options = fused_options(stage_options(topology), plan.fuse)
    missing = [o.id for o in options if plan.stages.get(o.id) is None or plan.stages[o.id].hardware not in o.tables]
    if missing:
        raise FlowserveError(f"the plan has no usable entry for node(s) {', '.join(missing)}")
    hop_ms = plan.hop_ms if args.hop_ms is None else args.hop_ms
    overhead_ms = plan.overhead_ms if args.overhead_ms is None else args.overhead_ms
    result = simulate(sim_stages(options, plan.stages), trace.arrivals, partitions=plan.partitions,
                      hop_s=hop_ms / 1000, overhead_s=overhead_ms / 1000, seed=args.seed)
    slo_ms = args.slo_ms or plan.slo_ms
    summary: dict[str, Any] = {"requests": int(result.latency_s.size), "p50_ms": result.percentile(50) * 1000,
               "p99_ms": result.percentile(99) * 1000, "attainment": result.attainment(slo_ms / 1000),
               "slo_ms": slo_ms, "hop_ms": hop_ms, "overhead_ms": overhead_ms,
               "stages": {k: {"utilisation": s.utilisation, "mean_batch": s.mean_batch,
                              "mean_wait_ms": s.mean_wait_s * 1000} for k, s in result.stages.items()}}
    out.print(_stage_table(f"{topology.name}: simulated over {args.trace}", plan, result.stages))
    out.print(f"p50 {summary['p50_ms']:.1f} ms  p99 {summary['p99_ms']:.1f} ms  "
              f"attainment {summary['attainment'] * 100:.2f}% within {slo_ms:g} ms")
    print(json.dumps(summary))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from flowserve.energy import carbon_intensity, power_watts
    from flowserve.runtime import hardware as hw
    from flowserve.tuning.fusion_plan import fused_options, make_fused_plan
    from flowserve.tuning.objectives import plan_for_objective
    from flowserve.tuning.plan import make_plan, save_plan, stage_options
    from flowserve.tuning.simulate import simulate
    from flowserve.tuning.stages import sim_stages
    from flowserve.tuning.traces import load_trace

    topology = load_topology(args.topology)
    trace = load_trace(args.trace)
    prices = {k: h.price_per_hour for k, h in hw.HARDWARE.items()}
    if args.hardware:
        prices = _read_prices(args.hardware)
    g_per_kwh = carbon_intensity(args.carbon_g_per_kwh, args.carbon_region)
    planner = make_plan if args.no_fuse else make_fused_plan
    with err.status("planning (simulating candidate configurations)…"):
        plan = plan_for_objective(
            args.objective, lambda priced: planner(
                topology, trace.arrivals, args.slo_ms, hop_ms=args.hop_ms, overhead_ms=args.overhead_ms,
                prices=priced, headroom=args.headroom, seed=args.seed,
                log=(lambda m: err.print(m)) if args.verbose else None),
            trace.arrivals, dollars=prices, watts=power_watts(), g_per_kwh=g_per_kwh)
    target = Path(args.out) if args.out else Path(args.topology).with_suffix(".plan.json")
    save_plan(plan, target)
    options = fused_options(stage_options(topology), plan.fuse)
    result = simulate(sim_stages(options, plan.stages), trace.arrivals,
                      partitions=plan.partitions, hop_s=plan.hop_ms / 1000, overhead_s=plan.overhead_ms / 1000,
                      seed=args.seed)
    out.print(_stage_table(f"{topology.name}: plan for p99 <= {args.slo_ms:g} ms -> {target}", plan, result.stages))
    p = plan.predicted
    out.print(f"predicted p99 {p['p99_ms']:.1f} ms  cost ${p['cost_per_hour']:.3f}/h  partitions {plan.partitions}  "
              f"energy {p['joules_per_request']:.4g} J/request  {p['g_co2e_per_request']:.4g} g CO2e/request "
              f"(objective: {args.objective})")
    _print_fusion(plan)
    if args.plot:
        from flowserve.tuning.plan import service_curves
        from flowserve.tuning.plot_plan import plot_plan

        stages = service_curves(options, plan)
        shortest = min(beta.latency for beta in stages.values())
        plot_plan(curves.envelope(trace.arrivals, shortest), stages, args.slo_ms / 1000, args.plot,
                  title=f"{topology.name}:")
        err.print(f"plot: {args.plot}")
    print(json.dumps({"plan": str(target), **plan.to_json()}))
    return 0


def _print_fusion(plan: Any) -> None:
    """Which chains the planner fused and why, and the links it could not fuse."""
    fusion = plan.fusion
    if not fusion:
        return
    unfused = fusion.get("unfused", {})
    if "cost_per_hour" in unfused:  # in the objective's unit: dollars, joules or grams per hour
        unit = plan.predicted.get("priced_in", "$")
        price = f"${unfused['cost_per_hour']:.3f}" if unit == "$" else f"{unfused['cost_per_hour']:.4g} {unit}"
        out.print(f"unfused: {price}/h, p99 {unfused['p99_ms']:.1f} ms")
    for name, chain in fusion.get("chains", {}).items():
        out.print(f"fused {name} = {' -> '.join(chain['members'])} on {chain['hardware']}: {chain['why']}")
    if not fusion.get("chains"):
        tried = len(fusion.get("considered", []))
        out.print(f"fused nothing: none of the {tried} candidate chain(s) was cheaper" if tried else
                  "fused nothing: no two adjacent stages may fuse")
    for link in fusion.get("refused", []):
        out.print(f"  not fusable: {link['link']}: {link['why']}")


def _read_prices(path: str) -> dict[str, float]:
    """A hardware table: JSON ``{"kind": price_per_hour, ...}`` (a subset of the known kinds)."""
    from flowserve.runtime import hardware as hw


    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise FlowserveError(f"cannot read hardware table {path}: {exc}") from None
    if not isinstance(doc, dict) or not doc:
        raise FlowserveError(f"{path}: expected a JSON object of hardware kind -> price per hour")
    for kind in doc:
        hw.hardware(kind)
    return {str(k): float(v) for k, v in doc.items()}


def register(sub: Any) -> None:
    p = sub.add_parser("trace", help="generate, record or replay an arrival trace")
    tsub = p.add_subparsers(dest="trace_command", required=True)
    g = tsub.add_parser("generate", help="a seeded synthetic trace (poisson, gamma, step, diurnal, mmpp)")
    g.add_argument("kind", choices=["poisson", "gamma", "step", "diurnal", "mmpp"])
    g.add_argument("--rate", type=float, required=True, help="mean (peak for diurnal) requests per second")
    g.add_argument("--seconds", type=float, default=60.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--cv", type=float, default=4.0, help="gamma: coefficient of variation of inter-arrivals")
    g.add_argument("--factor", type=float, default=2.0, help="step, mmpp: rate multiplier of the high state")
    g.add_argument("--at", type=float, help="step: when the spike starts (default: a third in)")
    g.add_argument("--length", type=float, help="step: how long it lasts (default: a third of the trace)")
    g.add_argument("--low", type=float, default=0.25, help="diurnal: trough as a share of the peak")
    g.add_argument("--dwell", type=float, default=5.0, help="mmpp: mean seconds in each state")
    g.add_argument("--out", required=True, help="trace file (JSON)")
    g.set_defaults(func=cmd_trace_generate)
    r = tsub.add_parser("record", help="arrival times from the timestamps of a topology's inputs topic")
    r.add_argument("topology")
    r.add_argument("--broker", required=True)
    r.add_argument("--last", type=int, help="only the last N records per partition")
    r.add_argument("--out", required=True)
    r.set_defaults(func=cmd_trace_record)
    r = tsub.add_parser("replay", help="send a trace open-loop to a running topology, report latency")
    r.add_argument("topology")
    r.add_argument("trace")
    r.add_argument("--broker", required=True)
    r.add_argument("--speed", type=float, default=1.0, help="replay this many times faster")
    r.add_argument("--slo-ms", type=float, help="also report the share of requests answered within this")
    r.add_argument("--timeout-ms", type=int, help="per-request deadline (default: the topology's)")
    r.set_defaults(func=cmd_trace_replay)

    p = sub.add_parser("simulate", help="discrete-event simulation of a planned topology over a trace")
    p.add_argument("topology")
    p.add_argument("--trace", required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--slo-ms", type=float, help="attainment threshold (default: the plan's SLO)")
    p.add_argument("--hop-ms", type=float, help="per-hop Kafka latency (default: the plan's)")
    p.add_argument("--overhead-ms", type=float,
                   help="per-batch worker overhead besides the device (default: the plan's)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("plan", help="cheapest hardware, batch and consumers per stage meeting a p99 SLO")
    p.add_argument("topology")
    p.add_argument("--trace", required=True)
    p.add_argument("--slo-ms", type=float, required=True)
    p.add_argument("--hardware", help="JSON {kind: price per hour} to plan with (default: the built-in kinds)")
    p.add_argument("--objective", choices=["cost", "energy", "carbon"], default="cost",
                   help="minimise dollars, or joules or grams CO2e per request (the search priced by each kind's "
                        "watts, flowserve.energy.POWER); the plan records all three (docs/energy.md)")
    p.add_argument("--carbon-g-per-kwh", type=float, help="grams CO2e per kWh (default: --carbon-region's)")
    p.add_argument("--carbon-region", help="a region of flowserve.energy.REGIONS (default: world)")
    p.add_argument("--hop-ms", type=float, default=5.0, help="per-hop Kafka latency measured on the target")
    p.add_argument("--overhead-ms", type=float, default=5.0,
                   help="what a worker spends per batch besides the device, measured on the target at saturation "
                        "('flowserve bench tuner' prints it)")
    p.add_argument("--headroom", type=float, default=2.0, help="partitions = most consumers x this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="plan file (default: <topology>.plan.json)")
    p.add_argument("-v", "--verbose", action="store_true", help="log each search step")
    p.add_argument("--no-fuse", action="store_true",
                   help="plan every node as a stage of its own (by default the planner fuses chains of adjacent "
                        "stages where the simulation says that is cheaper, or as cheap with a lower p99)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw the trace's arrival envelope against the planned service curves (needs matplotlib)")
    p.set_defaults(func=cmd_plan)
    register_tune(sub)


def cmd_tune(args: argparse.Namespace) -> int:
    from flowserve.runtime.host import ProcessHost, create_topology_topics
    from flowserve.tuning.plan import apply_plan, load_plan
    from flowserve.tuning.scalers import KubernetesScaler, LocalScaler, Scaler
    from flowserve.tuning.tuner import tune

    plan = load_plan(args.plan)
    topology = apply_plan(load_topology(args.topology), plan)
    kafka = KafkaSettings.from_env(args.broker)
    host = None
    scaler: Scaler
    if args.kubernetes:
        scaler = KubernetesScaler(topology.name, args.kubernetes, topics=topology.topics())
        scaler.load()
    else:
        host = ProcessHost(Path(args.topology), topology, kafka, extra_args=["--plan", args.plan])
        asyncio.run(create_topology_topics(topology, kafka))
        host.start_processes()
        scaler = LocalScaler(host)
    err.print(f"tuning '{topology.name}': {plan.partitions} partitions, SLO {plan.slo_ms:g} ms; Ctrl-C to stop")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await tune(topology, plan, kafka, scaler, stop=stop, hold_s=args.hold_s, hysteresis=args.hysteresis,
                   horizon_s=args.horizon_s, rule=args.rule, max_partitions=args.max_partitions,
                   on_action=lambda a: out.print(f"{time.strftime('%H:%M:%S')} scale {a.stage} "
                                                 f"{a.before} -> {a.after}: {a.reason}"))

    try:
        asyncio.run(main())
    finally:
        if host is not None:
            host.stop()
    return 0


def register_tune(sub: Any) -> None:
    p = sub.add_parser("tune", help="resize each stage's consumers as the live arrival envelope changes")
    p.add_argument("topology")
    p.add_argument("--plan", required=True)
    p.add_argument("--broker", required=True)
    p.add_argument("--hold-s", type=float, default=30.0,
                   help="stay below this long before scaling down (doubled, up to 300 s, while scale-downs are "
                        "undone soon after)")
    p.add_argument("--hysteresis", type=float, default=0.1,
                   help="scale down only below (1 - h) of the need (0.1: the Kubernetes HPA's tolerance)")
    p.add_argument("--horizon-s", type=float, default=60.0, help="longest envelope window (seconds of history)")
    p.add_argument("--rule", choices=RULES, default=RULES[0],
                   help="size stages on the live rate against one consumer's simulated safe rate (profile), on "
                        "the delay bound of the live envelope (bound), or relative to the plan's envelope "
                        "(relative: InferLine's trigger)")
    p.add_argument("--max-partitions", type=int, metavar="N",
                   help="let stages scale past the plan's partitions: grow every topic of the topology together, "
                        "up to N (CreatePartitions: Apache Kafka; partitions are never removed)")
    p.add_argument("--kubernetes", metavar="NAMESPACE",
                   help="scale Deployments flowserve-<topology>-<node> there (as flowserve deploy renders them; "
                        "their KEDA ScaledObjects pinned) instead of starting local workers")
    p.set_defaults(func=cmd_tune)
