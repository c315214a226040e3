"""Explanations through the graph: attributions of a topology's output to its inputs (``explain:`` in the YAML).

A chain of nodes is composed into one function (:class:`Chain`): in torch where every node is
:class:`Differentiable` (integrated gradients through every stage), else through each component's
``process`` (KernelSHAP). captum and torch are imported when an explanation is first computed
(``pip install 'flowserve[explain]'``). See ``docs/explain.md``.
"""

from flowserve.explain.attribute import Explanation, explain, integrated_gradients, kernel_shap
from flowserve.explain.capabilities import Differentiable
from flowserve.explain.chain import Chain, ExplainError, Target, targets

__all__ = ["Chain", "Differentiable", "ExplainError", "Explanation", "Target", "explain", "integrated_gradients",
           "kernel_shap", "targets"]
