"""The default broker: Apache Kafka where Java and its jars are here, Tansu otherwise; kcat talks to it."""

from __future__ import annotations

import logging
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowserve.kafka.brokers import Broker, EmbeddedBroker, start_default
from flowserve.kafka.brokers.apache_kafka import kafka_missing

KCAT_TIMEOUT_S = 60  # a bound on a hung kcat, not a timing assertion


@pytest.fixture(scope="module")
def default_broker() -> Iterator[Broker]:
    missing = kafka_missing()
    if missing is not None:
        pytest.skip(f"the default broker is Apache Kafka only where it can start: {missing}")
    started = start_default()
    yield started
    started.stop()


def _kcat(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    if kcat is None:
        pytest.skip("kcat is not installed (Debian: apt-get install kcat)")
    return subprocess.run([kcat, *args], input=stdin, capture_output=True, text=True, timeout=KCAT_TIMEOUT_S)


@pytest.mark.integration
def test_default_is_apache_kafka_where_it_can_start(default_broker: Broker) -> None:
    assert default_broker.name == "kafka"


@pytest.mark.external
def test_kcat_lists_produces_and_consumes_in_a_group(default_broker: Broker) -> None:
    topic = f"kcat-{uuid.uuid4().hex[:8]}"
    listed = _kcat("-b", default_broker.bootstrap, "-L")
    assert listed.returncode == 0, listed.stderr
    assert "1 brokers:" in listed.stdout

    lines = [f"request-{i}" for i in range(5)]
    # -P creates the topic (auto-creation is on) and exits once every message is delivered.
    produced = _kcat("-b", default_broker.bootstrap, "-P", "-t", topic, "-K", ":", stdin="".join(
        f"k{i}:{line}\n" for i, line in enumerate(lines)))
    assert produced.returncode == 0, produced.stderr

    # -G: a balanced consumer group, as a service reading flowserve's outputs would use; -c exits after 5.
    consumed = _kcat("-b", default_broker.bootstrap, "-G", f"g-{topic}", "-X", "auto.offset.reset=earliest",
                     "-c", str(len(lines)), "-f", "%k=%s\n", topic)
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(consumed.stdout.split()) == sorted(f"k{i}={line}" for i, line in enumerate(lines))


@pytest.mark.integration
def test_without_java_the_default_is_tansu_and_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with caplog.at_level(logging.WARNING, logger="flowserve.kafka.brokers"):
        broker = start_default()
    try:
        assert isinstance(broker, EmbeddedBroker)
        assert "java not found" in caplog.text
        assert "flowserve broker --kind kafka" in caplog.text
    finally:
        broker.stop()


@pytest.mark.integration
def test_without_cached_jars_the_default_downloads_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if shutil.which("java") is None:
        pytest.skip("needs java on PATH")
    monkeypatch.setenv("FLOWSERVE_KAFKA_LIBS", str(tmp_path / "no-jars-here"))
    with caplog.at_level(logging.WARNING, logger="flowserve.kafka.brokers"):
        broker = start_default()
    try:
        assert isinstance(broker, EmbeddedBroker)
        assert "jars are not in" in caplog.text
        assert not (tmp_path / "no-jars-here").exists()
    finally:
        broker.stop()
