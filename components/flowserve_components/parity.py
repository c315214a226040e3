"""Parity models for the digits zoo (ParM): trained so that f_P(encode(x_1, ..., x_k)) ~ f(x_1) + ... + f(x_k).

A parity model has the architecture of its base model. It is trained with MSE on encoded queries of k
random training inputs (their sum, or their images tiled: :mod:`flowserve.parity.codes`, the function the
serving encoder uses) against the sum of the base model's outputs on them. When one of the k real
outputs is late, the serving side decodes it as ``parity_output - sum(the other k-1 outputs)``.

The summed quantity is the base model's *logits* (what ``TorchClassifier`` emits on ``logits``), so the
decoded row is an ordinary logits row for the stages downstream::

    report = train_parity("digits-mlp", k=2)   # prints base and degraded-mode accuracy for k = 2, 3, 4
    report.path                                # beside the base weights: digits-mlp.parity-k2.pt
    train_parity("digits-mlp", k=2, encoding="concat")   # -> digits-mlp.parity-k2-concat.pt

torch is imported inside the functions only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from flowserve.parity.codes import Encoding, encode
from flowserve_components import models

if TYPE_CHECKING:
    import torch

#: epochs of parity training (random groups of the train split are drawn afresh each epoch), by encoder:
#: concat's shrunken tiles take longer to learn (digits k=2 degraded-mode accuracy 0.80 after 60, 0.89
#: after 200; sum reaches 0.96 after 60).
EPOCHS: dict[str, int] = {"sum": 60, "concat": 200}
LR = 3e-3


@dataclass
class ParityReport:
    """What :func:`train_parity` measured: held-out accuracy of the base model and of decoded outputs."""

    base: str
    k: int
    path: Path
    encoding: Encoding
    base_accuracy: float
    #: k -> accuracy of reconstructed predictions (one member missing, decoded from the parity output)
    degraded: dict[int, float] = field(default_factory=dict)


def parity_path(base: str, k: int, encoding: Encoding = "sum") -> Path:
    """Where the parity model of zoo model ``base`` for groups of ``k`` is kept: beside the base weights."""
    path = models.model_path(base)
    suffix = "" if encoding == "sum" else f"-{encoding}"
    return path.with_name(f"{base}.parity-k{k}{suffix}.pt")


def _encode(encoding: Encoding, grouped: torch.Tensor) -> torch.Tensor:
    """Parity queries of groups ``[groups, k, features]``, as the serving encoder makes them."""
    import torch

    if encoding == "sum":
        return grouped.sum(dim=1)
    return torch.from_numpy(encode(encoding, grouped.numpy()))


def _groups(n: int, k: int, generator: torch.Generator) -> torch.Tensor:
    import torch

    # Draw each group's members independently (with replacement across groups), as traffic would.
    return torch.randint(0, n, (n, k), generator=generator)


def _fit(base_name: str, base: torch.nn.Module, x: torch.Tensor, k: int, seed: int,
         epochs: int, encoding: Encoding = "sum") -> torch.nn.Module:
    import torch

    torch.manual_seed(seed)
    parity = models.build(base_name)
    with torch.inference_mode():
        outputs = base(x)
    generator = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.Adam(parity.parameters(), lr=LR)
    batch = 128
    steps = epochs * -(-len(x) // batch)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=LR, total_steps=steps)
    parity.train()
    for _ in range(epochs):
        members = _groups(len(x), k, generator)
        query = _encode(encoding, x[members])
        target = outputs[members].sum(dim=1)
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), batch):
            idx = order[start : start + batch]
            optimiser.zero_grad()
            torch.nn.functional.mse_loss(parity(query[idx]), target[idx]).backward()
            optimiser.step()
            schedule.step()
    return parity.eval()


def degraded_accuracy(base: torch.nn.Module, parity: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                      k: int, seed: int = 1, encoding: Encoding = "sum") -> float:
    """Accuracy of decoded predictions on ``x``: every member of every group taken as the missing one."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    members = torch.randperm(len(x), generator=generator)[: len(x) // k * k].reshape(-1, k)
    with torch.inference_mode():
        outputs = base(x)[members]  # [groups, k, classes]
        parity_out = parity(_encode(encoding, x[members]))  # [groups, classes]
        total = outputs.sum(dim=1)
        # decoded_j = parity - (sum of the others) = parity - total + own
        decoded = parity_out[:, None, :] - total[:, None, :] + outputs
    return float((decoded.argmax(dim=2) == y[members]).float().mean())


def train_parity(base_name: str, k: int, *, encoding: Encoding = "sum", ks: Sequence[int] = (2, 3, 4),
                 seed: int = 0, epochs: int | None = None, quiet: bool = False) -> ParityReport:
    """Train parity models of zoo model ``base_name`` for each of ``ks`` (and ``k``); save the one for ``k``.

    Prints the base model's held-out accuracy and the degraded-mode accuracy for each k.
    """
    started = time.perf_counter()
    base = models.load(base_name)
    x_train, _ = models._as_tensors("train")
    x_test, y_test = models._as_tensors("test")
    report = ParityReport(base_name, k, parity_path(base_name, k, encoding), encoding, models.accuracy(base))
    if not quiet:
        print(f"base model {base_name}: held-out accuracy {report.base_accuracy:.4f} ({encoding} encoder)")
    for each in sorted({*ks, k}):
        with models._torch_threads(1):
            parity = _fit(base_name, base, x_train, each, seed, epochs or EPOCHS[encoding], encoding)
        report.degraded[each] = degraded_accuracy(base, parity, x_test, y_test, each, encoding=encoding)
        if not quiet:
            print(f"k={each}: degraded-mode accuracy {report.degraded[each]:.4f}")
        if each == k:
            models._save_atomic(parity.state_dict(), report.path)
    if not quiet:
        print(f"saved the k={k} parity model -> {report.path} ({time.perf_counter() - started:.1f}s)")
    return report
