"""The cost of capture, measured as ``flowserve run`` deploys: one worker process per node
(:class:`~flowserve.runtime.host.ProcessHost`), this process as the load generator, one broker.

Two questions, each answered with configurations interleaved round by round (the order rotates) and
the median over rounds, because the machine is shared and noisy:

1. Throughput at saturation (closed loop, ``CONCURRENCY`` requests in flight, ``seconds`` per run) of
   the digits topology with capture off, 10% and 100% of requests captured (lineage records and
   OpenTelemetry spans for each captured request); ratios to off.
2. The critical path's p99 at a steady ``rate`` (open loop) in one deployment with a drift detector
   process reading ``pre.x`` (a side branch), alternately running and SIGSTOPped, ``DETECTOR_PHASES``
   times each for ``seconds / 2``; the ratio p99(with) / p99(without) over the latencies of every
   round's phases, with a bootstrap 95% interval (a p99 of a few thousand requests moves by ~10% from
   run to run on its own), and each round's own ratio.

::

    flowserve bench capture --seconds 8 --rate 100

Throughput on a shared machine is noisy; :func:`capture_cpu` measures CPU per request instead (every
stage in one process), including the part spent in capture itself::

    python -m flowserve.bench.capture [REQUESTS] [ROUNDS]
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.bench.common import console, run_id
from flowserve.bench.latency import _open_loop
from flowserve.client import TopologyClient
from flowserve.client.kafka import new_request_id
from flowserve.errors import BrokerError
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.runtime.kafka import delete_topics
from flowserve.runtime.settings import KafkaSettings
from flowserve.runtime.traffic import wait_ready
from flowserve.topology.graph import Topology, load_topology_text

DIGITS = """
name: {name}
partitions: 4
nodes:
  pre: {{component: components.digits:Normalize, inputs: {{pixels: input.pixels}}}}
  model:
    component: components.torch_stage:TorchClassifier
    params: {{model: digits-mlp, threads: 1}}
    inputs: {{x: pre.x}}
  post: {{component: components.postprocess:ArgMax, inputs: {{logits: model.logits}}}}
{extra}
outputs: {{label: post.label, probs: post.probs}}
{capture}
"""
DETECTOR = """  input_drift:
    component: components.drift:FeatureDrift
    params: {window: 100, reference: "components.drift:digits_reference"}
    inputs: {x: pre.x}"""
CONCURRENCY = 64
ROUNDS = 3
#: with/without alternations of the detector per round
DETECTOR_PHASES = 3
SATURATION = {"off": None, "10pct": 0.1, "100pct": 1.0}


def _topology(sample: float | None, detector: bool = False) -> tuple[str, Topology]:
    capture = "" if sample is None else f"capture: {{sample: {sample}, lineage: true, tracing: true}}"
    text = DIGITS.format(name=f"cap{run_id()}", extra=DETECTOR if detector else "", capture=capture)
    return text, load_topology_text(text, source="bench")


def _inputs(n: int) -> list[dict[str, np.ndarray]]:
    from components.digits import sample

    requests, _ = sample(n, seed=0)
    return requests


@contextlib.asynccontextmanager
async def _deployed(kafka: KafkaSettings, text: str, topology: Topology, tmp: Path,
                    skip: tuple[str, ...] = ()) -> Any:
    """The topology's workers as processes, as ``flowserve run`` starts them (but those in ``skip``)."""
    path = tmp / f"{topology.name}.yaml"
    path.write_text(text)
    await create_topology_topics(topology, kafka)
    host = ProcessHost(path, topology, kafka, log_dir=tmp / "logs")
    for node_id in topology.nodes:
        if node_id not in skip:
            host.spawn(node_id)
    try:
        async with TopologyClient(topology, kafka) as client:
            yield host, client
    finally:
        host.stop()
        # The embedded broker keeps everything in memory and slows as it fills: each deployment's data
        # would otherwise weigh on the ones measured after it.
        with contextlib.suppress(BrokerError):
            await delete_topics(kafka, topology.topics())


