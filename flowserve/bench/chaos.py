"""``flowserve bench chaos``: steady traffic through faults injected at random, then a full accounting.

A two-stage topology of pass-through stages (``pre`` → ``model`` ×2) runs on Apache Kafka the way
``flowserve run`` runs it: each worker its own OS process under :class:`~flowserve.runtime.supervise.Supervisor`,
and a ``flowserve gateway`` process in front. Two callers send at fixed rates for the whole run: HTTP (V2
JSON through the gateway) and asynchronous (:class:`~flowserve.client.TopologyClient` over Kafka). Meanwhile
faults come at seeded random intervals: SIGKILL of a worker (the supervisor restarts it), SIGSTOP of a
worker for a few seconds, a gateway restart on the same port, and with ``--nodes 3`` a broker node killed
and restarted or frozen for a few seconds (``--no-pause-broker`` leaves the freezes out).

At the end it checks, independently:

- at the callers: every request has exactly one outcome: a result, an error result with its reason, or
  (HTTP only) a failed call because the gateway it was talking to died; an async request without a reply
  is *lost*;
- on the topics: every request id written to the inputs topic is answered on the outputs topic or a
  gateway's reply topic; duplicates (at-least-once redelivery after a kill) are counted, not hidden;
- every node's consumer group is back to zero lag;
- the resident memory of every process stayed bounded (:class:`~flowserve.bench.chaos_audit.MemoryLog`).

There is no baseline to compare with: the figures are counts, and the targets are exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from flowserve.bench.chaos_audit import MemoryLog, audit_topics, wait_lag_zero
from flowserve.bench.common import console
from flowserve.client import TopologyClient
from flowserve.client.http import AsyncHttpClient
from flowserve.client.traffic import wait_ready
from flowserve.kafka.brokers import DEV_JVM, ApacheKafka, Broker, free_port
from flowserve.kafka.replies import Reply
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.runtime.supervise import RestartPolicy, Supervisor
from flowserve.topology import load_topology
from flowserve.topology.graph import Topology

TOPOLOGY = """
name: NAME
description: two pass-through stages, the second with two replicas, for flowserve bench chaos
partitions: 4
deadline_ms: 20000
nodes:
  pre:
    component: flowserve.builtin:Identity
    params: {ports: {x: {datatype: FP32, shape: [-1, 4]}}}
    inputs: {x: input.x}
  model:
    component: flowserve.builtin:Identity
    params: {ports: {x: {datatype: FP32, shape: [-1, 4]}}}
    inputs: {x: pre.x}
    replicas: 2
outputs: {y: model.x}
"""
_JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class ChaosConfig:
    seconds: float = 600.0
    seed: int = 17
    #: broker nodes: 1, or 3 for replicated topics and broker kills
    nodes: int = 1
    http_rate: float = 20.0
    async_rate: float = 20.0
    #: mean gap between faults (each gap is uniform in 0.5..1.5 times this)
    fault_every_s: float = 20.0
    #: also freeze a broker node (SIGSTOP) for a few seconds; needs nodes=3
    pause_broker: bool = True
    #: after the traffic stops: how long replies and lag may take to settle
    settle_s: float = 180.0


@dataclass
class Fault:
    at_s: float
    kind: str
    target: str
    note: str = ""


@dataclass
class Callers:
    """Each request's one outcome at its caller, by request id."""

    http: dict[str, str] = field(default_factory=dict)  # rid -> "ok" | "error: reason" | "failed: reason"
    http_sent: int = 0
    async_futures: dict[str, asyncio.Future[Reply]] = field(default_factory=dict)
    async_send_errors: dict[str, str] = field(default_factory=dict)
    wrong_values: list[str] = field(default_factory=list)


