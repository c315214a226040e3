"""A side branch's worker process yields the CPU to the critical path (OS priority, threads, fetch waits)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
PROBE = """
import json, os, sys
from flowserve.runtime.process import worker_process
from flowserve.kafka.settings import WorkerSettings
from flowserve.topology.graph import load_topology_text
topology = load_topology_text(sys.stdin.read())
before = os.nice(0)
settings = worker_process(topology, sys.argv[1], WorkerSettings())
print(json.dumps({"nice": os.nice(0) - before, "idle": os.sched_getscheduler(0) == os.SCHED_IDLE,
                  "fetch_max_wait_ms": settings.fetch_max_wait_ms,
                  "fetch_min_bytes": settings.fetch_min_bytes, "omp": os.environ.get("OMP_NUM_THREADS")}))
"""
TOPOLOGY = """
name: iso
nodes:
  pre: {component: flowserve_components.digits:Normalize, inputs: {pixels: input.pixels}%s}
  watch: {component: flowserve_components.digits:Normalize, inputs: {pixels: input.pixels}%s}
outputs: {x: pre.x}
"""


def _probe(node: str, pre: str = "", watch: str = "") -> dict:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", PROBE, node], input=TOPOLOGY % (pre, watch), capture_output=True,
                         text=True, timeout=120, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not hasattr(__import__("os"), "nice"), reason="no os.nice on this platform")
def test_side_branch_runs_niced_with_one_thread_and_long_fetches_critical_path_unchanged() -> None:
    side = _probe("watch")
    assert side == {"nice": 10, "idle": True, "fetch_max_wait_ms": 250, "fetch_min_bytes": 64 * 1024, "omp": "1"}
    critical = _probe("pre")
    assert critical == {"nice": 0, "idle": False, "fetch_max_wait_ms": None, "fetch_min_bytes": 1, "omp": None}


@pytest.mark.skipif(not hasattr(__import__("os"), "nice"), reason="no os.nice on this platform")
def test_a_node_nice_overrides_the_default() -> None:
    assert _probe("watch", watch=", nice: 15") | {"fetch_max_wait_ms": 0} == {
        "nice": 15, "idle": False, "fetch_max_wait_ms": 0, "fetch_min_bytes": 64 * 1024, "omp": "1"}
    assert _probe("pre", pre=", nice: 3")["nice"] == 3


def test_watch_parent_stops_once_the_parent_is_not_the_one_that_started_it() -> None:
    import os
    import threading

    from flowserve.runtime.process import watch_parent

    stopped = threading.Event()
    thread = watch_parent(os.getppid() + 1, poll_s=0.01, stop=stopped.set)
    assert thread is not None
    thread.join(5)
    assert stopped.is_set()


def test_watch_parent_keeps_watching_while_the_parent_lives(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import threading

    from flowserve.runtime.process import PARENT_PID_ENV, watch_parent

    monkeypatch.setenv(PARENT_PID_ENV, str(os.getppid()))
    stopped = threading.Event()
    thread = watch_parent(poll_s=0.01, stop=stopped.set)
    assert thread is not None
    thread.join(0.1)
    assert thread.is_alive() and not stopped.is_set()  # a daemon: it ends with the test process


def test_watch_parent_without_a_parent_to_watch_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from flowserve.runtime.process import PARENT_PID_ENV, watch_parent

    monkeypatch.delenv(PARENT_PID_ENV, raising=False)
    assert watch_parent() is None
