"""Apache Kafka's jars fetched without Maven (flowserve.kafka.brokers.fetch): checked, once, and never half.

A Maven repository on 127.0.0.1 (tests/support/fs_maven.py) stands in for Maven Central; no broker runs here.
"""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import pytest
from fs_maven import MavenMirror

from flowserve.kafka.brokers import KAFKA_VERSION, fetch
from flowserve.kafka.brokers.fetch import ChecksumError, FetchError, Jar, fetch_jars, maven_url, pinned_jars

UNREACHABLE = "http://127.0.0.1:9/"  # the discard port: nothing listens there, so the connect is refused


def _jar(path: str, body: bytes) -> Jar:
    return Jar(path, len(body), hashlib.sha256(body).hexdigest())


CLIENTS = b"kafka-clients classes" * 100
SCALA = b"scala library classes" * 300
JARS = [_jar("org/apache/kafka/kafka-clients/4.1.1/kafka-clients-4.1.1.jar", CLIENTS),
        _jar("org/scala-lang/scala-library/2.13.16/scala-library-2.13.16.jar", SCALA)]


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_fetches_each_jar_once_checked_and_marked_complete(tmp_path: Path) -> None:
    target = tmp_path / "4.1.1" / "libs"
    with MavenMirror({JARS[0].path: CLIENTS, JARS[1].path: SCALA}) as mirror:
        fetch_jars(target, JARS, base_url=mirror.url)
        assert sorted(mirror.requests) == sorted(jar.path for jar in JARS)
        assert (target / "kafka-clients-4.1.1.jar").read_bytes() == CLIENTS
        assert (target / "scala-library-2.13.16.jar").read_bytes() == SCALA
        assert (target / ".complete").exists()
        assert fetch_jars(target, JARS, base_url=mirror.url) == 0.0  # cached: nothing asked for again
        assert len(mirror.requests) == len(JARS)
    assert _leftovers(target.parent) == ["libs"]  # no staging folder left behind


def test_a_corrupted_jar_is_refused_naming_the_file_and_nothing_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "4.1.1" / "libs"
    corrupted = bytearray(SCALA)
    corrupted[100] ^= 0xFF  # same size, one byte flipped: only the digest can tell
    with MavenMirror({JARS[0].path: CLIENTS, JARS[1].path: bytes(corrupted)}) as mirror, \
            pytest.raises(ChecksumError) as refused:  # fmt: skip
        fetch_jars(target, JARS, base_url=mirror.url)
    message = str(refused.value)
    assert "scala-library-2.13.16.jar refused" in message
    assert f"{mirror.url}{JARS[1].path}" in message
    assert JARS[1].sha256[:16] in message
    assert refused.value.kind == "unavailable"
    assert _leftovers(target.parent) == []  # neither the target nor a staging folder


def test_a_longer_file_is_refused_too(tmp_path: Path) -> None:
    with MavenMirror({JARS[0].path: CLIENTS + b"appended", JARS[1].path: SCALA}) as mirror, \
            pytest.raises(ChecksumError, match="kafka-clients-4.1.1.jar refused: .* served more than"):  # fmt: skip
        fetch_jars(tmp_path / "libs", JARS, base_url=mirror.url)


def test_an_unreachable_repository_fails_at_once_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWSERVE_MAVEN_URL", UNREACHABLE)
    with pytest.raises(FetchError, match=r"cannot reach http://127\.0\.0\.1:9/ \(.*refused"):
        fetch_jars(tmp_path / "libs", JARS)
    assert _leftovers(tmp_path) == []


def test_a_missing_file_names_its_url(tmp_path: Path) -> None:
    with MavenMirror({JARS[0].path: CLIENTS}) as mirror, pytest.raises(FetchError) as failed:
        fetch_jars(tmp_path / "libs", JARS, base_url=mirror.url)
    assert f"{mirror.url}{JARS[1].path}: HTTP 404" in str(failed.value)


def test_jars_already_in_libs_are_linked_not_fetched(tmp_path: Path) -> None:
    libs = tmp_path / "libs"
    libs.mkdir()
    (libs / "kafka-clients-4.1.1.jar").write_bytes(CLIENTS)
    (libs / "scala-library-2.13.16.jar").write_bytes(b"not the pinned bytes")  # changed: fetched again
    with MavenMirror({JARS[1].path: SCALA}) as mirror:
        fetch_jars(tmp_path / "tools", JARS, reuse=libs, base_url=mirror.url)
        assert mirror.requests == [JARS[1].path]
    assert (tmp_path / "tools" / "scala-library-2.13.16.jar").read_bytes() == SCALA


def test_the_maven_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOWSERVE_MAVEN_URL", raising=False)
    assert maven_url() == "https://repo.maven.apache.org/maven2/"
    monkeypatch.setenv("FLOWSERVE_MAVEN_URL", "http://nexus.example/maven")
    assert maven_url() == "http://nexus.example/maven/"
    monkeypatch.setenv("FLOWSERVE_MAVEN_URL", "file:///etc/")
    with pytest.raises(FetchError, match="http"):
        maven_url()


def test_the_pinned_lists_cover_the_broker_and_the_console_clients() -> None:
    libs, tools = pinned_jars(KAFKA_VERSION), pinned_jars(KAFKA_VERSION, tools=True)
    assert libs is not None and tools is not None
    names = {jar.name for jar in libs}
    assert {f"kafka_2.13-{KAFKA_VERSION}.jar", f"kafka-clients-{KAFKA_VERSION}.jar", "log4j-core-2.24.3.jar",
            "log4j-slf4j-impl-2.24.3.jar"} <= names
    assert set(libs) < set(tools)  # the clients' folder is the broker's classpath and kafka-tools'
    assert f"kafka-tools-{KAFKA_VERSION}.jar" in {jar.name for jar in tools}
    assert all(len(jar.sha256) == 64 and jar.size > 0 for jar in tools)
    assert pinned_jars("0.0.1") is None  # another version: only Maven can resolve it


def test_a_server_that_never_answers_fails_within_the_socket_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fetch, "SOCKET_TIMEOUT_S", 0.2)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # connects are queued, never read nor answered
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
        with pytest.raises(FetchError, match="timed out"):
            fetch_jars(tmp_path / "libs", JARS, base_url=url)
    assert _leftovers(tmp_path) == []
