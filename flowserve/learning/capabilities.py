"""What a ``retrainable`` component offers continual learning (:mod:`flowserve.learning`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from flowserve.component import Component
from flowserve.errors import ComponentError


@dataclass(frozen=True, slots=True)
class Retrained:
    """What :meth:`Retrainable.retrain` produced: the new weights (a self-contained blob the component's
    :meth:`~Retrainable.load_weights` reads back) and what training measured (JSON-able numbers)."""

    weights: bytes
    metrics: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Retrainable(Protocol):
    """A component that fine-tunes itself on feedback (``Component.retrainable``)."""

    def retrain(self, inputs: Mapping[str, np.ndarray], targets: Mapping[str, np.ndarray]) -> Retrained:
        """New weights fine-tuned from the loaded ones (``setup`` ran; maybe a version was loaded) on
        ``inputs`` (arrays by input port, one row per example) and ``targets`` (the true outputs from
        feedback, by the topology's output names, same rows)."""
        ...

    def load_weights(self, data: bytes, version: str | None = None) -> None:
        """Swap in weights that :meth:`retrain` produced (a registered ``version``), between batches; sets
        ``weights_hash`` and ``model_version``. Must refuse anything but plain weights (no pickle)."""
        ...


@runtime_checkable
class Scores(Protocol):
    """A component that judges its own outputs against feedback (a classifier emitting logits for a
    ``label`` target); others are judged by :func:`score`'s comparison of same-named arrays."""

    def score(self, outputs: Mapping[str, np.ndarray], targets: Mapping[str, np.ndarray]) -> np.ndarray:
        """Per row, whether ``outputs`` got ``targets`` right: a bool array."""
        ...


def score(component: Component, outputs: Mapping[str, np.ndarray], targets: Mapping[str, np.ndarray]
          ) -> np.ndarray:
    """Per row, whether ``component``'s ``outputs`` got ``targets`` (feedback) right: a bool array.

    The component's own :meth:`Scores.score` when it has one; else outputs and targets of the same name
    are compared row by row.
    """
    if isinstance(component, Scores):
        return component.score(outputs, targets)
    common = [n for n in outputs if n in targets]
    if not common:
        raise ComponentError(f"{type(component).__name__}.score: no output named like a feedback target "
                             f"(outputs {', '.join(outputs)}; targets {', '.join(targets)})")
    rows = len(next(iter(outputs.values())))
    right = np.ones(rows, dtype=bool)
    for name in common:
        a, b = np.asarray(outputs[name]).reshape(rows, -1), np.asarray(targets[name]).reshape(rows, -1)
        right &= (a == b).all(axis=1)
    return right
