"""Process set-up for a worker that runs one node alone: OS priority, scheduling class, threads, fetch waits.

A side branch (a node none of whose outputs reach the topology's outputs, e.g. a drift detector) must
not take CPU from the critical path: its process runs niced and under ``SCHED_IDLE``, with one math
thread, and fetches in large, infrequent batches.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from flowserve.kafka.settings import WorkerSettings
from flowserve.topology.graph import Topology

log = logging.getLogger("flowserve.worker")

#: the environment variable a host sets to its own pid in the workers it starts (see :func:`watch_parent`)
PARENT_PID_ENV = "FLOWSERVE_PARENT_PID"
PARENT_POLL_S = 1.0
PARENT_GRACE_S = 30.0

#: how a side-branch worker process (e.g. a drift detector) yields to the critical path's processes.
SIDE_NICE = 10
SIDE_FETCH_WAIT_MS = 250
SIDE_POLL_MS = 500
SIDE_FETCH_MIN_BYTES = 64 * 1024


def worker_process(topology: Topology, node_id: str, settings: WorkerSettings) -> WorkerSettings:
    """Settings for a process that runs ``node_id`` alone (``flowserve worker``), after setting its OS priority.

    The priority is the node's ``nice`` (an ``os.nice`` increment), by default 0 on the critical path and,
    for a side branch (:meth:`Topology.on_critical_path` is False: none of its outputs reach the
    topology's outputs), :data:`SIDE_NICE` and the ``SCHED_IDLE`` policy, so it runs only on CPU the
    critical path's processes leave idle. A side branch that sets ``nice`` gets that nice, not SCHED_IDLE.
    A side branch also gets one BLAS/OpenMP/torch/numba thread and fetches with a long broker wait
    (until ``SIDE_FETCH_MIN_BYTES`` arrived or ``SIDE_FETCH_WAIT_MS`` passed): it wakes a few times a
    second and takes large batches instead of waking once per record. Niceness is per process and
    cannot be lowered back, so call this only where the node runs alone.
    """
    side = not topology.on_critical_path(node_id)
    nice = topology.spec.nodes[node_id].nice if node_id in topology.spec.nodes else None
    idle = side and nice is None
    if nice is None:
        nice = SIDE_NICE if side else 0
    if nice or idle:
        try:
            _lower_priority(nice, idle)
        except (OSError, AttributeError) as exc:  # not permitted, or not Linux
            log.warning("node %s: cannot lower its priority: %s", node_id, exc)
    if not side:
        return settings
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    torch = sys.modules.get("torch")  # already imported with the topology's components: too late for the env
    if torch is not None:
        torch.set_num_threads(1)
    return settings.model_copy(update={"fetch_max_wait_ms": max(settings.fetch_max_wait_ms or 0, SIDE_FETCH_WAIT_MS),
                                       "poll_timeout_ms": max(settings.poll_timeout_ms, SIDE_POLL_MS),
                                       "fetch_min_bytes": max(settings.fetch_min_bytes, SIDE_FETCH_MIN_BYTES)})


def _lower_priority(nice: int, idle: bool) -> None:
    """Nice every thread of this process by ``nice`` and, with ``idle``, put it under ``SCHED_IDLE``.

    Both are per thread on Linux, so threads started before this call (imports may start some) are
    changed one by one; later threads inherit. Under ``SCHED_IDLE`` a waking normal task preempts the
    thread at once, where a merely niced one may keep its CPU until its time slice ends: that wait,
    a few milliseconds per hop, is what a side branch added to the critical path's tail.
    """
    tids = [int(t) for t in os.listdir("/proc/self/task")] if os.path.isdir("/proc/self/task") else [0]
    for tid in tids:
        if idle and hasattr(os, "SCHED_IDLE"):
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        if nice:
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)


def watch_parent(expected: int | None = None, *, poll_s: float = PARENT_POLL_S, grace_s: float = PARENT_GRACE_S,
                 stop: Callable[[], None] | None = None) -> threading.Thread | None:
    """Stop this process once its parent is no longer ``expected`` (default: ``$FLOWSERVE_PARENT_PID``).

    A host (``flowserve run``, the tuner) that is killed outright cannot stop its workers; without this
    they would run on, re-parented to init, holding their consumer-group slots and CPU until someone
    finds them. A daemon thread polls ``getppid`` once a second and then sends this process SIGTERM, the
    path every host already handles (the stage finishes its batch and commits); if that has not ended
    the process after ``grace_s`` (its broker may have died with the host) it exits at once, which
    at-least-once delivery makes safe: what it had not committed goes to the group's next consumer.
    Polling works where ``PR_SET_PDEATHSIG`` does not (macOS) and has none of its trap: that signal fires
    when the *thread* that forked exits, and the supervisor restarts workers from a thread of its own.
    Without a parent pid to watch, nothing is started (a worker run by hand, or by Kubernetes).
    ``stop`` replaces the SIGTERM (tests).
    """
    if expected is None:
        value = os.environ.get(PARENT_PID_ENV, "")
        if not value.isdigit():
            return None
        expected = int(value)

    def watch() -> None:
        while os.getppid() == expected:
            time.sleep(poll_s)
        log.warning("the process that started this worker (pid %d) is gone; stopping", expected)
        if stop is not None:
            stop()
            return
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        log.error("still running %g s after its parent went; exiting without a graceful stop", grace_s)
        os._exit(1)

    thread = threading.Thread(target=watch, name="flowserve-watch-parent", daemon=True)
    thread.start()
    return thread


def stop_processes(procs: Iterable[subprocess.Popen[Any] | None], timeout: float = 10.0) -> None:
    """Ask every process still running to stop (SIGTERM: a worker finishes its batch and commits), all at
    once so that their shutdowns overlap, then wait for each up to ``timeout`` and kill what is left."""
    live = [p for p in procs if p is not None and p.poll() is None]
    for p in live:
        p.send_signal(signal.SIGTERM)
    for p in live:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
