"""The prediction cache through the gateway: a Zipf-distributed stream of digits, with and without cache.

Layout (each in its own process): the broker; the digits pipeline's workers (one process per node); two
gateways serving it, one whose topology has a top-level ``cache:`` and one without; this process as the
load generator, ``concurrency`` closed-loop lanes. The two gateways take turns in interleaved slices
(:mod:`flowserve.bench.paired`), so the machine's drifts fall on both alike.

The stream: the 450 test images, ranked by a random permutation, request ``i`` picks rank ``r`` with
probability proportional to ``1 / r**s``. The cache holds ``capacity`` answers (its ``max_mb`` is sized
from one answer's bytes), so its hit rate is stationary, and ``s`` is chosen before the run, by
replaying a stream through the same cache class offline, for a 50% hit rate; the run prints the hit rate
it measured (``X-Flowserve-Cache`` on each answer says hit or miss).

Targets: ``hit_latency_le_half_miss`` (p50 of the hits through the caching gateway ≤ 0.5× the p50 of the
gateway without cache, whose every answer is a Kafka round trip) and ``throughput_2x_at_50pct_hits``
(closed-loop throughput with the cache ≥ 2× without). At exactly 50% hits, 2× is the ceiling (half the
requests cost a round trip either way), reached only if a hit costs nothing; the interval says how close.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.bench.common import console, cpu_seconds
from flowserve.bench.gateway import start_gateway, wait_http_ready
from flowserve.bench.paired import Slice, balanced_order, percentile_ratio, throughput, throughput_ratio
from flowserve.client.http import AsyncHttpClient
from flowserve.errors import FlowserveError
from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.cache import DIGEST_SIZE, ENTRY_OVERHEAD, PredictionCache
from flowserve.runtime.host import ProcessHost, create_topology_topics
from flowserve.topology import load_topology
from flowserve.wire.v2 import build_request

TOPOLOGY = Path("topologies/digits.yaml")
UNIVERSE = 450
#: answers the cache holds: a tenth of the images
CAPACITY = 45
TARGET_HIT_RATE = 0.5


def zipf_stream(n: int, s: float, universe: int, seed: int) -> np.ndarray:
    """``n`` item indices: rank ``r`` (1-based) drawn with probability ∝ ``r**-s``, ranks → items by a
    permutation fixed by ``seed``."""
    rng = np.random.default_rng(seed)
    p = np.arange(1, universe + 1, dtype=float) ** -s
    ranks = rng.choice(universe, size=n, p=p / p.sum())
    return rng.permutation(universe)[ranks]


def simulated_hit_rate(stream: np.ndarray, entry_bytes: int, capacity: int) -> float:
    """The hit rate of :class:`PredictionCache` bounded at ``capacity`` answers over ``stream`` (after
    a warm-up of a fifth of it)."""
    cache = PredictionCache(capacity * entry_bytes)
    payload = {"y": np.zeros(entry_bytes - ENTRY_OVERHEAD - DIGEST_SIZE, dtype=np.uint8)}
    warm = len(stream) // 5
    hits = 0
    for i, item in enumerate(stream):
        key = int(item).to_bytes(DIGEST_SIZE, "little")
        if cache.get(key) is None:
            cache.put(key, payload)
        elif i >= warm:
            hits += 1
    return hits / (len(stream) - warm)


def fit_exponent(entry_bytes: int, capacity: int = CAPACITY, universe: int = UNIVERSE,
                 target: float = TARGET_HIT_RATE, n: int = 20_000) -> tuple[float, float]:
    """The Zipf exponent giving ``target`` hit rate (bisection over offline replays), and that rate."""
    low, high = 0.1, 3.0
    rate = 0.0
    for _ in range(18):
        s = (low + high) / 2
        rate = simulated_hit_rate(zipf_stream(n, s, universe, seed=1), entry_bytes, capacity)
        low, high = (s, high) if rate < target else (low, s)
    return (low + high) / 2, rate


async def learn_cache_bench(kafka: KafkaSettings, *, slice_s: float = 2.0, rounds: int = 4,
                            concurrency: int = 16) -> dict[str, Any]:
    if not TOPOLOGY.is_file():
        raise FlowserveError(f"the learn-cache bench runs {TOPOLOGY}, not found here: run it from a flowserve "
                             "checkout (its topologies/ folder)")
    topology = load_topology(TOPOLOGY)
    for node in topology.nodes.values():
        node.component.prepare()
    inputs, _ = topology.sampler()(UNIVERSE)
    bodies = [build_request(x)[0] for x in inputs]
    infer = f"/v2/models/{topology.name}/infer"
    tmp = Path(tempfile.mkdtemp(prefix="fs-learn-cache-"))
    await create_topology_topics(topology, kafka)
    host = ProcessHost(TOPOLOGY, topology, kafka)
    host.start_processes()
    gateways: list[subprocess.Popen[str]] = []
    try:
        plain, plain_url = start_gateway(kafka, TOPOLOGY)
        gateways.append(plain)
        async with AsyncHttpClient(plain_url) as probe:
            console.print(f"{topology.name}: {len(topology.nodes)} worker processes; waiting for the pipeline…")
            await wait_http_ready(probe, infer, bodies[0])
            first = await probe.request("POST", infer, bodies[0], {"Content-Type": "application/json"})
        # one answer's bytes in the gateway's cache: its output tensors, the key, the entry's overhead
        entry_bytes = ENTRY_OVERHEAD + DIGEST_SIZE + sum(a.nbytes for a in first.outputs().values())
        s, simulated = fit_exponent(entry_bytes)
        max_mb = CAPACITY * entry_bytes / 2**20
        cached_yaml = tmp / "digits-cached.yaml"
        cached_yaml.write_text(TOPOLOGY.read_text() + f"cache: {{max_mb: {max_mb:.6f}}}\n")
        cached, cached_url = start_gateway(kafka, cached_yaml)
        gateways.append(cached)
        console.print(f"Zipf exponent s={s:.3f} over {UNIVERSE} images, cache of {CAPACITY} answers "
                      f"({max_mb * 1024:.1f} KiB): {simulated:.1%} hits offline")
        stream = zipf_stream(200_000, s, UNIVERSE, seed=2)
        pids = {"cache": cached.pid, "nocache": plain.pid,
                "workers": [p.pid for ps in host.procs.values() for p in ps]}
        runs = await _interleave({"cache": cached_url, "nocache": plain_url}, infer, bodies, stream, slice_s,
                                 rounds, concurrency, pids)
    finally:
        for proc in gateways:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if proc.poll() is None:
                proc.kill()
        host.stop()
    return _report(runs, s, simulated, slice_s, rounds, concurrency)


async def _interleave(urls: dict[str, str], infer: str, bodies: list[bytes], stream: np.ndarray, slice_s: float,
                      rounds: int, concurrency: int, pids: dict[str, Any]) -> dict[str, dict[str, list[Any]]]:
    """Slices of each configuration in a balanced order: per slice, all latencies, and the hits' and
    misses' separately; and the CPU seconds its gateway, the workers and this load generator took."""
    runs: dict[str, dict[str, list[Any]]] = {n: {"slices": [], "hit": [], "miss": [], "cpu": []} for n in urls}

    def cpu(name: str) -> tuple[float, float, float]:
        return (cpu_seconds(pids[name]), sum(cpu_seconds(p) for p in pids["workers"]), cpu_seconds())

    position = 0
    clients = {name: AsyncHttpClient(url) for name, url in urls.items()}
    try:
        for name in urls:  # warm-up: connections, the workers' first batches, the cache's first entries
            await _slice(clients[name], infer, bodies, stream, 0, min(1.0, slice_s), concurrency)
        for name in balanced_order(list(urls), rounds):
            before = cpu(name)
            got, hit, miss, position = await _slice(clients[name], infer, bodies, stream, position, slice_s,
                                                    concurrency)
            runs[name]["cpu"].append([b - a for a, b in zip(before, cpu(name), strict=True)])
            runs[name]["slices"].append(got)
            runs[name]["hit"].append(hit)
            runs[name]["miss"].append(miss)
            console.print(f"  {name:<8} {got.requests / got.seconds:>7.0f} req/s  p50 "
                          f"{np.percentile(got.latencies, 50):6.2f} ms  hits {len(hit) / max(1, got.requests):5.1%}")
    finally:
        for client in clients.values():
            await client.close()
    return runs


