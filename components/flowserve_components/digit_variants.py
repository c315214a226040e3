"""Many variants of the digits MLP in the version registry: what a real many-model node serves.

Variant ``i`` is the zoo's ``digits-mlp`` (:mod:`flowserve_components.models`, trained once and cached)
fine-tuned briefly on the train split shifted by one of the nine one-pixel moves (:data:`SHIFTS`, ``i``
mod 9) with its own seed (``i``), as if each customer's scanner were a pixel off. Each is registered as
version ``v1`` of registry node ``<prefix><i:05d>`` under registry topology ``digit-variants``
(:class:`flowserve.learning.Registry`: ``$FLOWSERVE_CACHE/models/digit-variants/dv-00042/v1/weights.bin``)
and promoted, so :class:`flowserve_components.torch_models.TorchModels` loads it by the model's name.
Ten fine-tuning steps each: 100 variants take about 3 s on two busy cores, from data scikit-learn ships::

    python -m flowserve_components.digit_variants --count 100     # idempotent: registered ones are kept

:func:`outputs` runs variants alone, in-process: the reference a served answer must equal.
torch is imported inside the functions only.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from flowserve.errors import ComponentError
from flowserve.learning.registry import BASE, Registry

if TYPE_CHECKING:
    import torch

#: the registry topology the variants are registered under (a registry name, not a running topology)
REGISTRY = "digit-variants"
PREFIX = "dv-"
ARCH = "digits-mlp"
#: (dx, dy) of variant i mod 9: every one-pixel move and none
SHIFTS: tuple[tuple[int, int], ...] = tuple((dx, dy) for dy in (-1, 0, 1) for dx in (-1, 0, 1))
#: examples each variant is fine-tuned on (one epoch, batches of 32: ten steps)
EXAMPLES = 320
LR = 1e-2


def shift(pixels: np.ndarray, dx: int, dy: int) -> np.ndarray:
    """8x8 images (rows of 64) moved ``dx`` right and ``dy`` down, zeros shifted in."""
    images = np.asarray(pixels).reshape(-1, 8, 8)
    out = np.zeros_like(images)
    out[:, max(dy, 0):8 + min(dy, 0), max(dx, 0):8 + min(dx, 0)] = \
        images[:, max(-dy, 0):8 + min(-dy, 0), max(-dx, 0):8 + min(-dx, 0)]
    return out.reshape(-1, 64)


def name_of(i: int, prefix: str = PREFIX) -> str:
    return f"{prefix}{i:05d}"


@dataclass(frozen=True, slots=True)
class Produced:
    """What :func:`produce` did: the variants' names, how many it trained now, and how long that took."""

    names: list[str]
    trained: int
    seconds: float


def produce(count: int = 100, *, prefix: str = PREFIX, registry: str = REGISTRY, force: bool = False,
            quiet: bool = True) -> Produced:
    """Register and promote ``count`` fine-tuned variants (see the module's doc); a variant already promoted
    is kept unless ``force``."""
    import torch

    from flowserve_components.digits import PIXEL_MAX, load_split
    from flowserve_components.models import fine_tune, load

    started = time.perf_counter()
    names = [name_of(i, prefix) for i in range(count)]
    todo = [i for i, name in enumerate(names) if force or Registry(registry, name).live() == BASE]
    if todo:
        base = load(ARCH, "cpu")  # trained on first use, cached
        x, y = load_split("train")
        labels = torch.from_numpy(np.array(y))
        threads = torch.get_num_threads()
        # one thread: ops this small only wait on each other across threads (4x slower on 2 busy cores)
        torch.set_num_threads(1)
        try:
            for i in todo:
                dx, dy = SHIFTS[i % len(SHIFTS)]
                moved = torch.from_numpy(shift(x, dx, dy) / np.float32(PIXEL_MAX))
                pick = torch.randperm(len(moved), generator=torch.Generator().manual_seed(i))[:EXAMPLES]
                weights, metrics = fine_tune(base, moved[pick], labels[pick], epochs=1, lr=LR, seed=i)
                reg = Registry(registry, names[i])
                manifest = reg.register(weights, parent=BASE, training_size=len(pick),
                                        metrics={**metrics, "dx": float(dx), "dy": float(dy)})
                reg.promote(manifest.version)
        finally:
            torch.set_num_threads(threads)
    seconds = time.perf_counter() - started
    if not quiet:
        print(f"{count} variants under registry '{registry}' ({prefix}00000 ...): {len(todo)} trained now "
              f"in {seconds:.1f}s")
    return Produced(names, len(todo), seconds)


