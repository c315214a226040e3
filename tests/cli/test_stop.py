"""Every process a command starts ends with it, on SIGTERM (a container stop) and SIGINT (Ctrl-C) alike."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc, Linux)."""
    out: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            children = (task / "children").read_text().split() if (task / "children").exists() else []
            for child in map(int, children):
                if child not in out:
                    out.add(child)
                    todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


def _assert_all_ended(pids: set[int]) -> None:
    for _ in range(300):  # polling for the exits, bounded; the assertion is on the outcome only
        if not any(_alive(p) for p in pids):
            return
        time.sleep(0.1)
    raise AssertionError(f"processes left behind: {sorted(p for p in pids if _alive(p))}")


def _default_signals() -> None:
    """In the child: SIGINT as a terminal gives it. A shell starting a command in the background without job
    control (``cmd &`` in a script, as some CI runners do) hands it SIGINT ignored, and Python then keeps
    ignoring it; what is tested here is what flowserve does with a Ctrl-C it receives."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _kill_all(proc: subprocess.Popen[str]) -> None:
    """Whatever a failed test left running."""
    if proc.poll() is None:
        proc.kill()
    for p in _descendants(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("kind", ["embedded", "kafka"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_flowserve_broker_stops_its_broker(kind: str, sig: signal.Signals) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "flowserve", "broker", "--kind", kind],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            preexec_fn=_default_signals)
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()  # printed once the broker answers
        assert address.startswith("127.0.0.1:"), address
        started = _descendants(proc.pid)
        assert started, "the broker runs as a child process"
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0
        _assert_all_ended(started)
    finally:
        _kill_all(proc)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_flowserve_run_stops_its_workers_and_broker_on_sigterm() -> None:
    echo = Path(__file__).parents[2] / "topologies" / "echo.yaml"
    proc = subprocess.Popen([sys.executable, "-m", "flowserve", "run", str(echo)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the broker, then the workers, then this line
            if "Ctrl-C to stop" in line:
                break
        started = _descendants(proc.pid)
        assert len(started) >= 2, "a broker and a worker process"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        _assert_all_ended(started)
    finally:
        _kill_all(proc)