async def _warm(client: TopologyClient, inputs: list[dict[str, np.ndarray]]) -> None:
    await wait_ready(client, inputs[0], timeout_s=180)
    for x in inputs[:100]:  # batch policy, caches, consumer fetch sessions
        await client.call(x, timeout_ms=30_000)


async def _saturate(client: TopologyClient, inputs: list[dict[str, np.ndarray]], seconds: float) -> dict[str, float]:
    """Closed loop with CONCURRENCY requests in flight for ``seconds``: throughput and latency percentiles."""
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
    elapsed = time.perf_counter() - t0
    return {"throughput_rps": len(latencies) / elapsed, **_summary(latencies)}


def _summary(latencies: list[float]) -> dict[str, float]:
    return {"p50_ms": float(np.percentile(latencies, 50)), "p99_ms": _p99(latencies), "n": len(latencies)}


async def _steady(client: TopologyClient, inputs: list[dict[str, np.ndarray]], rate: float,
                  seconds: float, raw: bool = False) -> Any:
    """Open loop at ``rate`` for ``seconds``: the critical path's latency percentiles (``raw``: latencies)."""
    lock = asyncio.Lock()
    counter = iter(range(10**9))

    async def send(_: int) -> None:
        rid = new_request_id()
        future = client.expect(rid)
        async with lock:
            await client.send(inputs[next(counter) % len(inputs)], request_id=rid, timeout_ms=30_000)
        reply = await asyncio.wait_for(future, 30)
        assert reply.error is None, reply.error

    latencies = await _open_loop(send, rate, seconds)
    return latencies if raw else _summary(latencies)


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


def _p99(latencies: list[float]) -> float:
    return float(np.percentile(latencies, 99))


def _bootstrap_ratio(a: list[float], b: list[float], resamples: int = 1000) -> tuple[float, float]:
    """95% interval of p99(a) / p99(b) by resampling both: how much of a difference is only noise."""
    rng = np.random.default_rng(0)
    xa, xb = np.asarray(a), np.asarray(b)
    ra = np.percentile(rng.choice(xa, (resamples, len(xa))), 99, axis=1)
    rb = np.percentile(rng.choice(xb, (resamples, len(xb))), 99, axis=1)
    low, high = np.percentile(ra / rb, [2.5, 97.5])
    return float(low), float(high)


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}