async def _slice(client: AsyncHttpClient, infer: str, bodies: list[bytes], stream: np.ndarray, start: int,
                 seconds: float, concurrency: int) -> tuple[Slice, list[float], list[float], int]:
    latencies: list[float] = []
    hit: list[float] = []
    miss: list[float] = []
    errors = 0
    nxt = start
    stop_at = time.perf_counter() + seconds
    headers = {"Content-Type": "application/json"}

    async def lane() -> None:
        nonlocal nxt, errors
        while time.perf_counter() < stop_at:
            item = int(stream[nxt % len(stream)])
            nxt += 1
            t0 = time.perf_counter()
            reply = await client.request("POST", infer, bodies[item], headers)
            ms = (time.perf_counter() - t0) * 1000
            if reply.status != 200:
                errors += 1
                continue
            latencies.append(ms)
            (hit if reply.headers.get("x-flowserve-cache") == "hit" else miss).append(ms)

    t0 = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    if errors:
        console.print(f"  [yellow]{errors} request(s) failed in this slice[/yellow]")
    return Slice(len(latencies), elapsed, latencies), hit, miss, nxt


def _report(runs: dict[str, dict[str, list[Any]]], s: float, simulated: float, slice_s: float, rounds: int,
            concurrency: int) -> dict[str, Any]:
    cache, plain = runs["cache"], runs["nocache"]
    hits = sum(len(h) for h in cache["hit"])
    total = sum(sl.requests for sl in cache["slices"])
    hit_rate = hits / max(1, total)
    tput = throughput_ratio(cache["slices"], plain["slices"])
    # slices without a hit (none expected) would break the pairing: keep the pairs that have both
    pairs = [(h, sl.latencies) for h, sl in zip(cache["hit"], plain["slices"], strict=True) if h and sl.latencies]
    p50 = percentile_ratio([h for h, _ in pairs], [m for _, m in pairs], q=50)

    def p(xs: list[list[float]], q: float) -> float:
        flat = [x for part in xs for x in part]
        return round(float(np.percentile(flat, q)), 2) if flat else float("nan")

    def cpu_ms(run: dict[str, list[Any]]) -> dict[str, float]:
        """CPU milliseconds per answered request: the gateway, the three workers, the load generator."""
        total = np.sum(run["cpu"], axis=0) * 1000 / max(1, sum(sl.requests for sl in run["slices"]))
        return {"gateway": round(float(total[0]), 3), "workers": round(float(total[1]), 3),
                "loadgen": round(float(total[2]), 3)}

    table: dict[str, dict[str, Any]] = {
        "cache": {"rps": round(throughput(cache["slices"]), 1),
                  "p50_ms": p([sl.latencies for sl in cache["slices"]], 50),
                  "hit_p50_ms": p(cache["hit"], 50), "miss_p50_ms": p(cache["miss"], 50),
                  "p99_ms": p([sl.latencies for sl in cache["slices"]], 99), "cpu_ms_per_request": cpu_ms(cache)},
        "nocache": {"rps": round(throughput(plain["slices"]), 1),
                    "p50_ms": p([sl.latencies for sl in plain["slices"]], 50),
                    "p99_ms": p([sl.latencies for sl in plain["slices"]], 99), "cpu_ms_per_request": cpu_ms(plain)},
    }
    console.print(f"\nprediction cache through the gateway: Zipf s={s:.3f}, measured hit rate {hit_rate:.1%} "
                  f"(offline {simulated:.1%}), {concurrency} lanes, {rounds} x {slice_s:g} s slices each")
    console.print(f"  {'':<9}{'req/s':>9}{'p50 ms':>9}{'hit p50':>9}{'miss p50':>10}{'p99 ms':>9}"
                  "   CPU ms/request: gateway  workers  loadgen")
    for name, row in table.items():
        c = row["cpu_ms_per_request"]
        console.print(f"  {name:<9}{row['rps']:>9.0f}{row['p50_ms']:>9.2f}{row.get('hit_p50_ms', float('nan')):>9.2f}"
                      f"{row.get('miss_p50_ms', float('nan')):>10.2f}{row['p99_ms']:>9.2f}"
                      f"{c['gateway']:>24.3f}{c['workers']:>9.3f}{c['loadgen']:>9.3f}")
    console.print(f"  throughput cache/nocache {tput[0]:.2f} [{tput[1]:.2f}, {tput[2]:.2f}]; "
                  f"hit p50 / miss-path p50 {p50[0]:.3f} [{p50[1]:.3f}, {p50[2]:.3f}] (95% intervals over slices)")
    return {
        "workload": "learn-cache", "zipf_s": round(s, 4), "hit_rate": round(hit_rate, 4),
        "hit_rate_offline": round(simulated, 4), "capacity": CAPACITY, "concurrency": concurrency,
        "slice_s": slice_s, "rounds": rounds, "table": table,
        "throughput_ratio": [round(x, 3) for x in tput], "hit_p50_over_miss_p50": [round(x, 4) for x in p50],
        "targets": {"hit_latency_le_half_miss": p50[0] <= 0.5, "throughput_2x_at_50pct_hits": tput[0] >= 2.0},
    }
