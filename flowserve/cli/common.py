"""What several commands share: the consoles, the broker options, loading a topology with its plan."""

from __future__ import annotations

import argparse
import contextlib
import signal
import time
from collections.abc import Callable, Iterator

from flowserve.console import make_console
from flowserve.errors import BrokerError
from flowserve.kafka.settings import KafkaSettings
from flowserve.topology import Topology, load_topology

console = make_console(stderr=True)
out = make_console()


def broker_options(p: argparse.ArgumentParser) -> None:
    """``--broker`` and ``--broker-kind``, for commands that start a broker here when none is given."""
    p.add_argument("--broker", help="bootstrap host:port of a running Kafka (default: start one here)")
    p.add_argument("--broker-kind", choices=["default", "embedded", "kafka"], default="default",
                   help="which broker to start when --broker is not given (default: Apache Kafka where "
                   "Java and its jars are here, else embedded)")


def load(path: str, plan: str | None = None) -> Topology:
    """The topology at ``path``, with the plan file ``plan`` (``flowserve plan``) applied when given."""
    topology = load_topology(path)
    if plan:
        from flowserve.tuning.plan import apply_plan, load_plan  # the planner's search: not for --help

        topology = apply_plan(topology, load_plan(plan))
    return topology


def kafka(bootstrap: str) -> KafkaSettings:
    return KafkaSettings.from_env(bootstrap)


@contextlib.contextmanager
def broker(address: str | None, kind: str, *, server_jvm: bool = False) -> Iterator[KafkaSettings]:
    """Yield how to reach the given broker, or one started here for the duration."""
    if address:
        yield kafka(address)
        return
    from flowserve.kafka.brokers import start_broker  # the brokers' launchers: only when one is started
    from flowserve.kafka.brokers.apache_kafka import java_available, kafka_libs_dir, kafka_missing

    if kind in ("default", "kafka") and java_available() and kafka_missing():
        # the first run fetches Kafka's jars with a progress bar of its own, which a spinner would overdraw;
        # where the fetch fails the default broker says why and starts Tansu
        try:
            kafka_libs_dir()
        except BrokerError:
            if kind == "kafka":
                raise
    with console.status(f"starting the {kind} broker…"):
        started = start_broker(kind, server_jvm=server_jvm)  # type: ignore[arg-type]
    note = " (a temporary broker: its data is gone when flowserve exits)"
    console.print(f"[green]broker[/] {started.name} at {started.bootstrap}{note}")
    try:
        yield started.settings()
    finally:
        started.stop()


def stop_on_sigterm() -> None:
    """Make SIGTERM (a container stop, ``kill``) end this command as Ctrl-C does: by KeyboardInterrupt, so
    that its ``finally`` blocks stop the broker and workers it started instead of leaving them behind,
    re-parented to init. A handler, not a blocked signal: a blocked mask would be inherited by the
    processes the command starts."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def wait_for_stop(announce: Callable[[], None] = lambda: None) -> None:
    """``announce`` (e.g. print an address), then return on SIGINT or SIGTERM (see :func:`stop_on_sigterm`),
    also one that comes while announcing; a second SIGTERM while the caller cleans up is ignored, a
    second Ctrl-C still interrupts."""
    try:
        announce()
        while True:
            # Not signal.pause(): with other threads (the supervisor's) the kernel may deliver the signal to
            # one of them, and pause() in this thread would not return; a short sleep lets the handler run.
            time.sleep(0.5)
    except KeyboardInterrupt:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
