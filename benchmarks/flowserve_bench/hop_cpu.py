"""``flowserve bench hop-cpu``: a stage worker's CPU per record per hop, this code against an earlier commit's,
both deployed at once on one broker and driven in interleaved slices.

Why a second deployment rather than a figure written down: this machine's speed moves by 2-3x between days
with nothing else running. MLServer serving the same digits MLP took 805 µs of CPU per request at c8 on
2026-12-02, 460 µs on 2026-12-03 and 1,374 µs on 2026-12-04, the same code each time. A worker's CPU per
record set against a figure from another day measures the day, not the code. So the earlier code runs
beside this one: its tree checked out with ``git worktree`` (the commit a target names), its own
``flowserve run`` with its gateway on the same broker, the topology renamed so their topics and groups do
not meet. The load generator drives one side, then the other, a slice each (``ab``, then ``ba``); each
side's worker processes' CPU (user + system, from /proc) is read around each of its slices.

The figure is CPU seconds of a side's workers / (records answered x stages), per level; the ratio
now / before comes with a 95% bootstrap interval over slice pairs (:func:`flowserve_bench.paired.sum_ratio`).
Each round also drives four chains of relays as long as the pipeline (:mod:`flowserve_bench.hop_floor`):
confluent-kafka's bare loop, the same loop through a worker's data plane on each client, and a relay whose
Kafka work stays in C (:mod:`flowserve_bench.hop_native`, skipped with the reason where it cannot be built).
These floors say what a hop costs in the client and in the plane before any of the worker's own work.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowserve.kafka.settings import KafkaSettings
from flowserve.topology import load_topology
from flowserve.wire.envelope import make_headers, new_request_id, new_traceparent
from flowserve.wire.tensors import encode_tensors
from flowserve_bench.against import stop_process
from flowserve_bench.common import console
from flowserve_bench.hop_cpu_targets import targets
from flowserve_bench.hop_floor import CLIENTS, Floor, unavailable
from flowserve_bench.load import Target, closed_slice, request_body
from flowserve_bench.paired import Slice, sum_ratio, summary
from flowserve_bench.procs import cpu_of, with_children

REPO = Path(__file__).resolve().parents[2]
#: issue 35's "today": the commit whose docs/benchmarks.md the issue's figures were read from
BEFORE = "bb77cab"
NOW, EARLIER = "now", "before"
#: the before side's topology is this copy of the same file, under another name (topics and groups)
RENAMED = "hop-cpu-before"


@dataclass
class Side:
    """One deployment: its ``flowserve run`` process, its gateway and its slices."""

    name: str
    process: subprocess.Popen[bytes]
    target: Target
    stages: int
    slices: dict[str, list[Slice]] = field(default_factory=dict)
    cpu_s: dict[str, list[float]] = field(default_factory=dict)

    def workers(self) -> list[int]:
        """The stage workers' pids now (``flowserve worker`` processes under the run; a restarted one too)."""
        out = []
        for pid in with_children([self.process.pid])[1:]:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"worker" in argv and b"flowserve" in argv:
                out.append(pid)
        return out


@contextmanager
def checkout(ref: str) -> Iterator[Path]:
    """``ref`` of this repository checked out in a temporary folder (``git worktree``), removed after."""
    folder = Path(tempfile.mkdtemp(prefix="flowserve-before-"))
    git = ["git", "-C", str(REPO)]
    subprocess.run([*git, "worktree", "add", "--detach", "--force", str(folder), ref], check=True,
                   capture_output=True)
    try:
        yield folder
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(folder)], check=False, capture_output=True)


def start_floor(kafka: KafkaSettings, client: str, spec: Any, tensors: Any) -> Floor:
    """A floor's relays on ``client``, one per stage, driven with records the size of the pipeline's inputs
    and the headers a request enters with."""
    headers = make_headers(new_request_id(), topology=spec.name, deadline_ms=2**41, traceparent=new_traceparent())
    floor = Floor(kafka, client, len(spec.nodes), spec.spec.partitions, encode_tensors(tensors), headers)
    try:
        floor.ready()
    except BaseException:
        floor.close()
        raise
    return floor


