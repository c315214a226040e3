"""The cost of capture, measured as ``flowserve run`` deploys: one worker process per node
(:class:`~flowserve.runtime.host.ProcessHost`), this process as the load generator, one broker.

Two questions. Each compares configurations in interleaved slices of ``slice_s`` seconds, because this
machine's speed drifts by tens of percent over seconds on its own (:mod:`flowserve_bench.paired`):

1. Throughput at saturation (closed loop, ``CONCURRENCY`` requests in flight) of the digits topology with
   capture off, 10% and 100% of requests captured (lineage records and OpenTelemetry spans for each
   captured request). The three are deployed side by side and take the load in turn, one slice each
   (in :func:`~flowserve_bench.paired.balanced_order`), ``seconds`` in all per configuration; ratios to
   off with 95% intervals, and each process's CPU per request (workers and load generator; at
   saturation, throughput is CPU per request, and the CPU figures show where capture's cost goes).
2. The critical path's p50, p90 and p99 at a steady ``rate`` (open loop): the digits topology deployed
   three times side by side, once with a drift detector process on ``pre.x`` (a side branch) and twice
   without, taking the load in turn, ``seconds`` in all for each; percentile(detector) / percentile(both
   without) over every slice, with a 95% interval, next to the ratio of the two without (an A/A comparison:
   the measurement's own noise floor).

::

    flowserve bench capture --seconds 60 --rate 200

CPU per request, and the part spent in capture itself: :mod:`flowserve_bench.capture_cpu`
(``flowserve bench capture --only cpu``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from flowserve.client import TopologyClient
from flowserve.client.kafka import new_request_id
from flowserve.client.traffic import prepare_to_drive, wait_ready
from flowserve.component import import_library
from flowserve.errors import BrokerError
from flowserve.kafka.admin import delete_topics
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.topology.graph import Topology, load_topology_text
from flowserve_bench import graphs, paired
from flowserve_bench.common import console, cpu_seconds, run_id
from flowserve_bench.latency import open_loop
from flowserve_bench.paired import Slice

T = TypeVar("T")
CONCURRENCY = 64
#: seconds per slice: shorter than the machine's slow and fast stretches, long enough for batches to settle
SLICE_S = 2.0
#: seconds of open-loop load per side before part 2 measures: a fresh Kafka JVM compiles its hot paths
#: (C2) for the first ~10 s under load, using ~1 of the 2 cores, which slows every hop while it lasts
WARM_S = 5.0
#: fresh deployments per part: deployments of one configuration differ by 5-15% on their own
BLOCKS = 3
SATURATION = {"off": None, "10pct": 0.1, "100pct": 1.0}
#: the bench's two parts (``flowserve bench capture --only PART`` runs one)
PARTS = ("saturation", "detector")
#: part 2's deployments: with a detector, without, and a second without (the A/A control)
DETECTOR_SIDES = ("detector", "none", "none_again")


def topology(sample: float | None, detector: bool = False) -> tuple[str, Topology]:
    """``topologies/capture.yaml`` under a fresh name: capture off (``sample`` None) or sampling ``sample``
    with lineage and tracing, its drift detector on or removed."""
    changes: dict[str, Any] = {"capture": graphs.DROP if sample is None else
                               {"sample": sample, "lineage": True, "tracing": True}}
    if not detector:
        changes["nodes.input_drift"] = graphs.DROP
    text = graphs.text("capture.yaml", f"cap{run_id()}", changes)
    return text, load_topology_text(text, source="bench")


def sample_inputs(n: int) -> list[dict[str, np.ndarray]]:
    requests, _ = import_library("flowserve_components.digits").sample(n, seed=0)
    return requests


@dataclass
class Deployment:
    """A topology deployed as ``flowserve run`` deploys it: its workers, its side branch (the explainer,
    where the topology has an ``explain:`` section; None otherwise) and a client."""

    host: ProcessHost
    client: TopologyClient
    side: subprocess.Popen[bytes] | None = None

    def pids(self) -> dict[str, int]:
        """Each worker's process id by node, and the side branch's as ``explainer``."""
        out = {node: procs[0].pid for node, procs in self.host.procs.items()}
        if self.side is not None:
            out["explainer"] = self.side.pid
        return out


@contextlib.asynccontextmanager
async def deployed(kafka: KafkaSettings, text: str, topology: Topology, tmp: Path) -> Any:
    """The topology's workers as processes, as ``flowserve run`` starts them (with its explainer, niced,
    where it has an ``explain:`` section), and a client: a :class:`Deployment`."""
    path = tmp / f"{topology.name}.yaml"
    path.write_text(text)
    await create_topology_topics(topology, kafka)
    host = ProcessHost(path, topology, kafka, log_dir=tmp / "logs")
    for node_id in topology.nodes:
        host.spawn(node_id)
    side = None
    if topology.explained:
        side = subprocess.Popen([sys.executable, "-m", "flowserve", "explainer", str(path),  # noqa: S603
                                 "--broker", kafka.bootstrap], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=host.environment())
    try:
        async with TopologyClient(topology, kafka) as client:
            yield Deployment(host, client, side)
    finally:
        host.stop(also=[side])
        # The embedded broker keeps everything in memory and slows as it fills: each deployment's data
        # would otherwise weigh on the ones measured after it.
        with contextlib.suppress(BrokerError):
            await delete_topics(kafka, topology.topics())


async def warm(client: TopologyClient, inputs: list[dict[str, np.ndarray]]) -> None:
    await wait_ready(client, inputs[0], timeout_s=180)
    for x in inputs[:100]:  # batch policy, caches, consumer fetch sessions
        await client.call(x, timeout_ms=30_000)


async def saturate(client: TopologyClient, inputs: list[dict[str, np.ndarray]], seconds: float) -> Slice:
    """Closed loop with CONCURRENCY requests in flight for ``seconds``, then drain."""
    latencies: list[float] = []
    started: dict[str, float] = {}
    inflight: set[asyncio.Future[Any]] = set()
    sent = 0
    t0 = time.perf_counter()
    stop_at = t0 + seconds
    while time.perf_counter() < stop_at or inflight:
        while time.perf_counter() < stop_at and len(inflight) < CONCURRENCY:
            rid = new_request_id()
            inflight.add(client.expect(rid))
            started[rid] = time.perf_counter()
            await client.queue(inputs[sent % len(inputs)], request_id=rid, timeout_ms=60_000)
            sent += 1
        await client.flush()  # one produce for everything queued this round
        done, inflight = await asyncio.wait(inflight, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            raise TimeoutError(f"no reply within 60 s ({len(inflight)} in flight)")
        now = time.perf_counter()
        for future in done:
            reply = future.result()
            assert reply.error is None, reply.error
            latencies.append((now - started.pop(reply.request_id)) * 1000)
    return Slice(len(latencies), time.perf_counter() - t0, latencies)


async def _steady(client: TopologyClient, inputs: list[dict[str, np.ndarray]], rate: float,
                  seconds: float) -> list[float]:
    """Open loop at ``rate`` for ``seconds``: the critical path's latencies in ms."""
    lock = asyncio.Lock()
    counter = iter(range(10**9))

    async def send(_: int) -> None:
        rid = new_request_id()
        future = client.expect(rid)
        async with lock:
            await client.send(inputs[next(counter) % len(inputs)], request_id=rid, timeout_ms=30_000)
        reply = await asyncio.wait_for(future, 30)
        assert reply.error is None, reply.error

    return await open_loop(send, rate, seconds)


