"""The supervisor restarts dead worker processes, leaves deliberate exits alone, and gives up on crash loops.

Real processes stand in for workers (a host whose worker command is a tiny Python program); no broker.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import pytest

from flowserve.kafka.settings import KafkaSettings
from flowserve.runtime.host import ProcessHost
from flowserve.runtime.supervise import RestartPolicy, Supervisor, describe_exit
from flowserve.topology.graph import load_topology_text

TOPOLOGY = load_topology_text("""
name: sup
nodes:
  a:
    component: flowserve.builtin:Identity
    params: {ports: {x: {datatype: FP32, shape: [-1]}}}
    inputs: {x: input.x}
inputs: {x: {datatype: FP32, shape: [-1]}}
outputs: {x: a.x}
""")


class _Host(ProcessHost):
    """A host whose "worker" runs ``program`` instead of ``flowserve worker``."""

    program = "import time; time.sleep(600)"

    def command(self, node_id: str) -> list[str]:
        return [sys.executable, "-c", self.program]


def _host(program: str) -> _Host:
    host = _Host(Path("sup.yaml"), TOPOLOGY, KafkaSettings(bootstrap="127.0.0.1:1"))
    host.program = program
    host.start_processes()
    return host


def test_exit_descriptions() -> None:
    assert describe_exit(-9) == "signal SIGKILL" and describe_exit(3) == "exit status 3"


def test_a_killed_worker_is_restarted_with_a_line_naming_node_and_status() -> None:
    host = _host("import time; time.sleep(600)")
    lines: list[str] = []
    restarted = threading.Event()

    def report(line: str) -> None:
        lines.append(line)
        if line.startswith("restarted"):
            restarted.set()

    sup = Supervisor(host, RestartPolicy(initial_backoff_s=0.01), report=report, poll_s=0.01)
    sup.start()
    try:
        first = host.procs["a"][0]
        first.send_signal(signal.SIGKILL)
        assert restarted.wait(30)
        assert host.procs["a"][0].pid != first.pid and host.procs["a"][0].poll() is None
        assert any("worker a[0]" in line and "died with signal SIGKILL" in line for line in lines), lines
        assert sup.restarts == 1 and not sup.gave_up
    finally:
        sup.stop()
        host.stop()


def test_a_worker_told_to_stop_stays_stopped() -> None:
    host = _host("pass")
    lines: list[str] = []
    done = threading.Event()

    def report(line: str) -> None:
        lines.append(line)
        done.set()

    sup = Supervisor(host, report=report, poll_s=0.01)
    sup.start()
    try:
        assert done.wait(30)
        assert "stopped with exit status 0; not restarted" in lines[0] and sup.restarts == 0
    finally:
        sup.stop()
        host.stop()


@pytest.mark.parametrize("deaths", [1, 3])
def test_a_crash_loop_is_given_up_with_a_clear_message(deaths: int) -> None:
    host = _host("import sys; sys.exit(3)")
    given_up = threading.Event()
    messages: list[str] = []

    def give_up(message: str) -> None:
        messages.append(message)
        given_up.set()

    sup = Supervisor(host, RestartPolicy(initial_backoff_s=0.01, max_quick_deaths=deaths), on_give_up=give_up,
                     poll_s=0.01)
    sup.start()
    try:
        assert given_up.wait(60)
        assert sup.restarts == deaths - 1
        assert messages == [sup.gave_up["a"]]
        assert f"giving up on node 'a': its worker died {deaths} times in a row" in messages[0]
        assert "last: exit status 3" in messages[0]
    finally:
        sup.stop()
        host.stop()