def weights(name: str, registry: str = REGISTRY) -> bytes:
    """The promoted (else newest) weights of variant ``name``, checked against their manifest's hash."""
    reg = Registry(registry, name)
    version = reg.live()
    if version == BASE:
        versions = reg.versions()
        if not versions:
            raise ComponentError(f"registry '{registry}' has no model '{name}' (python -m "
                                 "flowserve_components.digit_variants registers the digits variants)")
        version = versions[-1].version
    return reg.weights(version)


def module(name: str, registry: str = REGISTRY, kind: str = ARCH, device: str = "cpu") -> torch.nn.Module:
    """Variant ``name`` built as zoo architecture ``kind`` from its registered weights (read with
    ``weights_only=True``: plain tensors or nothing), in eval mode on ``device``."""
    from flowserve_components.models import load_state

    return load_state(kind, weights(name, registry), device)


def outputs(names: Sequence[str], x: np.ndarray, registry: str = REGISTRY, *, alone: bool = True
            ) -> dict[str, np.ndarray]:
    """Each variant's logits on ``x`` (float32 [n, 64], pixels / 16) on the CPU. ``alone``: one row at a
    time (a request of one row is a batch of one), the reference a served answer is checked against;
    else all rows as one batch."""
    import torch

    out = {}
    with torch.inference_mode():
        tensor = torch.from_numpy(np.ascontiguousarray(x, np.float32))
        for name in names:
            model = module(name, registry)
            out[name] = (np.concatenate([model(tensor[i:i + 1]).numpy() for i in range(len(tensor))]) if alone
                         else model(tensor).numpy())
    return out


def size_bytes(name: str, registry: str = REGISTRY) -> int:
    """Bytes of variant ``name``'s parameters (what a load puts in device memory)."""
    return sum(p.numel() * p.element_size() for p in module(name, registry).parameters())


def measure(name: str, registry: str = REGISTRY, sizes: Sequence[int] = (1, 8, 32), repeat: int = 50,
            device: str = "cpu") -> dict[str, float]:
    """Measured on this machine: one load's mean ms (read, check, deserialise, build, move) and each batch
    size's mean ms, for a node's ``models:`` (``load_ms``, ``latency_ms``)."""
    import torch

    t = time.perf_counter()
    for _ in range(repeat):
        model = module(name, registry, device=device)
    out = {"load_ms": (time.perf_counter() - t) / repeat * 1000}
    with torch.inference_mode():
        for n in sizes:
            x = torch.zeros(n, 64, device=device)
            model(x)
            t = time.perf_counter()
            for _ in range(repeat):
                model(x).cpu()
            out[f"batch_{n}_ms"] = (time.perf_counter() - t) / repeat * 1000
    out["size_mb"] = size_bytes(name, registry) / 1e6
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m flowserve_components.digit_variants", description=__doc__)
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--prefix", default=PREFIX)
    p.add_argument("--registry", default=REGISTRY)
    p.add_argument("--force", action="store_true", help="train and register them again")
    p.add_argument("--measure", action="store_true", help="also print the first variant's load and batch times")
    args = p.parse_args(argv)
    produce(args.count, prefix=args.prefix, registry=args.registry, force=args.force, quiet=False)
    if args.measure:
        print({k: round(v, 4) for k, v in measure(name_of(0, args.prefix), args.registry).items()})


if __name__ == "__main__":
    main()
