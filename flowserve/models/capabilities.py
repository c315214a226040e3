"""What a many-model node asks of its component: load a model onto the device, drop it, run a batch of it.

Checked once when the worker's hooks are built (:func:`flowserve.component.require`). The component holds
the device; the scheduler (:mod:`flowserve.models.scheduler`) decides when each call happens, and each call
blocks for as long as the device is busy with it (an emulated device sleeps; a real one copies and
computes), on one thread per lane, so a load and a batch overlap as on a GPU.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from flowserve.component import Batch
from flowserve.models.catalogue import ModelSpec


@runtime_checkable
class ServesModels(Protocol):
    """A component that serves many models, a bounded set of them resident on its device at a time."""

    def load_model(self, spec: ModelSpec) -> None:
        """Make ``spec``'s model resident (returns when it is: the copy lane is busy until then)."""
        ...

    def unload_model(self, name: str) -> None:
        """Free the device memory of model ``name`` (evicted to make room for another)."""
        ...

    def run_model(self, spec: ModelSpec, batch: Batch) -> Any:
        """``process`` for model ``spec`` on a batch of its requests (the same results ``process`` returns)."""
        ...