def renamed(path: Path, name: str) -> Path:
    """A copy of the topology file ``path`` whose ``name:`` is ``name``, beside it."""
    text, count = re.subn(r"(?m)^name:.*$", f"name: {name}", path.read_text(), count=1)
    if not count:
        raise ValueError(f"{path}: no top-level 'name:' line to rename")
    out = path.with_name(f"{name}.yaml")
    out.write_text(text)
    return out


def start_side(name: str, tree: Path, topology: Path, kafka: KafkaSettings, port: int,
               extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``flowserve run TOPOLOGY --gateway-port PORT`` of the code in ``tree`` on the broker ``kafka``."""
    env = {**os.environ, "FLOWSERVE_FETCH_MAX_WAIT_MS": str(kafka.fetch_max_wait_ms), **(extra_env or {})}
    if tree != REPO:  # the earlier tree's packages before the installed ones (its workers inherit this)
        env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "components"), env.get("PYTHONPATH", "")])
    log = open(Path(tempfile.gettempdir()) / f"flowserve-hop-cpu-{name}.log", "wb")  # noqa: SIM115
    return subprocess.Popen([sys.executable, "-m", "flowserve", "run", str(topology), "--broker", kafka.bootstrap,
                             "--gateway-port", str(port)], cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)


async def measure(sides: list[Side], requests: list[tuple[bytes, dict[str, str]]], levels: tuple[int, ...], *,
                  rounds: int, slice_s: float, floors: list[Floor] | None = None) -> list[dict[str, Any]]:
    """Every level: a warm-up slice a side, then ``rounds`` slice pairs, the sides taking turns, each round
    followed by a slice of each floor's relays."""
    floors = floors or []
    rows = []
    for c in levels:
        label = f"c{c}"
        for side in sides:
            await closed_slice(side.target, requests, c, min(2.0, slice_s))
            side.slices[label], side.cpu_s[label] = [], []
        floor_slices: dict[str, list[tuple[int, float, float]]] = {f.client: [] for f in floors}
        for floor in floors:
            await asyncio.to_thread(floor.slice, c, min(2.0, slice_s))
        for k in range(rounds):
            for side in (sides if k % 2 == 0 else sides[::-1]):
                pids = side.workers()
                before = cpu_of(pids)
                piece, _ = await closed_slice(side.target, requests, c, slice_s)
                side.cpu_s[label].append(cpu_of(pids) - before)
                side.slices[label].append(piece)
            for floor in floors:
                floor_slices[floor.client].append(await asyncio.to_thread(floor.slice, c, slice_s))
        rows.append(row := level_row(label, sides, floor_slices))
        console.print(f"  {label:<5} " + "  ".join(
            f"{s.name} {row[s.name]['throughput_rps']:.0f} req/s, {row[s.name]['cpu_us_per_record_per_hop']:.0f} "
            f"µs/record/hop" for s in sides) + f"  | now / before {row['cpu_ratio'][0]:.2f} "
            f"[{row['cpu_ratio'][1]:.2f}, {row['cpu_ratio'][2]:.2f}]"
            + "".join(f"  | floor {f.client} {row[f'floor_{f.client}']['cpu_us_per_record_per_hop']:.0f} µs"
                      for f in floors))
    return rows


def floor_row(slices: list[tuple[int, float, float]], stages: int) -> dict[str, float]:
    """The floor's figures over its slices (records out, seconds, relays' CPU seconds) at one level."""
    records, seconds, cpu_s = (sum(x[i] for x in slices) for i in range(3))
    return {"cpu_us_per_record_per_hop": round(cpu_s / max(records * stages, 1) * 1e6, 1),
            "throughput_rps": round(records / seconds, 2) if seconds else 0.0}


def level_row(label: str, sides: list[Side],
              floors: dict[str, list[tuple[int, float, float]]] | None = None) -> dict[str, Any]:
    """One level: the ratios now / before (CPU per record per hop, throughput), then each side's figures and
    the floor's."""
    now, before = sides
    work = [[x.requests * s.stages for x in s.slices[label]] for s in sides]
    seconds = [[x.seconds for x in s.slices[label]] for s in sides]
    row: dict[str, Any] = {
        "load": label,
        "cpu_ratio": [round(v, 3) for v in sum_ratio(now.cpu_s[label], work[0], before.cpu_s[label], work[1])],
        "throughput_ratio": [round(v, 3) for v in sum_ratio([x.requests for x in now.slices[label]], seconds[0],
                                                            [x.requests for x in before.slices[label]], seconds[1])]}
    for s, records in zip(sides, work, strict=True):
        stats = summary(s.slices[label]) if sum(records) else {"throughput_rps": 0.0}
        row[s.name] = {"cpu_us_per_record_per_hop": round(sum(s.cpu_s[label]) / max(sum(records), 1) * 1e6, 1),
                       **{k: round(stats[k], 2) for k in ("throughput_rps", "p50_ms", "p99_ms") if k in stats}}
    for client, slices in (floors or {}).items():
        row[f"floor_{client}"] = floor_row(slices, now.stages)
    return row


async def hop_cpu(kafka: KafkaSettings, *, before: str = BEFORE, topology: Path = REPO / "topologies/digits.yaml",
                  levels: tuple[int, ...] = (1, 8, 32, 128), rounds: int = 4, slice_s: float = 2.0,
                  ports: tuple[int, int] = (18370, 18371), env: dict[str, str] | None = None) -> dict[str, Any]:
    """The bench; ``env``: settings for this code's side only (``FLOWSERVE_WORKER_CLIENT=librdkafka``)."""
    found = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", f"{before}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode:
        raise SystemExit(f"flowserve bench hop-cpu: commit {before!r} is not in {REPO} ({found.stderr.strip()}); "
                         "a shallow clone lacks it: git fetch --unshallow")
    sha = found.stdout.strip()
    spec = load_topology(topology)
    inputs, _ = spec.sampler()(256)
    requests = [request_body(x, "json") for x in inputs]
    stages = len(spec.nodes)
    with checkout(before) as tree:
        relative = topology.resolve().relative_to(REPO)
        procs = {NOW: start_side(NOW, REPO, topology, kafka, ports[0], env),
                 EARLIER: start_side(EARLIER, tree, renamed(tree / relative, RENAMED), kafka, ports[1])}
        sides = [Side(NOW, procs[NOW], Target(f"http://127.0.0.1:{ports[0]}", spec.name), stages),
                 Side(EARLIER, procs[EARLIER], Target(f"http://127.0.0.1:{ports[1]}", RENAMED), stages)]
        try:
            console.print(f"{spec.name} ({stages} stages): this tree{' with ' + str(env) if env else ''} against "
                          f"{before} ({sha}), one broker at {kafka.bootstrap}; waiting for both to answer…")
            for side in sides:
                await side.target.ready(requests[0], timeout_s=180.0)
            floors: list[Floor] = []
            try:
                for client in CLIENTS:
                    if why := await asyncio.to_thread(unavailable, client):
                        console.print(f"no {client} floor: {why}")
                        continue
                    floors.append(await asyncio.to_thread(start_floor, kafka, client, spec, inputs[0]))
                rows = await measure(sides, requests, levels, rounds=rounds, slice_s=slice_s, floors=floors)
            finally:
                for relays in floors:
                    await asyncio.to_thread(relays.close)
        finally:
            for side in sides:
                await side.target.close()
                stop_process(side.process)
    result = {"workload": "hop-cpu", "topology": spec.name, "before": {"ref": before, "commit": sha}, "env": env or {},
              "stages": stages, "slice_seconds": slice_s, "rounds": rounds, "loads": rows}
    result["targets"] = targets(result)
    return result
