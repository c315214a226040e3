"""Connection settings: where the fetch wait comes from, and how it reaches worker processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flowserve.kafka.clients import make_consumer
from flowserve.kafka.settings import KafkaSettings, WorkerSettings
from flowserve.runtime.host import ProcessHost
from flowserve.topology.graph import load_topology_text

TOPOLOGY = """
name: s
nodes:
  a:
    component: flowserve.builtin:Identity
    params: {ports: {x: {datatype: FP32, shape: [-1, 4]}}}
    inputs: {x: input.x}
outputs: {y: a.x}
"""


def test_variables_override_defaults_and_the_address_overrides_both(monkeypatch: pytest.MonkeyPatch) -> None:
    assert KafkaSettings().fetch_max_wait_ms == 500  # Apache Kafka's: it answers as soon as records arrive
    assert KafkaSettings.from_env("h:1", fetch_max_wait_ms=5).fetch_max_wait_ms == 5
    monkeypatch.setenv("FLOWSERVE_FETCH_MAX_WAIT_MS", "40")
    monkeypatch.setenv("FLOWSERVE_BOOTSTRAP", "env:9")
    settings = KafkaSettings.from_env("h:1", fetch_max_wait_ms=5)
    assert (settings.bootstrap, settings.fetch_max_wait_ms) == ("h:1", 40)


async def test_a_worker_fetches_with_the_connection_wait_unless_it_sets_its_own() -> None:
    kafka = KafkaSettings(bootstrap="127.0.0.1:1", fetch_max_wait_ms=5)
    for worker, expected in ((WorkerSettings(), 5), (WorkerSettings(fetch_max_wait_ms=250), 250)):
        consumer = make_consumer(kafka, worker, group_id="g", max_message_bytes=1024)
        assert consumer._fetch_max_wait_ms == expected


def test_worker_processes_get_the_fetch_wait_of_the_host_connection(tmp_path: Path) -> None:
    topology = load_topology_text(TOPOLOGY, source="test")
    host = ProcessHost(tmp_path / "s.yaml", topology, KafkaSettings(bootstrap="127.0.0.1:1", fetch_max_wait_ms=5))
    probe = ("from flowserve.kafka.settings import KafkaSettings\n"
             "print(KafkaSettings.from_env('h:1').fetch_max_wait_ms)")
    out = subprocess.run([sys.executable, "-c", probe], env=host.environment(), capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "5"