async def _first_report(kafka: KafkaSettings, topology: Topology, timeout_s: float = 180.0) -> None:
    """Wait until the detector has imported alibi-detect and closed a window (measure it working)."""
    from flowserve.capture.drift import drift_state

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if await drift_state(kafka, topology.name, prefix=topology.spec.prefix, timeout_s=10):
                return
        await asyncio.sleep(0.5)
    raise TimeoutError("the drift detector did not report within the timeout")


def slice_count(seconds: float, slice_s: float) -> int:
    return max(2, round(seconds / slice_s))


async def in_blocks(kafka: KafkaSettings, tmp: Path, sides: Mapping[str, Callable[[], tuple[str, Topology]]],
                     blocks: int, per_block: int, ready: Callable[[dict[str, TopologyClient]], Awaitable[None]],
                     measure: Callable[[str, Deployment], Awaitable[T]],
                     ) -> tuple[dict[str, list[T]], list[int]]:
    """Deploy every side (``sides``: a function making its topology) afresh in each of ``blocks`` blocks,
    side by side; once ``ready``, let them take ``per_block`` slices each of ``measure`` (given the side's
    label, workers and client) in :func:`paired.balanced_order`. Returns every side's slices, and the block
    of each slice index."""
    out: dict[str, list[T]] = {label: [] for label in sides}
    block_of: list[int] = []
    for block in range(blocks):
        async with contextlib.AsyncExitStack() as stack:
            deployments: dict[str, Deployment] = {}
            for label, make in sides.items():
                deployments[label] = await stack.enter_async_context(deployed(kafka, *make(), tmp))
            await ready({label: d.client for label, d in deployments.items()})
            order = paired.balanced_order(list(sides), per_block)
            for label in order:
                out[label].append(await measure(label, deployments[label]))
            block_of += [block] * order.count(order[0])
        console.print(f"block {block + 1}/{blocks} done: {len(block_of)} slices per side")
    return out, block_of


