"""Shared fixtures. Integration tests run once per broker kind: the embedded default and Apache Kafka."""

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

SUPPORT = Path(__file__).parent / "support"
sys.path.insert(0, str(SUPPORT))
# Worker subprocesses import the test components too.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")]))

BROKER_KINDS = [k for k in os.environ.get("FLOWSERVE_TEST_BROKERS", "embedded,kafka").split(",") if k]


@pytest.fixture(scope="session", params=BROKER_KINDS)
def broker(request: pytest.FixtureRequest) -> Iterator[object]:
    """A running broker of each kind, shared by the whole session."""
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
