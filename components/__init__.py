"""The flowserve component library: reusable stages for topologies, referenced as ``module:Class``.

- ``components.digits:Normalize``: raw 8x8 digit pixels (0..16) -> ``x`` (0..1)
- ``components.torch_stage:TorchClassifier``: a torch model (zoo name or user weights) -> ``logits``
- ``components.postprocess:ArgMax``: logits (or probs) -> ``label`` and ``probs``
- ``components.postprocess:TopK``: logits -> the ``k`` best ``indices`` and their ``scores``
- ``components.ensemble:Softmax``: logits -> ``probs``
- ``components.ensemble:Average``: the mean of two models' ``probs``
- ``components.routing:ConfidenceRouter``: confident ``probs`` onwards, unsure requests' ``x`` to a
  stronger model
- ``components.basic:Identity``: pass-through, ports declared in params
- ``components.basic:Fail``: fails the requests holding a given value (fault tests)
- ``components.basic:Sleep``: pass-through after a delay (latency tests)

Also here: :mod:`components.models`, a small model zoo trained locally on first use (``flowserve train``
fills the cache), and :func:`components.digits.sample`, sample requests for ``flowserve run --sample``.
Importing this package never imports torch.
"""
