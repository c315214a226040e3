"""What a component offers ``flowserve parity train`` (ParM)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class TrainsParity(Protocol):
    """A component that can train its own parity model."""

    def train_parity(self, k: int, encoding: str = "sum") -> dict[str, Any]:
        """Train this component's parity model for groups of ``k``: a model of the same architecture mapping
        the encoded k inputs (``encoding``: ``sum`` or ``concat``, see :mod:`flowserve.parity.codes`) to the
        sum of the k outputs, saved where a ``parity:`` section can load it. Prints what it measured;
        returns it (JSON-able)."""
        ...
