"""Connection and worker settings: where they come from, how they reach worker processes, and what a bad
one says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flowserve.errors import ErrorKind, SettingsError
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


def test_worker_settings_come_from_variables_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWSERVE_WORKER_EVENT_LOOP", "asyncio")
    monkeypatch.setenv("FLOWSERVE_WORKER_COMMIT_INTERVAL_MS", "250")
    monkeypatch.setenv("FLOWSERVE_WORKER_STATS_INTERVAL_S", "5")
    settings = WorkerSettings.from_env(stats_interval_s=1.0)
    assert (settings.event_loop, settings.commit_interval_ms, settings.stats_interval_s) == ("asyncio", 250, 1.0)
    assert WorkerSettings.from_env(stats_interval_s=None).stats_interval_s == 5  # a flag not given


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("FLOWSERVE_WORKER_EVENT_LOOP", "bogus", "FLOWSERVE_WORKER_EVENT_LOOP: Input should be 'auto', 'asyncio' or"),
    ("FLOWSERVE_WORKER_COMMIT_INTERVAL_MS", "-1", "FLOWSERVE_WORKER_COMMIT_INTERVAL_MS: Input should be greater"),
])
def test_a_bad_worker_variable_is_a_settings_error_naming_it(monkeypatch: pytest.MonkeyPatch, variable: str,
                                                             value: str, says: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        WorkerSettings.from_env()
    assert caught.value.kind == ErrorKind.INVALID_SETTINGS
    assert str(caught.value).startswith(f"invalid setting: {says}")


def test_a_bad_connection_setting_names_its_variable_and_never_echoes_a_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWSERVE_SECURITY_PROTOCOL", "hunter2")
    monkeypatch.setenv("FLOWSERVE_FETCH_MAX_WAIT_MS", "soon")
    with pytest.raises(SettingsError) as caught:
        KafkaSettings.from_env("h:1", replication_factor=0)
    message = str(caught.value)
    assert message.startswith("invalid settings: ")
    for name in ("FLOWSERVE_SECURITY_PROTOCOL", "FLOWSERVE_FETCH_MAX_WAIT_MS", "replication_factor: "):
        assert name in message
    assert "hunter2" not in message and "soon" not in message


def test_the_cli_answers_a_bad_variable_with_one_line_and_status_2() -> None:
    env = {**os.environ, "FLOWSERVE_WORKER_EVENT_LOOP": "bogus"}
    out = subprocess.run([sys.executable, "-m", "flowserve", "worker", "topologies/digits.yaml", "pre",
                          "--broker", "127.0.0.1:1"], env=env, capture_output=True, text=True,
                         cwd=Path(__file__).parents[2], timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr + out.stdout
    assert "invalid setting: FLOWSERVE_WORKER_EVENT_LOOP" in out.stderr + out.stdout
