"""What a component offers explanations through the graph (:mod:`flowserve.explain`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Differentiable(Protocol):
    """A component whose ``process`` has a torch twin that autograd can differentiate.

    Integrated gradients composes the twins of a chain of nodes into one function from the topology's
    inputs to the explained output; a chain with a node that lacks this is explained by the model-agnostic
    method (KernelSHAP over ``process``) instead.
    """

    def torch_forward(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """``process`` in torch: float tensors by input port (one row per example, maybe on another device,
        maybe requiring grad) to tensors by output port, the same values ``process`` gives. Ports whose
        values are not differentiable (an arg-max label) may be left out. ``setup`` has run; must not use
        ``torch.no_grad`` or ``inference_mode``."""
        ...
