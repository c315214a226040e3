"""``flowserve run`` restarts a worker that is SIGKILLed, and requests through its gateway flow again."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from flowserve.client.http import HttpClient

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
X = {"x": np.arange(4, dtype=np.float32).reshape(1, 4)}


def _workers(pid: int) -> list[int]:
    """The ``flowserve worker`` children of ``pid`` (from /proc, Linux)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        for child in map(int, (task / "children").read_text().split()):
            with contextlib.suppress(FileNotFoundError):
                if b"worker" in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0"):
                    out.append(child)
    return out


def _start_run(broker: object, tmp_path: Path) -> tuple[str, subprocess.Popen[str], queue.Queue[str]]:
    """``flowserve run`` of a one-node topology with a gateway; its stderr lines go to the returned queue."""
    name = "s" + uuid.uuid4().hex[:10]
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"""
name: {name}
nodes:
  a: {{component: flowserve.builtin:Identity, params: {{ports: {{x: {{datatype: FP32, shape: [-1, 4]}}}}}},
      inputs: {{x: input.x}}}}
outputs: {{x: a.x}}
""")
    proc = subprocess.Popen([sys.executable, "-m", "flowserve", "run", str(spec), "--broker", broker.bootstrap,  # type: ignore[attr-defined]
                             "--gateway-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "400",
                                 "FLOWSERVE_FETCH_MAX_WAIT_MS": str(broker.settings().fetch_max_wait_ms)})  # type: ignore[attr-defined]
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
    return name, proc, lines


def _drain(lines: queue.Queue[str]) -> str:
    out = []
    with contextlib.suppress(queue.Empty):
        while True:
            out.append(lines.get_nowait())
    return "".join(out)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _finish(proc: subprocess.Popen[str], workers: set[int]) -> None:
    """However the test ended, leave no ``flowserve run`` and none of its workers behind."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _until_ok(client: HttpClient, name: str, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < deadline:
        last = client.infer(name, X, parameters={"timeout_ms": 5000})
        if last.status == 200:
            np.testing.assert_array_equal(last.outputs()["x"], X["x"])
            return
        time.sleep(0.2)  # polling for recovery, bounded; the assertion is on the outcome
    raise AssertionError(f"no answer within {deadline_s} s: {last.status if last else None} "
                         f"{last.error if last else None}")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_a_killed_worker_is_restarted_and_requests_flow_again(broker: object, tmp_path: Path) -> None:
    name, proc, lines = _start_run(broker, tmp_path)
    seen = ""
    workers: set[int] = set()
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()  # the gateway prints its URL once it serves
        assert url.startswith("http://127.0.0.1:"), url + _drain(lines)
        with HttpClient(url) as client:
            _until_ok(client, name, 120)
            (worker,) = _workers(proc.pid)
            workers.add(worker)
            os.kill(worker, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while "restarted worker a[0]" not in seen and time.monotonic() < deadline:
                with contextlib.suppress(queue.Empty):
                    seen += lines.get(timeout=1)
            assert f"worker a[0] (pid {worker}) died with signal SIGKILL" in seen, seen
            assert "restarted worker a[0]" in seen, seen
            # the restarted child shows "worker" in its command line once it has exec'd, a moment after
            # the supervisor says it started it (on a busy machine that moment is long)
            found = _workers(proc.pid)
            while not found and time.monotonic() < deadline:
                time.sleep(0.1)
                found = _workers(proc.pid)
            (new,) = found
            workers.add(new)
            assert new != worker
            _until_ok(client, name, 120)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, seen + _drain(lines)
    finally:
        _finish(proc, workers)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_workers_stop_themselves_when_their_run_is_killed(broker: object, tmp_path: Path) -> None:
    """SIGKILL gives ``flowserve run`` no chance to stop its workers: each notices its parent is gone."""
    name, proc, lines = _start_run(broker, tmp_path)
    workers: set[int] = set()
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url + _drain(lines)
        with HttpClient(url) as client:
            _until_ok(client, name, 120)
        workers = set(_workers(proc.pid))
        assert len(workers) == 1
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 60
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.2)  # polling for the workers' exit, bounded; the assertion is on the outcome
        assert not any(map(_alive, workers)), f"workers {sorted(workers)} still run after their host was killed"
    finally:
        _finish(proc, workers)
