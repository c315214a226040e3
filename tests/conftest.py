"""Shared fixtures, and the test tiers (docs/testing.md).

The README's ``pytest`` runs the unit tier and one end-to-end smoke per broker kind; ``pytest -m integration``
(broker-backed), ``-m slow`` (faults, chaos, the live tuner) and ``-m external`` (programs pip does not bring:
a browser, kcat, the Java console clients, kube-apiserver) run the rest. The tiers are disjoint: a test carries
at most one of those three marks, and a test that uses the broker fixture is marked ``integration`` here
unless it is already slow or external.

A broker-backed test runs on one broker kind, the default one (Apache Kafka where Java is here, else the
embedded Tansu), unless it is marked ``every_broker`` (it is about the broker, or is the smoke).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flowserve.component import Batch, Component
from flowserve.kafka.brokers.apache_kafka import java_available, kafka_libs_dir, kafka_missing, kafka_tools_dir

SUPPORT = Path(__file__).parent / "support"
sys.path.insert(0, str(SUPPORT))
# Test modules name components as tests.<dir>.<module>:Class: the repository root resolves them whether pytest
# runs as `pytest` or `python -m pytest` (only the latter puts the working directory on sys.path)
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
# Worker subprocesses import the test components too.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")]))

#: every broker kind a test marked ``every_broker`` runs on (FLOWSERVE_TEST_BROKERS narrows it)
BROKER_KINDS = [k for k in os.environ.get("FLOWSERVE_TEST_BROKERS", "embedded,kafka").split(",") if k]
#: the one kind every other broker-backed test runs on: the default broker's (flowserve.kafka.brokers.default)
DEFAULT_KIND = os.environ.get("FLOWSERVE_TEST_BROKER") or (
    "kafka" if java_available() and "kafka" in BROKER_KINDS else BROKER_KINDS[0])
TIERS = ("integration", "slow", "external")
#: fixtures that start or need a broker: a test using one is broker-backed
BROKER_FIXTURES = {"broker"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One session-wide broker per kind, and each test on the kinds it needs (see the module docstring)."""
    if "broker" not in metafunc.fixturenames:
        return
    kinds = BROKER_KINDS if metafunc.definition.get_closest_marker("every_broker") else [DEFAULT_KIND]
    metafunc.parametrize("broker", kinds, indirect=True, scope="session")


@pytest.hookimpl(tryfirst=True)  # before -m selects on the marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tiers = {m.name for m in item.iter_markers() if m.name in TIERS}
        if not tiers and not item.get_closest_marker("smoke") and BROKER_FIXTURES & set(
                getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
        elif len(tiers) > 1:
            raise pytest.UsageError(f"{item.nodeid} is marked {' and '.join(sorted(tiers))}: the tiers are "
                                    "disjoint, keep one (slow or external wins over integration)")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Fetch Apache Kafka's jars (and its console clients, for the slow and external tiers) once, before the
    first test, where the selected tests need them and they are not cached: outside any one test's timeout, and
    with a line that says so. A fresh clone's ``pytest`` needs no step the README does not name."""
    if not java_available() or not session.items:
        return
    on_kafka = any(getattr(getattr(item, "callspec", None), "params", {}).get("broker") == "kafka"
                   for item in session.items)
    needs_tools = any(item.get_closest_marker("slow") or item.get_closest_marker("external") for item in session.items)
    missing = kafka_missing()
    if (on_kafka or needs_tools) and missing:
        print(f"\n{missing}: fetching them from Maven Central once (flowserve/kafka/brokers/fetch.py)…", flush=True)
        kafka_libs_dir()
    if needs_tools:
        kafka_tools_dir()


def pytest_report_header(config: pytest.Config) -> str:
    chosen = config.getoption("markexpr") or "every tier"
    return (f"flowserve tiers: running '{chosen}'; the others: pytest -m integration | -m slow | -m external "
            f"(-m '' for all). Broker-backed tests on {DEFAULT_KIND}; every_broker ones on {','.join(BROKER_KINDS)}")


@pytest.fixture(scope="session")
def broker(request: pytest.FixtureRequest) -> Iterator[object]:
    """A running broker of the kind the test is parametrized with, shared by the whole session."""
    from flowserve.kafka.brokers import start_broker

    b = start_broker(request.param)
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def kafka(broker: object):  # noqa: ANN201

    return broker.settings()  # type: ignore[attr-defined]


@pytest.fixture
def unique_name() -> str:
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def write_topology(tmp_path: Path, unique_name: str):  # noqa: ANN201
    """Factory: write a topology YAML (``NAME`` is replaced by a unique name) and return its path."""

    def write(text: str) -> Path:
        path = tmp_path / f"{unique_name}.yaml"
        path.write_text(text.replace("NAME", unique_name))
        return path

    return write


def _make_batch(sizes: list[int], **tensors: np.ndarray) -> Batch:
    for name, array in tensors.items():
        assert len(array) == sum(sizes), f"tensor {name} has {len(array)} rows, sizes add up to {sum(sizes)}"
    return Batch(dict(tensors), list(sizes), [f"r{i}" for i in range(len(sizes))])


@pytest.fixture
def make_batch() -> Callable[..., Batch]:
    """``make_batch(sizes, **tensors)``: a batch of requests r0, r1, ... whose rows are ``tensors``."""
    return _make_batch


def _configure(cls: type[Component], params: dict[str, Any] | None = None, node: str = "test") -> Component:
    component = cls.configure(params or {}, node=node)
    assert type(component) is cls
    return component


@pytest.fixture
def configure() -> Callable[..., Any]:
    """``configure(cls, params, node)``: ``cls.configure`` checked to return a ``cls``."""
    return _configure