async def _saturation(kafka: KafkaSettings, inputs: list[dict[str, np.ndarray]], tmp: Path, seconds: float,
                      slice_s: float, blocks: int) -> dict[str, Any]:
    """Part 1: the capture configurations side by side, taking the closed-loop load in turn."""

    async def ready(clients: dict[str, TopologyClient]) -> None:
        for client in clients.values():
            await warm(client, inputs)
            await saturate(client, inputs, slice_s)  # batch sizes and caches at load, not measured

    # CPU seconds per side: each worker process's and the load generator's (this process), over its slices
    cpu: dict[str, dict[str, float]] = {label: {} for label in SATURATION}

    async def measure(label: str, deployment: Deployment) -> Slice:
        pids = deployment.pids()
        before = {node: cpu_seconds(pid) for node, pid in pids.items()} | {"load": cpu_seconds()}
        piece = await saturate(deployment.client, inputs, slice_s)
        after = {node: cpu_seconds(pid) for node, pid in pids.items()} | {"load": cpu_seconds()}
        for name, t in after.items():
            cpu[label][name] = cpu[label].get(name, 0.0) + t - before[name]
        return piece

    sides = {label: functools.partial(topology, sample) for label, sample in SATURATION.items()}
    slices, block_of = await in_blocks(kafka, tmp, sides, blocks, slice_count(seconds / blocks, slice_s), ready,
                                        measure)
    result: dict[str, Any] = {label: paired.summary(s) for label, s in slices.items()}
    # Throughput at saturation is CPU per request on this machine, and CPU per request is far steadier than
    # throughput: where capture's cost goes, per process (the broker's is not included).
    per_request = {label: {name: t / sum(s.requests for s in slices[label]) * 1e6 for name, t in sorted(c.items())}
                   for label, c in cpu.items()}
    for c in per_request.values():
        c["total"] = sum(c.values())
    result["cpu_us_per_request"] = per_request
    for label, c in per_request.items():
        console.print(f"CPU per request, {label:>6}: " + ", ".join(f"{k} {v:.0f}" for k, v in c.items()) + " us")
    result["cpu_off_vs_100pct"] = per_request["off"]["total"] / per_request["100pct"]["total"]
    console.print(f"CPU per request, off / 100pct: {result['cpu_off_vs_100pct']:.3f}")
    for label in ("10pct", "100pct"):
        ratio, low, high = paired.throughput_ratio(slices[label], slices["off"], blocks=block_of)
        result[f"throughput_{label}_vs_off"] = {"ratio": ratio, "95ci": [low, high]}
        ratio, low, high = paired.percentile_ratio([s.latencies for s in slices[label]],
                                                   [s.latencies for s in slices["off"]], blocks=block_of)
        result[f"p99_{label}_vs_off"] = {"ratio": ratio, "95ci": [low, high]}
    result["per_block_throughput_100pct_vs_off"] = [
        paired.throughput([slices["100pct"][i] for i in pick]) / paired.throughput([slices["off"][i] for i in pick])
        for pick in paired.block_members(block_of)]
    result["slice_throughput_rps"] = {label: [round(s.requests / s.seconds) for s in v] for label, v in slices.items()}
    return result