class Gateway:
    """A ``flowserve gateway`` process on a fixed port that the chaos run kills and starts again."""

    def __init__(self, topology_path: Path, kafka: KafkaSettings, port: int, log: Path) -> None:
        self.topology_path, self.kafka, self.port, self.log = topology_path, kafka, port, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1", FLOWSERVE_FETCH_MAX_WAIT_MS=str(self.kafka.fetch_max_wait_ms),
                   FLOWSERVE_IDEMPOTENCE="1" if self.kafka.idempotence else "0")
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "flowserve", "gateway", str(self.topology_path),
                                          "--broker", self.kafka.bootstrap, "--port", str(self.port)],
                                         stdout=out, stderr=subprocess.STDOUT, env=env)
        self.starts += 1

    async def ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        http = AsyncHttpClient(f"http://127.0.0.1:{self.port}", timeout_s=5.0)
        try:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"the gateway exited with {self.proc.returncode}; see {self.log}")
                with contextlib.suppress(OSError, TimeoutError, asyncio.IncompleteReadError):
                    if (await http.get("/v2/health/ready")).status == 200:
                        return
                await asyncio.sleep(0.2)  # polling a starting server, not a synchronisation
        finally:
            await http.close()
        raise RuntimeError(f"the gateway on port {self.port} was not ready within {timeout_s:g} s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _row(i: int) -> np.ndarray:
    return np.full((1, 4), float(i % 100_000), np.float32)


def _body(rid: str, i: int) -> bytes:
    return json.dumps({"id": rid, "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                                              "data": _row(i).ravel().tolist()}]}).encode()


async def _http_traffic(port: int, model: str, rate: float, until: float, callers: Callers) -> None:
    """Open loop at a fixed rate: one task per request, each ends with exactly one outcome."""
    http = AsyncHttpClient(f"http://127.0.0.1:{port}", timeout_s=30.0)
    tasks: set[asyncio.Task[None]] = set()

    async def one(rid: str, i: int) -> None:
        try:
            reply = await http.request("POST", f"/v2/models/{model}/infer", _body(rid, i), _JSON)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            callers.http[rid] = f"failed: {type(exc).__name__}"
            return
        if reply.status == 200:
            if not np.array_equal(reply.outputs()["y"], _row(i)):
                callers.wrong_values.append(rid)
            callers.http[rid] = "ok"
        else:
            callers.http[rid] = f"error: {reply.status} {(reply.error or '')[:60]}"

    i = 0
    start = time.monotonic()
    while (now := time.monotonic()) < until:
        due = start + i / rate
        if due > now:
            await asyncio.sleep(due - now)
            continue
        rid = f"h{i}"
        task = asyncio.create_task(one(rid, i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        callers.http_sent += 1
        i += 1
    if tasks:
        await asyncio.wait(tasks)
    await http.close()


async def _async_traffic(client: TopologyClient, rate: float, until: float, callers: Callers) -> None:
    """Every 100 ms, the requests due by then in one flush; each request's reply future is kept."""
    i = 0
    start = time.monotonic()
    while (now := time.monotonic()) < until:
        due = int((now - start) * rate)
        batch = []
        while i < due:
            rid = f"a{i}"
            callers.async_futures[rid] = client.expect(rid)
            await client.queue({"x": _row(i)}, request_id=rid)
            batch.append(rid)
            i += 1
        try:
            await client.flush()
        except Exception as exc:  # noqa: BLE001 - a broker fault: the caller is told, the request is not lost
            for rid in batch:
                callers.async_send_errors[rid] = f"{type(exc).__name__}: {exc}"[:80]
        await asyncio.sleep(0.1)


class Faults:
    """Seeded random faults, one at a time, each logged with its time and target."""

    def __init__(self, cfg: ChaosConfig, host: ProcessHost, gateway: Gateway, broker: ApacheKafka | None,
                 t0: float) -> None:
        self.cfg, self.host, self.gateway, self.broker, self.t0 = cfg, host, gateway, broker, t0
        self.rng = random.Random(cfg.seed)
        self.log: list[Fault] = []
        self.kinds = ["kill-worker", "stop-worker", "restart-gateway"]
        self._bag: list[str] = []
        if broker is not None and cfg.nodes == 3:
            self.kinds.append("kill-broker")
            if cfg.pause_broker:
                self.kinds.append("pause-broker")

    def _next_kind(self) -> str:
        """Every kind once per round, in a seeded random order: a short run still sees each of them."""
        if not self._bag:
            self._bag = self.rng.sample(self.kinds, len(self.kinds))
        return self._bag.pop()

    def _slot(self) -> tuple[str, int]:
        slots = [(node, i) for node, procs in self.host.procs.items() for i in range(len(procs))]
        return self.rng.choice(slots)

    def _note(self, kind: str, target: str, note: str = "") -> None:
        fault = Fault(time.monotonic() - self.t0, kind, target, note)
        self.log.append(fault)
        console.print(f"  {fault.at_s:7.1f} s  {kind:<16} {target} {note}")

    async def run(self, until: float) -> None:
        while True:
            gap = self.cfg.fault_every_s * self.rng.uniform(0.5, 1.5)
            if time.monotonic() + gap >= until:
                return
            await asyncio.sleep(gap)
            await self.inject(self._next_kind())

    async def inject(self, kind: str) -> None:
        if kind == "kill-worker":
            node, i = self._slot()
            proc = self.host.procs[node][i]
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            self._note(kind, f"worker {node}[{i}] pid {proc.pid}")
        elif kind == "stop-worker":
            node, i = self._slot()
            proc = self.host.procs[node][i]
            hold = self.rng.uniform(2.0, 6.0)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGSTOP)
            self._note(kind, f"worker {node}[{i}] pid {proc.pid}", f"for {hold:.1f} s")
            try:
                await asyncio.sleep(hold)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
        elif kind == "restart-gateway":
            pid = self.gateway.proc.pid if self.gateway.proc else 0
            self.gateway.kill()
            self._note(kind, f"gateway pid {pid}", f"port {self.gateway.port}")
            self.gateway.start()
            await self.gateway.ready()
        elif kind == "kill-broker" and self.broker is not None:
            b = self.rng.randrange(self.cfg.nodes)
            down = self.rng.uniform(3.0, 8.0)
            self.broker.kill_node(b)
            self._note(kind, f"broker node {b}", f"down {down:.1f} s")
            await asyncio.sleep(down)
            await asyncio.to_thread(self.broker.restart_node, b)
        elif kind == "pause-broker" and self.broker is not None:
            b = self.rng.randrange(self.cfg.nodes)
            hold = self.rng.uniform(2.0, 5.0)
            self.broker.pause_node(b)
            self._note(kind, f"broker node {b}", f"for {hold:.1f} s")
            try:
                await asyncio.sleep(hold)
            finally:
                self.broker.resume_node(b)


def _roles(host: ProcessHost, gateway: Gateway, broker: Broker) -> list[tuple[str, int]]:
    roles = [(f"worker {node}[{i}]", p.pid) for node, procs in host.procs.items() for i, p in enumerate(procs)]
    if gateway.proc is not None:
        roles.append(("gateway", gateway.proc.pid))
    # a broker node keeps its role across restarts, so its memory reads as one series
    pids = broker.node_pids if isinstance(broker, ApacheKafka) else list(broker.pids)
    roles += [(f"broker node {i}", pid) for i, pid in enumerate(pids) if pid is not None]
    roles.append(("bench (callers)", os.getpid()))
    return roles


async def _sample_memory(memory: MemoryLog, roles: Any, every_s: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        memory.sample(roles())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def chaos(cfg: ChaosConfig, broker: Broker | None = None, name: str = "chaos") -> dict[str, Any]:
    """Start everything, run the traffic and the faults for ``cfg.seconds``, settle, account.

    Without ``broker`` it starts Apache Kafka with ``cfg.nodes`` nodes (and stops it after); a given broker
    (the tests') is used as it is, and broker faults need it to be a three-node :class:`ApacheKafka`.
    ``name`` names the topology, so that runs on one broker do not share topics.
    """
    workdir = Path(tempfile.mkdtemp(prefix="flowserve-chaos-"))
    topology_path = workdir / f"{name}.yaml"
    topology_path.write_text(TOPOLOGY.replace("NAME", name))
    topology = load_topology(topology_path)
    if broker is not None:
        return await _run(cfg, broker, topology, topology_path, workdir)
    console.print(f"chaos: starting Apache Kafka ({cfg.nodes} node(s)); logs in {workdir}")
    started = await asyncio.to_thread(ApacheKafka.start, nodes=cfg.nodes, jvm_options=DEV_JVM)
    try:
        return await _run(cfg, started, topology, topology_path, workdir)
    finally:
        await asyncio.to_thread(started.stop)


async def _run(cfg: ChaosConfig, broker: Broker, topology: Topology, topology_path: Path,
               workdir: Path) -> dict[str, Any]:
    kafka = broker.settings()
    await create_topology_topics(topology, kafka)
    host = ProcessHost(topology_path, topology, kafka, log_dir=workdir / "workers")
    host.start_processes()
    # Faults come faster than a crash loop is defined (5 deaths within 30 s of starting): here a quick
    # death is the point, so the supervisor must never give up; its backoff is kept short.
    supervisor = Supervisor(host, RestartPolicy(initial_backoff_s=0.2, max_backoff_s=2.0, max_quick_deaths=10_000),
                            report=lambda line: console.print(f"  [yellow]supervisor[/] {line}"))
    supervisor.start()
    gateway = Gateway(topology_path, kafka, free_port(), workdir / "gateway.log")
    gateway.start()
    client = TopologyClient(topology, kafka)
    callers = Callers()
    memory = MemoryLog()
    stop_sampling = asyncio.Event()
    try:
        await client.start()
        await gateway.ready()
        await wait_ready(client, {"x": _row(0)}, timeout_s=180)
        console.print(f"chaos: {cfg.seconds:g} s of traffic (HTTP {cfg.http_rate:g}/s, async {cfg.async_rate:g}/s), "
                      f"a fault every ~{cfg.fault_every_s:g} s (seed {cfg.seed}); faults:")
        t0 = time.monotonic()
        until = t0 + cfg.seconds
        faults = Faults(cfg, host, gateway, broker if isinstance(broker, ApacheKafka) else None, t0)
        sampler = asyncio.create_task(_sample_memory(memory, lambda: _roles(host, gateway, broker),
                                                     max(1.0, cfg.seconds / 200), stop_sampling))
        await asyncio.gather(_http_traffic(gateway.port, topology.name, cfg.http_rate, until, callers),
                             _async_traffic(client, cfg.async_rate, until, callers),
                             faults.run(until))
        console.print(f"chaos: traffic stopped at {time.monotonic() - t0:.1f} s; waiting for replies and lag")
        pending = [f for f in callers.async_futures.values() if not f.done()]
        if pending:
            await asyncio.wait(pending, timeout=cfg.settle_s)
        lag = await wait_lag_zero(kafka, topology, cfg.settle_s)
        audit = await audit_topics(kafka, topology)
        stop_sampling.set()
        await sampler
        return _account(cfg, callers, faults.log, audit, lag, memory, client.duplicates, supervisor.restarts,
                        gateway.starts - 1)
    finally:
        stop_sampling.set()
        await client.stop()
        supervisor.stop()
        gateway.stop()
        host.stop()


def _account(cfg: ChaosConfig, callers: Callers, faults: list[Fault], audit: Any, lag: dict[str, int],
             memory: MemoryLog, caller_duplicates: int, restarts: int, gateway_restarts: int) -> dict[str, Any]:
    http = Counter(v.split(":", 1)[0] for v in callers.http.values())
    http_reasons = Counter(v for v in callers.http.values() if v != "ok")
    async_ok = async_err = 0
    async_reasons: Counter[str] = Counter()
    lost: list[str] = []
    for rid, fut in callers.async_futures.items():
        if not fut.done():
            fut.cancel()
            if rid in callers.async_send_errors:
                async_reasons[f"send failed: {callers.async_send_errors[rid]}"] += 1
                async_err += 1
            else:
                lost.append(rid)
            continue
        reply = fut.result()
        if reply.error is None:
            async_ok += 1
            if not np.array_equal(reply.tensors["y"], _row(int(rid[1:]))):
                callers.wrong_values.append(rid)
        else:
            async_err += 1
            async_reasons[reply.error[:70]] += 1
    http_answered = sum(http.values())
    unanswered = audit.unanswered
    mem = memory.summary()

    table = Table(title="chaos: faults")
    for col in ("time (s)", "fault", "target", ""):
        table.add_column(col)
    for f in faults:
        table.add_row(f"{f.at_s:.1f}", f.kind, f.target, f.note)
    console.print(table)
    acc = Table(title="chaos: accounting")
    for col in ("caller", "sent", "ok", "error result", "failed (gateway down)", "lost", "duplicates dropped"):
        acc.add_column(col, justify="right")
    acc.add_row("HTTP (gateway)", str(callers.http_sent), str(http["ok"]), str(http["error"]), str(http["failed"]),
                str(callers.http_sent - http_answered), "-")
    acc.add_row("async (Kafka client)", str(len(callers.async_futures)), str(async_ok), str(async_err), "-",
                str(len(lost)), str(caller_duplicates))
    console.print(acc)
    for reason, n in (http_reasons + async_reasons).most_common(8):
        console.print(f"  {n:6d} × {reason}")
    topics = Table(title="chaos: topics (records / distinct request ids)")
    topics.add_column("topic")
    topics.add_column("records", justify="right")
    topics.add_column("distinct ids", justify="right")
    for name, (records, distinct) in audit.per_topic.items():
        topics.add_row(name, str(records), str(distinct))
    console.print(topics)
    console.print(f"inputs answered on some reply topic: {len(audit.inputs) - len(unanswered)} of {len(audit.inputs)}; "
                  f"unanswered {len(unanswered)} {unanswered[:5]}; duplicate answers {audit.duplicate_answers}; "
                  f"lag {lag}; worker restarts {restarts}; gateway restarts {gateway_restarts}")
    mt = Table(title="chaos: resident memory (MiB)")
    for col in ("process", "max", "middle third", "last third", "bounded"):
        mt.add_column(col, justify="right")
    for role, m in sorted(mem.items()):
        mt.add_row(role, f"{m['max_mib']:.0f}", f"{m['middle_mib']:.0f}", f"{m['last_mib']:.0f}", str(m["bounded"]))
    console.print(mt)

    targets = {
        "lost_zero": not lost and not unanswered and not callers.wrong_values,
        "lag_zero": bool(lag) and all(v == 0 for v in lag.values()),
        "memory_bounded": bool(mem) and all(bool(m["bounded"]) for m in mem.values()),
        "every_request_answered_once": http_answered == callers.http_sent and not lost,
    }
    return {
        "workload": "chaos", "seconds": cfg.seconds, "seed": cfg.seed, "nodes": cfg.nodes,
        "faults": [{"at_s": round(f.at_s, 1), "kind": f.kind, "target": f.target, "note": f.note} for f in faults],
        "http": {"sent": callers.http_sent, "ok": http["ok"], "error": http["error"], "failed": http["failed"],
                 "unanswered": callers.http_sent - http_answered},
        "async": {"sent": len(callers.async_futures), "ok": async_ok, "error": async_err, "lost": len(lost),
                  "duplicates_dropped": caller_duplicates},
        "lost": len(lost) + len(unanswered), "lost_ids": (lost + unanswered)[:20],
        "wrong_values": len(callers.wrong_values),
        "topics": {"inputs_ids": len(audit.inputs), "unanswered_ids": len(unanswered),
                   "duplicate_answers": audit.duplicate_answers, "per_topic": audit.per_topic},
        "lag": lag, "worker_restarts": restarts, "gateway_restarts": gateway_restarts,
        "memory_mib": {role: {k: round(v, 1) if isinstance(v, float) else v for k, v in m.items()}
                       for role, m in mem.items()},
        "targets": targets,
    }


def chaos_bench(args: Any) -> dict[str, Any]:
    """``flowserve bench chaos``: the command line's options to a :class:`ChaosConfig`, then the run."""
    cfg = ChaosConfig(seconds=args.minutes * 60, seed=args.seed, nodes=args.nodes,
                      http_rate=args.chaos_rate, async_rate=args.chaos_rate, fault_every_s=args.fault_every,
                      pause_broker=args.pause_broker)
    return asyncio.run(chaos(cfg))