async def capture_bench(kafka: KafkaSettings, rate: float = 100.0, seconds: float = 10.0,
                        rounds: int = ROUNDS) -> dict[str, Any]:
    _, probe = _topology(None)
    for node in probe.nodes.values():
        node.component.prepare()  # train the model once if it is not cached
    inputs = _inputs(1000)
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in (*SATURATION, "no_detector", "detector",
                                                               "p99_detector_vs_none")}
    everything: dict[bool, list[float]] = {True: [], False: []}  # the detector's phases of every round
    with tempfile.TemporaryDirectory(prefix="fs-bench-capture-") as tmp:
        for round_ in range(rounds):
            sat = list(SATURATION.items())
            sat = sat[round_ % len(sat):] + sat[:round_ % len(sat)]  # rotate the order each round
            for label, sample in sat:
                text, topology = _topology(sample)
                async with _deployed(kafka, text, topology, Path(tmp)) as (_, client):
                    await _warm(client, inputs)
                    result = await _saturate(client, inputs, seconds)
                runs[label].append(result)
                console.print(f"round {round_ + 1}/{rounds} capture {label:>6}: {result['throughput_rps']:.0f} req/s "
                              f"p50 {result['p50_ms']:.1f} ms p99 {result['p99_ms']:.1f} ms")
            # The critical path with and without the detector, in one deployment, alternating: a trend over
            # time (the broker's memory, the page cache) then falls on both sides instead of on one. The
            # detector is SIGSTOPped for "without"; on SIGCONT it first catches up what it missed (the
            # harder case). Phases are shorter than a session timeout, so its group does not rebalance.
            text, topology = _topology(None, detector=True)
            async with _deployed(kafka, text, topology, Path(tmp)) as (host, client):
                await _warm(client, inputs)
                await _first_report(kafka, topology)
                detector = host.procs["input_drift"][0].pid
                pooled: dict[bool, list[float]] = {True: [], False: []}  # this round's
                order = [round_ % 2 == 0, round_ % 2 == 1] * DETECTOR_PHASES
                for running in order:
                    os.kill(detector, signal.SIGCONT if running else signal.SIGSTOP)
                    pooled[running].extend(await _steady(client, inputs, rate, seconds / 2, raw=True))
                os.kill(detector, signal.SIGCONT)
            everything[True].extend(pooled[True])
            everything[False].extend(pooled[False])
            with_, without = _summary(pooled[True]), _summary(pooled[False])
            runs["no_detector"].append(without)
            runs["detector"].append(with_)
            runs["p99_detector_vs_none"].append({"ratio": with_["p99_ms"] / without["p99_ms"]})
            console.print(f"round {round_ + 1}/{rounds} at {rate:.0f} req/s, {DETECTOR_PHASES} phases each: p99 "
                          f"without detector {without['p99_ms']:.1f} ms, with {with_['p99_ms']:.1f} ms "
                          f"(p50 {without['p50_ms']:.1f} / {with_['p50_ms']:.1f} ms)")
    results: dict[str, Any] = {label: _median(values) for label, values in runs.items()}
    off = results["off"]
    results["ratios"] = {
        "throughput_10pct_vs_off": results["10pct"]["throughput_rps"] / off["throughput_rps"],
        "throughput_100pct_vs_off": results["100pct"]["throughput_rps"] / off["throughput_rps"],
        "p99_10pct_vs_off": results["10pct"]["p99_ms"] / off["p99_ms"],
        "p99_100pct_vs_off": results["100pct"]["p99_ms"] / off["p99_ms"],
        # p99 with / p99 without over the latencies of every round's phases (the target's figure)
        "p99_detector_vs_none": _p99(everything[True]) / _p99(everything[False]),
        # the median over rounds of each round's own ratio
        "p99_detector_vs_none_median_of_rounds": results.pop("p99_detector_vs_none")["ratio"],
    }
    low, high = _bootstrap_ratio(everything[True], everything[False])
    results["p99_detector_vs_none_95ci"] = [low, high]
    console.print(f"p99 with / without the detector, all rounds: {results['ratios']['p99_detector_vs_none']:.3f} "
                  f"(95% bootstrap interval {low:.3f}-{high:.3f}, {len(everything[True])} and "
                  f"{len(everything[False])} requests)")
    results["per_round"] = runs
    results["targets"] = {
        "capture_100pct_costs_le_15pct": results["ratios"]["throughput_100pct_vs_off"] >= 0.85,
        "detector_raises_p99_le_5pct": results["ratios"]["p99_detector_vs_none"] <= 1.05,
    }
    for name, value in results["ratios"].items():
        console.print(f"{name}: {value:.3f}")
    return {"workload": "capture", "layout": "ProcessHost workers, load from the bench process",
            "rounds": rounds, "seconds": seconds, "rate": rate, "concurrency": CONCURRENCY, **results}


