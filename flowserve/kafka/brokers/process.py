"""What both broker kinds share: the :class:`Broker` protocol, broker processes, the readiness probe."""

from __future__ import annotations

import atexit
import contextlib
import random
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

from flowserve.errors import BrokerError
from flowserve.kafka.settings import KafkaSettings

_HOST = "127.0.0.1"
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

    @property
    def fetch_max_wait_ms(self) -> int:
        """The fetch wait that suits this broker (see :attr:`KafkaSettings.fetch_max_wait_ms`)."""
        ...

    @property
    def pids(self) -> list[int]:
        """Process ids of the broker's running nodes (benches read their CPU time and memory)."""
        ...

    def settings(self) -> KafkaSettings:
        """How flowserve's clients reach this broker: its address, fetch wait and whether producers may be
        idempotent (``FLOWSERVE_*`` over all)."""
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


#: ports handed out by :func:`free_port` in this process: one not yet bound by its broker looks free
_GIVEN: set[int] = set()
#: where :func:`free_port` looks first, below Linux's default ephemeral range (32768-60999)
_QUIET_PORTS = range(20_000, 32_768)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, outside the kernel's ephemeral range.

    A port from that range (what binding port 0 gives) can be taken as the source port of an outgoing
    connection between this check and the broker's own bind, seconds later: the nodes of a 3-node cluster
    connect to each other while the others start, and one such start failed with "Unable to start
    acceptor". Ports below the range are never given to outgoing connections. Falls back to port 0's
    answer when none of the tries is free (or the range is configured lower).
    """
    low = _ephemeral_low()
    quiet = [p for p in random.sample(_QUIET_PORTS, 64) if p < low and p not in _GIVEN]
    for port in quiet:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((_HOST, port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The lowest source port the kernel gives outgoing connections (Linux; elsewhere IANA's 49152)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return 49152


# --- processes -------------------------------------------------------------------------------------


def dies_with_us(argv: list[str]) -> list[str]:
    """``argv`` run so that the broker gets SIGTERM when this process dies, even by SIGKILL: a ``flowserve
    run`` killed outright otherwise leaves its JVM (some 400 MB) running, re-parented to init, for good.

    ``setpriv --pdeathsig`` (util-linux) sets the signal and execs the broker, so nothing runs between
    fork and exec (unlike a ``preexec_fn``, unsafe with threads). Only from the main thread: the signal
    fires when the *thread* that started the child ends, and a helper thread's end is not ours."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return argv
    return [setpriv, "--pdeathsig", "TERM", *argv]


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
                dies_with_us(self.argv),
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

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGSTOP, returning once the process is stopped: the signal is delivered asynchronously, and a
        request sent meanwhile could still be answered (Linux /proc; elsewhere it returns at once)."""
        self.signal(signal.SIGSTOP)
        if self.process is None:
            return
        stat = Path(f"/proc/{self.process.pid}/stat")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                state = stat.read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                return
            if state in ("T", "t"):
                return
            time.sleep(0.002)  # polling the kernel's process state, bounded

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

    bootstrap: str
    fetch_max_wait_ms: int
    supports_transactions: bool

    def settings(self) -> KafkaSettings:
        # Transactions build on idempotent producers: a broker that has them supports idempotence.
        return KafkaSettings.from_env(self.bootstrap, fetch_max_wait_ms=self.fetch_max_wait_ms,
                                      idempotence=self.supports_transactions)

    def stop(self) -> None:
        for node in self._nodes:
            node.kill(self._stop_grace_s)
        shutil.rmtree(self._workdir, ignore_errors=True)
        _RUNNING.discard(self)

    @property
    def pids(self) -> list[int]:
        """Process ids of the nodes running now (benches read their CPU time from /proc)."""
        return [node.process.pid for node in self._nodes if node.process is not None and node.alive]

    @property
    def node_pids(self) -> list[int | None]:
        """Per node, in node order, its process id, or None while it is down (a chaos run samples each
        node's memory across its restarts)."""
        return [node.process.pid if node.process is not None and node.alive else None for node in self._nodes]

    def pause(self) -> None:
        for node in self._nodes:
            node.stop()

    def resume(self) -> None:
        for node in self._nodes:
            node.signal(signal.SIGCONT)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
