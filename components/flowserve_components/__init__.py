"""The flowserve component library (distribution ``flowserve-components``): reusable stages for topologies,
referenced as ``module:Class``.

- ``flowserve_components.digits:Normalize``: raw 8x8 digit pixels (0..16) -> ``x`` (0..1)
- ``flowserve_components.torch_stage:TorchClassifier``: a torch model (zoo name or user weights) -> ``logits``
- ``flowserve_components.postprocess:ArgMax``: logits (or probs) -> ``label`` and ``probs``
- ``flowserve_components.postprocess:TopK``: logits -> the ``k`` best ``indices`` and their ``scores``
- ``flowserve_components.ensemble:Softmax``: logits -> ``probs``
- ``flowserve_components.ensemble:Average``: the mean of the members' ``probs`` present, and ``missing``
- ``flowserve_components.routing:ConfidenceRouter``: confident ``probs`` onwards, unsure requests' ``x`` to a
  stronger model

Also here: :mod:`flowserve_components.models`, a small model zoo trained locally on first use (``flowserve train``
fills the cache), and :func:`flowserve_components.digits.sample`, sample requests for ``flowserve run --sample``.
Importing this package never imports torch. The plumbing stages (``Identity``, ``Fail``, ``Sleep``) are
in the core, :mod:`flowserve.builtin`.
"""