def _cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of this process, all threads, or of another process by pid (Linux)."""
    import os
    import resource

    if pid is None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def capture_cpu(kafka: KafkaSettings, requests: int = 3000, rounds: int = 3,
                      broker_pid: int | None = None) -> dict[str, Any]:
    """CPU per request, capture off vs 100% (lineage and tracing on), every stage in this process.

    Far less sensitive to a noisy machine than throughput: the digits topology runs in an
    :class:`~flowserve.runtime.host.InlineHost` with the closed-loop load (``CONCURRENCY`` in flight) in
    the same event loop; per configuration, the process's CPU seconds per request (workers and load
    together), the broker's (when ``broker_pid`` is given), and the part spent inside
    ``StageCapture.begin``/``end`` (capture's own cost, all stages together). Medians over rounds.
    """
    from flowserve.capture.stage import StageCapture
    from flowserve.runtime.host import InlineHost
    from flowserve.runtime.settings import WorkerSettings

    spent = [0.0]
    begin, end = StageCapture.begin, StageCapture.end

    def timed_begin(self: StageCapture, group: Any) -> Any:
        t = time.thread_time()
        try:
            return begin(self, group)
        finally:
            spent[0] += time.thread_time() - t

    def timed_end(self: StageCapture, *args: Any) -> None:
        t = time.thread_time()
        try:
            end(self, *args)
        finally:
            spent[0] += time.thread_time() - t

    inputs = _inputs(1000)
    _, probe = _topology(None)
    for node in probe.nodes.values():
        node.component.prepare()
    runs: dict[str, list[dict[str, float]]] = {"off": [], "100pct": []}
    StageCapture.begin, StageCapture.end = timed_begin, timed_end  # type: ignore[method-assign,assignment]
    try:
        for round_ in range(rounds):
            for label, sample in (("off", None), ("100pct", 1.0)):
                _, topology = _topology(sample)
                async with InlineHost(topology, kafka, WorkerSettings(metrics_interval_s=0)), \
                        TopologyClient(topology, kafka) as client:
                    await _warm(client, inputs)
                    spent[0] = 0.0
                    c0, b0, t0 = _cpu_s(), _cpu_s(broker_pid) if broker_pid else 0.0, time.perf_counter()
                    done = await _closed_loop(client, inputs, requests)
                    if sample is not None:
                        from flowserve.capture.tracing import flush

                        flush()
                    c1, b1, t1 = _cpu_s(), _cpu_s(broker_pid) if broker_pid else 0.0, time.perf_counter()
                result = {"process_us": (c1 - c0) / done * 1e6, "broker_us": (b1 - b0) / done * 1e6,
                          "capture_us": spent[0] / done * 1e6, "throughput_rps": done / (t1 - t0)}
                runs[label].append(result)
                console.print(f"round {round_ + 1}/{rounds} capture {label:>6}: process {result['process_us']:.0f} "
                              f"us/req, in capture {result['capture_us']:.1f} us/req, broker "
                              f"{result['broker_us']:.0f} us/req, {result['throughput_rps']:.0f} req/s")
    finally:
        StageCapture.begin, StageCapture.end = begin, end  # type: ignore[method-assign]
    off, full = _median(runs["off"]), _median(runs["100pct"])
    ratio = (off["process_us"] + off["broker_us"]) / (full["process_us"] + full["broker_us"])
    console.print(f"capture's own CPU: {full['capture_us']:.1f} us/req; CPU per request off / 100%: {ratio:.3f}")
    return {"workload": "capture-cpu", "requests": requests, "rounds": rounds, "off": off, "100pct": full,
            "cpu_ratio_off_vs_100pct": ratio, "per_round": runs}


async def _closed_loop(client: TopologyClient, inputs: list[dict[str, np.ndarray]], n: int) -> int:
    """``n`` requests with ``CONCURRENCY`` in flight; returns how many were answered."""
    inflight: set[asyncio.Future[Any]] = set()
    sent = done = 0
    while done < n:
        while sent < n and len(inflight) < CONCURRENCY:
            rid = new_request_id()
            inflight.add(client.expect(rid))
            await client.queue(inputs[sent % len(inputs)], request_id=rid, timeout_ms=60_000)
            sent += 1
        await client.flush()
        finished, inflight = await asyncio.wait(inflight, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if not finished:
            raise TimeoutError(f"no reply within 60 s ({len(inflight)} in flight)")
        for future in finished:
            assert future.result().error is None
            done += 1
    return done


def main() -> None:
    """``python -m flowserve.bench.capture [REQUESTS] [ROUNDS]``: :func:`capture_cpu` on an embedded broker."""
    import json
    import sys

    from flowserve.runtime.brokers import running_broker

    requests = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with running_broker("embedded") as broker:
        pid = broker._nodes[0].process.pid if broker._nodes[0].process else None  # type: ignore[attr-defined]
        result = asyncio.run(capture_cpu(KafkaSettings(bootstrap=broker.bootstrap), requests, rounds, pid))
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
