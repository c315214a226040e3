"""Hardware kinds (price per hour) and the latency-per-batch-size tables of the emulated models.

These tables drive :mod:`flowserve.emulated` (a stage that holds an emulated device for a batch's
service time) and the planner's choices (:mod:`flowserve.tuning.plan`). They are **emulation figures**,
not measurements made here: each model's batch time is ``fixed_ms + per_item_ms * n``, with the two
coefficients chosen to fall in the range the public sources below report for that class of model and
device. Replace them with measured tables (``flowserve profile``) where you have the hardware.

Sources:

- Prices: AWS EC2 on-demand, us-east-1, Linux (aws.amazon.com/ec2/pricing/on-demand):
  c5.xlarge (4 vCPU) $0.17/h; g4dn.xlarge (one NVIDIA T4) $0.526/h; p3.2xlarge (one V100) $3.06/h.
- GPU batch times: NVIDIA "Data Center Deep Learning Product Performance" inference tables
  (developer.nvidia.com/deep-learning-performance-training-inference) and MLPerf Inference
  (mlcommons.org) for ResNet-50 / BERT on T4 and V100, scaled up for framework (not TensorRT) serving
  as in InferLine's profiles (Crankshaw et al., SoCC 2020, fig. 2).
- CPU batch times: Intel OpenVINO benchmark results for ResNet-50 / BERT-base on Xeon (4 cores).

>>> round(batch_seconds("resnet50", "gpu-small", 8) * 1000, 1)
10.4
"""

from __future__ import annotations

from dataclasses import dataclass

from flowserve.errors import FlowserveError


@dataclass(frozen=True, slots=True)
class Hardware:
    """A kind of device a stage's replica runs on, and what one replica of it costs."""

    name: str
    price_per_hour: float
    describe: str


#: The built-in hardware kinds, cheapest first.
HARDWARE: dict[str, Hardware] = {
    "cpu": Hardware("cpu", 0.17, "4 vCPU Xeon (AWS c5.xlarge)"),
    "gpu-small": Hardware("gpu-small", 0.526, "NVIDIA T4 (AWS g4dn.xlarge)"),
    "gpu-large": Hardware("gpu-large", 3.06, "NVIDIA V100 (AWS p3.2xlarge)"),
}

#: model -> hardware -> (fixed ms per batch, ms per item). A model absent on a kind cannot run there.
MODELS: dict[str, dict[str, tuple[float, float]]] = {
    "preprocess": {"cpu": (0.5, 0.3)},
    "alexnet": {"cpu": (4.0, 2.5), "gpu-small": (1.5, 0.15), "gpu-large": (1.0, 0.06)},
    "resnet50": {"cpu": (20.0, 12.0), "gpu-small": (4.0, 0.8), "gpu-large": (2.5, 0.3)},
    "resnet152": {"cpu": (50.0, 30.0), "gpu-small": (9.0, 2.0), "gpu-large": (5.0, 0.7)},
    "yolo": {"cpu": (60.0, 40.0), "gpu-small": (10.0, 3.0), "gpu-large": (6.0, 1.0)},
    "lang-id": {"cpu": (1.0, 0.2), "gpu-small": (1.0, 0.05)},
    "nmt": {"cpu": (80.0, 40.0), "gpu-small": (25.0, 4.0), "gpu-large": (15.0, 1.5)},
    "sentiment": {"cpu": (15.0, 10.0), "gpu-small": (4.0, 0.6), "gpu-large": (2.5, 0.25)},
}

#: Batch sizes a table lists (between them, times are linear).
TABLE_SIZES = (1, 2, 4, 8, 16, 32, 64)


def hardware(name: str) -> Hardware:
    try:
        return HARDWARE[name]
    except KeyError:
        raise FlowserveError(f"unknown hardware kind '{name}' (kinds: {', '.join(HARDWARE)})") from None


def kinds_for(model: str) -> list[str]:
    """Hardware kinds ``model`` runs on, cheapest first."""
    coeffs = _model(model)
    return sorted(coeffs, key=lambda k: HARDWARE[k].price_per_hour)


def batch_seconds(model: str, kind: str, n: int) -> float:
    """Mean service time of a batch of ``n`` on one device of ``kind``."""
    fixed, per_item = _coeffs(model, kind)
    return (fixed + per_item * n) / 1000.0


def latency_table(model: str, kind: str) -> dict[int, float]:
    """Batch size -> seconds, at :data:`TABLE_SIZES`."""
    return {n: batch_seconds(model, kind, n) for n in TABLE_SIZES}


def _model(model: str) -> dict[str, tuple[float, float]]:
    try:
        return MODELS[model]
    except KeyError:
        raise FlowserveError(f"unknown emulated model '{model}' (models: {', '.join(MODELS)})") from None


def _coeffs(model: str, kind: str) -> tuple[float, float]:
    coeffs = _model(model)
    if kind not in coeffs:
        raise FlowserveError(f"emulated model '{model}' has no table for hardware '{kind}' "
                             f"(it runs on: {', '.join(coeffs)})")
    return coeffs[kind]
