"""``flowserve bench chaos``: steady traffic through faults injected at random, then a full accounting.

A two-stage topology of pass-through stages (``pre`` → ``model`` ×2) runs on Apache Kafka the way
``flowserve run`` runs it: each worker its own OS process under :class:`~flowserve.runtime.supervise.Supervisor`,
and ``flowserve gateway`` processes in front (two by default, sharing one port as ``flowserve gateway
--processes 2`` runs them). Two callers send at fixed rates for the whole run: HTTP (V2
JSON through the gateway) and asynchronous (:class:`~flowserve.client.TopologyClient` over Kafka). Meanwhile
faults come at seeded random intervals: SIGKILL of a worker (the supervisor restarts it), SIGSTOP of a
worker for a few seconds, a gateway process killed and started again on the same port (one at a time,
so with two gateways one is always serving), and with ``--nodes 3`` a broker node killed
and restarted or frozen for a few seconds (``--no-pause-broker`` leaves the freezes out).

At the end it checks, independently (:mod:`flowserve_bench.chaos_account` turns this into figures and targets):

- at the callers: each request's outcome (a result, an error result with its reason, an HTTP call refused
  or cut by a gateway's death, a send the client was told failed), and every answer that reached a caller,
  so that one answered twice shows; an async request without a reply is *lost*;
- on the topics: every request id written to the inputs topic is answered on the outputs topic or a
  gateway's reply topic; duplicates (at-least-once redelivery after a kill) are counted, not hidden;
- every node's consumer group is back to zero lag;
- the resident memory of every process stayed bounded (:class:`~flowserve_bench.chaos_audit.MemoryLog`).

There is no baseline to compare with: the figures are counts, and the targets are exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import random
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.client import TopologyClient
from flowserve.client.http import AsyncHttpClient
from flowserve.client.traffic import wait_ready
from flowserve.kafka.brokers import DEV_JVM, ApacheKafka, Broker, free_port
from flowserve.kafka.replies import Reply
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.runtime.supervise import RestartPolicy, Supervisor
from flowserve.topology import load_topology
from flowserve.topology.graph import Topology
from flowserve_bench import graphs
from flowserve_bench.chaos_account import Callers, account, expected_row, print_result
from flowserve_bench.chaos_audit import MemoryLog, audit_topics, wait_lag_zero
from flowserve_bench.chaos_gateways import Gateways
from flowserve_bench.common import console

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
    #: gateway processes sharing the HTTP port (SO_REUSEPORT), restarted one at a time
    gateways: int = 2


@dataclass
class Fault:
    at_s: float
    kind: str
    target: str
    note: str = ""


def _row(i: int) -> np.ndarray:
    return expected_row(f"r{i}")


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
        except ConnectionRefusedError as exc:  # nobody listened on the port
            callers.http[rid] = f"refused: {type(exc).__name__}"
            return
        except TimeoutError as exc:  # before OSError: it is one
            callers.http[rid] = f"timeout: {type(exc).__name__}"
            return
        except (OSError, asyncio.IncompleteReadError) as exc:  # the gateway holding the call died
            callers.http[rid] = f"cut: {type(exc).__name__}"
            return
        if reply.status == 200:
            answered = _response_id(reply.body) or rid
            callers.deliveries[answered] += 1
            if answered != rid or not np.array_equal(reply.outputs()["y"], _row(i)):
                callers.wrong_values.append(rid)
            callers.http[rid] = "ok"
        else:
            callers.deliveries[rid] += 1
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


def _response_id(body: bytes) -> str | None:
    """The request id a V2 JSON response says it answers."""
    with contextlib.suppress(ValueError, AttributeError):
        rid = json.loads(body).get("id")
        return rid if isinstance(rid, str) else None
    return None


async def _async_traffic(client: TopologyClient, rate: float, until: float, callers: Callers,
                         futures: dict[str, asyncio.Future[Reply]]) -> None:
    """Every 100 ms, the requests due by then in one flush; each request's reply future is kept."""

    def delivered(rid: str, fut: asyncio.Future[Reply]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            callers.deliveries[rid] += 1

    i = 0
    start = time.monotonic()
    while (now := time.monotonic()) < until:
        due = int((now - start) * rate)
        batch = []
        while i < due:
            rid = f"a{i}"
            futures[rid] = client.expect(rid)
            futures[rid].add_done_callback(functools.partial(delivered, rid))
            await client.queue({"x": _row(i)}, request_id=rid)
            batch.append(rid)
            i += 1
        try:
            await client.flush()
        except Exception as exc:  # noqa: BLE001 - a broker fault: the caller is told, the request is not lost
            for rid in batch:
                callers.async_send_errors[rid] = f"{type(exc).__name__}: {exc}"[:80]
        await asyncio.sleep(0.1)


async def _unclaimed(client: TopologyClient, callers: Callers) -> None:
    """Replies the client hands on although nobody waited for them (an id it no longer knew): each one
    reached the caller, so one for an id already answered is a duplicate that got through."""
    while True:
        reply = await client.replies()
        callers.deliveries[reply.request_id] += 1


def async_outcomes(futures: dict[str, asyncio.Future[Reply]]) -> dict[str, Reply | BaseException | None]:
    """Each async request's reply, the exception its send ended with, or None (none by now: cancelled)."""
    out: dict[str, Reply | BaseException | None] = {}
    for rid, fut in futures.items():
        if not fut.done():
            fut.cancel()
        out[rid] = None if fut.cancelled() else (fut.exception() or fut.result())
    return out


class Faults:
    """Seeded random faults, one at a time, each logged with its time and target."""

    def __init__(self, cfg: ChaosConfig, host: ProcessHost, gateways: Gateways, broker: ApacheKafka | None,
                 t0: float) -> None:
        self.cfg, self.host, self.gateways, self.broker, self.t0 = cfg, host, gateways, broker, t0
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
        elif kind == "restart-gateway":  # one at a time: the others keep the port served meanwhile
            slot = self.rng.randrange(len(self.gateways.procs))
            old = self.gateways.procs[slot]
            self.gateways.kill(slot)
            self._note(kind, f"gateway[{slot}] pid {old.pid if old else 0}", f"port {self.gateways.port}")
            self.gateways.start(slot)
            await self.gateways.listening(slot)
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


def _roles(host: ProcessHost, gateways: Gateways, broker: Broker) -> list[tuple[str, int]]:
    roles = [(f"worker {node}[{i}]", p.pid) for node, procs in host.procs.items() for i, p in enumerate(procs)]
    roles += [(f"gateway[{i}]", p.pid) for i, p in enumerate(gateways.procs) if p is not None]
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
    topology_path.write_text(graphs.text("chaos.yaml", name))
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
    gateways = Gateways(topology_path, kafka, free_port(), workdir, cfg.gateways)
    for slot in range(cfg.gateways):
        gateways.start(slot)
    client = TopologyClient(topology, kafka)
    callers = Callers()
    futures: dict[str, asyncio.Future[Reply]] = {}
    memory = MemoryLog()
    stop_sampling = asyncio.Event()
    unclaimed: asyncio.Task[None] | None = None
    try:
        await client.start()
        await gateways.ready()
        await wait_ready(client, {"x": _row(0)}, timeout_s=180)
        unclaimed = asyncio.create_task(_unclaimed(client, callers))
        console.print(f"chaos: {cfg.seconds:g} s of traffic (HTTP {cfg.http_rate:g}/s through {cfg.gateways} "
                      f"gateway(s) on one port, async {cfg.async_rate:g}/s), a fault every ~{cfg.fault_every_s:g} s "
                      f"(seed {cfg.seed}); faults:")
        t0 = time.monotonic()
        until = t0 + cfg.seconds
        faults = Faults(cfg, host, gateways, broker if isinstance(broker, ApacheKafka) else None, t0)
        sampler = asyncio.create_task(_sample_memory(memory, lambda: _roles(host, gateways, broker),
                                                     max(1.0, cfg.seconds / 200), stop_sampling))
        await asyncio.gather(_http_traffic(gateways.port, topology.name, cfg.http_rate, until, callers),
                             _async_traffic(client, cfg.async_rate, until, callers, futures),
                             faults.run(until))
        console.print(f"chaos: traffic stopped at {time.monotonic() - t0:.1f} s; waiting for replies and lag")
        pending = [f for f in futures.values() if not f.done()]
        if pending:
            await asyncio.wait(pending, timeout=cfg.settle_s)
        lag = await wait_lag_zero(kafka, topology, cfg.settle_s)
        audit = await audit_topics(kafka, topology)
        stop_sampling.set()
        await sampler
        callers.async_outcomes = async_outcomes(futures)
        result = {"workload": "chaos", "seconds": cfg.seconds, "seed": cfg.seed, "nodes": cfg.nodes,
                  "faults": [{"at_s": round(f.at_s, 1), "kind": f.kind, "target": f.target, "note": f.note}
                             for f in faults.log],
                  "worker_restarts": supervisor.restarts, "gateway_restarts": gateways.starts - cfg.gateways,
                  **account(callers, audit, lag, memory.summary(), client_dropped=client.duplicates,
                            gateways=cfg.gateways)}
        print_result(result)
        return result
    finally:
        stop_sampling.set()
        if unclaimed is not None:
            unclaimed.cancel()
        await client.stop()
        supervisor.stop()
        gateways.stop()
        host.stop()
