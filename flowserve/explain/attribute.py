"""Attributions of a chain's output to the topology's inputs: integrated gradients, or KernelSHAP.

What is attributed, per row of a request: the explained output's value at the class the pipeline chose
(the arg-max of that output: for digits the probability of the predicted digit). The arg-max itself is
not differentiable, so the class is fixed from the output at the input and the attribution explains that
class's score. A one-dimensional output (a score per row) is attributed as it is.

Both methods come from captum (imported when first used; ``pip install 'flowserve[explain]'``):

- **integrated gradients** (:func:`integrated_gradients`) where every node of the chain is
  :class:`~flowserve.explain.capabilities.Differentiable`: exact up to the integral's quadrature, so the
  attributions sum to ``f(x) - f(baseline)`` (completeness; :attr:`Explanation.delta` is the gap);
- **KernelSHAP** (:func:`kernel_shap`) for any chain, over the components' own ``process``: a weighted
  linear fit over coalitions of input features, each absent feature set to the baseline. captum's rather
  than shap's: one library for both methods with the same baseline semantics, and shap would bring numba,
  pandas and scikit-learn into the core's environment for the same estimator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from flowserve.errors import ErrorKind
from flowserve.explain.capabilities import Differentiable
from flowserve.explain.chain import Chain, ExplainError

Method = Literal["auto", "integrated_gradients", "kernel_shap"]
#: what ``pip`` installs for the explain extra
INSTALL = "pip install 'flowserve[explain]' (captum)"


@dataclass
class Explanation:
    """One request's attributions: per attributed input, an array of its shape; per row, the explained class,
    the output there at the input and at the baseline, and the completeness gap ``sum(attr) - (f_x - f_b)``."""

    request_id: str
    topology: str
    output: str
    method: str
    baseline: float
    classes: list[int]
    f_x: list[float]
    f_baseline: list[float]
    attributions: dict[str, np.ndarray]

    @property
    def sums(self) -> list[float]:
        """Per row, the attributions summed over every input."""
        rows = len(self.f_x)
        total = np.zeros(rows)
        for a in self.attributions.values():
            total += a.reshape(rows, -1).sum(axis=1)
        return total.tolist()

    @property
    def delta(self) -> list[float]:
        """Per row, ``sum(attributions) - (f_x - f_baseline)``: 0 for exact completeness."""
        return [s - (fx - fb) for s, fx, fb in zip(self.sums, self.f_x, self.f_baseline, strict=True)]

    def to_json(self) -> dict[str, Any]:
        return {"explanation": 1, "request_id": self.request_id, "topology": self.topology, "output": self.output,
                "method": self.method, "baseline": self.baseline, "classes": self.classes, "f_x": self.f_x,
                "f_baseline": self.f_baseline, "delta": self.delta,
                "attributions": {n: {"shape": list(a.shape), "data": [float(f"{v:.6g}") for v in a.ravel()]}
                                 for n, a in self.attributions.items()}}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Explanation:
        attributions = {n: np.asarray(a["data"], dtype=np.float64).reshape(a["shape"])
                        for n, a in body["attributions"].items()}
        return cls(str(body["request_id"]), str(body["topology"]), str(body["output"]), str(body["method"]),
                   float(body["baseline"]), [int(c) for c in body["classes"]], [float(v) for v in body["f_x"]],
                   [float(v) for v in body["f_baseline"]], attributions)


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ExplainError(f"explanations need torch and captum: {INSTALL}", kind=ErrorKind.INVALID_SETTINGS) from None
    return torch


def _captum_attr() -> Any:
    try:
        import captum.attr
    except ImportError:
        raise ExplainError(f"explanations need captum: {INSTALL}", kind=ErrorKind.INVALID_SETTINGS) from None
    return captum.attr


def _tensors(chain: Chain, inputs: Mapping[str, np.ndarray], baseline: float
             ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    torch = _torch()
    xs = []
    for name in chain.inputs:
        if name not in inputs:
            raise ExplainError(f"the request has no input '{name}' (it has {', '.join(inputs) or 'none'})",
                               kind=ErrorKind.INVALID_INPUT)
        array = np.asarray(inputs[name])
        if array.dtype.kind not in "biuf":
            raise ExplainError(f"input '{name}' is {array.dtype}: only numeric inputs can be attributed",
                               kind=ErrorKind.INVALID_INPUT)
        xs.append(torch.as_tensor(np.array(array, dtype=np.float32)))
    return tuple(xs), tuple(torch.full_like(x, baseline) for x in xs)


def _classes(y: Any) -> list[int] | None:
    """The class explained per row: the arg-max of a [rows, classes] output; None for a score per row."""
    if y.ndim == 1:
        return None
    if y.ndim != 2:
        raise ExplainError(f"the explained output has shape {list(y.shape)}: only a score per row or a [rows, "
                           "classes] output can be explained", kind=ErrorKind.INVALID_INPUT)
    return [int(c) for c in y.argmax(dim=1).tolist()]


def _picked(y: Any, classes: list[int] | None) -> list[float]:
    y = y.detach().cpu().double()
    if classes is None:
        return [float(v) for v in y.tolist()]
    return [float(y[i, c]) for i, c in enumerate(classes)]


def integrated_gradients(chain: Chain, inputs: Mapping[str, np.ndarray], *, request_id: str = "",
                         steps: int = 64, baseline: float = 0.0) -> Explanation:
    """Integrated gradients (captum) through the chain composed in torch, from an all-``baseline`` input."""
    torch = _torch()
    if not chain.differentiable():
        lacking = [n.id for n in chain.nodes if not isinstance(n.component, Differentiable)]
        raise ExplainError(f"integrated gradients needs every node on the path to be differentiable; "
                           f"{', '.join(lacking)} lack torch_forward (use method kernel_shap)",
                           kind=ErrorKind.INVALID_TOPOLOGY)
    attr = _captum_attr()
    xs, bs = _tensors(chain, inputs, baseline)

    def forward(*tensors: Any) -> Any:
        return chain.torch_fn(*tensors).float()

    with torch.no_grad():
        y, yb = forward(*xs), forward(*bs)
    classes = _classes(y)
    ig = attr.IntegratedGradients(forward)
    found = ig.attribute(xs, baselines=bs, target=classes, n_steps=steps, method="gausslegendre")
    return Explanation(request_id, chain.topology.name, chain.target.name, "integrated_gradients", baseline,
                       classes or [], _picked(y, classes), _picked(yb, classes),
                       {n: a.detach().cpu().double().numpy() for n, a in zip(chain.inputs, found, strict=True)})


def kernel_shap(chain: Chain, inputs: Mapping[str, np.ndarray], *, request_id: str = "", samples: int = 200,
                baseline: float = 0.0, seed: int = 0) -> Explanation:
    """KernelSHAP (captum) over the chain's ``process``, row by row: any component, no gradients."""
    torch = _torch()
    attr = _captum_attr()
    xs, bs = _tensors(chain, inputs, baseline)

    def forward(*tensors: Any) -> Any:
        arrays = {n: t.detach().cpu().numpy().astype(np.asarray(inputs[n]).dtype)
                  for n, t in zip(chain.inputs, tensors, strict=True)}
        return torch.as_tensor(np.asarray(chain.numpy_fn(arrays), dtype=np.float64))

    y, yb = forward(*xs), forward(*bs)
    classes = _classes(y)
    torch.manual_seed(seed)  # captum draws the coalitions with torch's generator: the same request, the same answer
    ks = attr.KernelShap(forward)
    rows = len(xs[0])
    found: list[list[Any]] = [[] for _ in xs]
    for i in range(rows):  # captum's KernelShap fits one example at a time
        one = ks.attribute(tuple(x[i:i + 1] for x in xs), baselines=tuple(b[i:i + 1] for b in bs),
                           target=None if classes is None else classes[i], n_samples=samples,
                           perturbations_per_eval=min(samples, 64))
        for k, a in enumerate(one):
            found[k].append(a)
    attributions = {n: torch.cat(a).detach().cpu().double().numpy() for n, a in zip(chain.inputs, found, strict=True)}
    return Explanation(request_id, chain.topology.name, chain.target.name, "kernel_shap", baseline, classes or [],
                       _picked(y, classes), _picked(yb, classes), attributions)


def explain(chain: Chain, inputs: Mapping[str, np.ndarray], *, request_id: str = "", method: Method | None = None
            ) -> Explanation:
    """The explanation of one request's ``inputs`` by ``method`` (default: the chain's ``explain:`` setting;
    ``auto``: integrated gradients where the chain is differentiable, else KernelSHAP)."""
    spec = chain.target.spec
    chosen = method or spec.method
    if chosen == "auto":
        chosen = "integrated_gradients" if chain.differentiable() else "kernel_shap"
    if chosen == "integrated_gradients":
        return integrated_gradients(chain, inputs, request_id=request_id, steps=spec.steps, baseline=spec.baseline)
    return kernel_shap(chain, inputs, request_id=request_id, samples=spec.samples, baseline=spec.baseline)