async def _detector(kafka: KafkaSettings, inputs: list[dict[str, np.ndarray]], tmp: Path, rate: float,
                    seconds: float, slice_s: float, blocks: int) -> dict[str, Any]:
    """Part 2: three deployments side by side, one with a detector and two without, taking the open-loop
    load in turn, one slice each (paired.balanced_order). The detector runs throughout, as it would in
    production: it works while its deployment has traffic and waits on its fetches otherwise. The two
    deployments without one give the measurement's own noise floor: their ratio (an A/A comparison,
    nothing differs) is what the detector's ratio must be read against."""

    async def ready(clients: dict[str, TopologyClient]) -> None:
        for client in clients.values():
            await warm(client, inputs)
        await _first_report(kafka, clients["detector"].topology)
        for client in clients.values():
            await _steady(client, inputs, rate, max(slice_s, WARM_S))  # at the rate, not measured

    sides = {label: functools.partial(topology, None, detector=label == "detector") for label in DETECTOR_SIDES}
    latencies, block_of = await in_blocks(kafka, tmp, sides, blocks, slice_count(seconds / blocks, slice_s), ready,
                                           lambda _label, d: _steady(d.client, inputs, rate, slice_s))
    result: dict[str, Any] = {label: paired.summary([Slice(len(s), slice_s, s) for s in v])
                              for label, v in latencies.items()}
    # p99 is made of a few stalls (the broker's, the host's) whichever side they fall on, so its interval
    # is wide; the lower percentiles show whether the detector moves the body of the distribution.
    # Deployments differ a little on their own (the A/A ratio), so the detector's is taken against both
    # without: slice i of the reference is slice i of each.
    without = [a + b for a, b in zip(latencies["none"], latencies["none_again"], strict=True)]
    for q in (50, 90, 99):
        ratio, low, high = paired.percentile_ratio(latencies["detector"], without, q=q, blocks=block_of)
        result[f"p{q}_detector_vs_none"] = {"ratio": ratio, "95ci": [low, high]}
        ratio, low, high = paired.percentile_ratio(latencies["none_again"], latencies["none"], q=q, blocks=block_of)
        result[f"p{q}_none_vs_none"] = {"ratio": ratio, "95ci": [low, high]}
    per_block: dict[str, list[float]] = {"p99_detector_vs_none": [], "p99_none_vs_none": []}
    for pick in paired.block_members(block_of):  # how far deployments alone move the ratio

        def p99_of(side: list[list[float]], pick: list[int] = pick) -> float:
            return paired.p99([x for i in pick for x in side[i]])

        per_block["p99_detector_vs_none"].append(p99_of(latencies["detector"]) / p99_of(without))
        per_block["p99_none_vs_none"].append(p99_of(latencies["none_again"]) / p99_of(latencies["none"]))
    result["per_block"] = per_block
    return result


async def capture_bench(kafka: KafkaSettings, rate: float = 200.0, seconds: float = 60.0,
                        slice_s: float = SLICE_S, parts: tuple[str, ...] = PARTS,
                        blocks: int = BLOCKS) -> dict[str, Any]:
    """``parts`` (both by default); ``seconds`` of measurement per configuration (and per side of the
    detector), in ``blocks`` fresh deployments."""
    inputs = sample_inputs(1000)
    # Trains the model once if it is not cached. Unfrozen, this process's (the load generator's) full
    # collections stall whichever side is taking load: the p99's lottery.
    prepare_to_drive(topology(None)[1])
    result: dict[str, Any] = {"workload": "capture", "layout": "ProcessHost workers, load from the bench process",
                              "seconds": seconds, "slice_s": slice_s, "blocks": blocks, "rate": rate,
                              "concurrency": CONCURRENCY}
    ratios: dict[str, Any] = {}
    targets: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="fs-bench-capture-") as tmp:
        if "saturation" in parts:
            result["saturation"] = saturation = await _saturation(kafka, inputs, Path(tmp), seconds, slice_s, blocks)
            for name in ("throughput_10pct_vs_off", "throughput_100pct_vs_off", "p99_10pct_vs_off",
                         "p99_100pct_vs_off"):
                ratios[name] = saturation[name]
            # decided on the interval's conservative end: a point estimate above the line with an interval
            # that straddles it says nothing
            targets["capture_100pct_costs_le_15pct"] = ratios["throughput_100pct_vs_off"]["95ci"][0] >= 0.85
        if "detector" in parts:
            result["detector"] = detector = await _detector(kafka, inputs, Path(tmp), rate, seconds, slice_s, blocks)
            for q in (50, 90, 99):
                ratios[f"p{q}_detector_vs_none"] = detector[f"p{q}_detector_vs_none"]
                ratios[f"p{q}_none_vs_none"] = detector[f"p{q}_none_vs_none"]  # the A/A noise floor
            targets["detector_raises_p99_le_5pct"] = ratios["p99_detector_vs_none"]["95ci"][1] <= 1.05
    for name, value in ratios.items():
        low, high = value["95ci"]
        console.print(f"{name}: {value['ratio']:.3f} (95% interval {low:.3f}-{high:.3f})")
    return {**result, "ratios": ratios, "targets": targets}
