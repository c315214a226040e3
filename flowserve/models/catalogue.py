"""The model catalogue of a many-model stage: per model its size in device memory, the time to load it, and
its batch times.

A load copies a model's weights from host memory to the device, so its time is the size over the
host-to-device bandwidth. :data:`BANDWIDTH` holds effective figures (what a pinned-memory copy reaches, not
the link's raw rate), from public sources:

- ``pcie3-x16``: PCIe 3.0 x16 carries 15.75 GB/s raw (PCI-SIG, PCIe 3.0 base specification: 8 GT/s per lane,
  128b/130b coding); pinned host-to-device copies reach about 12-13 GB/s (NVIDIA CUDA samples
  ``bandwidthTest`` on T4 and V100 hosts; NVIDIA T4 datasheet: PCIe Gen3 x16). Clockwork (Gujarati et al.,
  OSDI 2020) copies weights from host memory to its V100s over the same kind of link.
- ``pcie4-x16``: twice the lanes' rate (16 GT/s); about 25 GB/s pinned (A100 PCIe hosts, same test).

Batch times are the emulated devices' tables (:mod:`flowserve.runtime.hardware`, whose sources it cites);
sizes are each architecture's fp32 weights (parameters x 4 bytes: torchvision's model cards for AlexNet
61.1 M, ResNet-50 25.6 M and ResNet-152 60.2 M parameters; BERT-base 110 M for ``sentiment``).

>>> spec = ModelSpec.emulated("m-0001", "resnet50")
>>> round(spec.load_s * 1000, 1), round(spec.batch_s(8) * 1000, 1)
(8.2, 10.4)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from flowserve.errors import ErrorKind, FlowserveError
from flowserve.runtime import hardware as hw
from flowserve.topology.spec import ModelsSpec

#: link -> effective host-to-device bytes per second (sources above)
BANDWIDTH: dict[str, float] = {"pcie3-x16": 12.5e9, "pcie4-x16": 25.0e9}

#: architecture -> bytes of fp32 weights (parameters x 4; sources above)
WEIGHTS: dict[str, int] = {
    "alexnet": 244_400_000,
    "resnet50": 102_400_000,
    "resnet152": 240_800_000,
    "sentiment": 440_000_000,
}

#: the emulated catalogue's mix of architectures (each model's kind is drawn from it, in this proportion):
#: mostly mid-sized vision models, as in Clockwork's model zoo, some larger language models
MIX: tuple[tuple[str, float], ...] = (("resnet50", 0.5), ("alexnet", 0.2), ("resnet152", 0.2), ("sentiment", 0.1))


def _interpolate(table: dict[int, float], n: int) -> float:
    """Seconds for a batch of ``n``: linear between listed sizes, the last per-item slope beyond."""
    sizes = sorted(table)
    if n <= sizes[0]:
        return table[sizes[0]]
    for lo, hi in zip(sizes, sizes[1:], strict=False):
        if n <= hi:
            return table[lo] + (table[hi] - table[lo]) * (n - lo) / (hi - lo)
    if len(sizes) == 1:
        return table[sizes[0]] * n / sizes[0]
    lo, hi = sizes[-2], sizes[-1]
    return table[hi] + (table[hi] - table[lo]) / (hi - lo) * (n - hi)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model of a many-model stage: its size, the time to load it and its batch times (mean seconds)."""

    name: str
    size_bytes: int
    load_s: float
    #: batch size -> mean seconds of one batch on the device
    table: dict[int, float] = field(hash=False)
    #: its architecture (what a real component builds; an emulated one's figures come from it)
    kind: str = ""

    def __post_init__(self) -> None:
        if self.size_bytes <= 0 or self.load_s < 0 or not self.table or min(self.table.values()) <= 0:
            raise FlowserveError(f"model '{self.name}': needs a positive size, a load time and a latency table "
                                 "of positive seconds", kind=ErrorKind.INVALID_TOPOLOGY)

    def batch_s(self, n: int) -> float:
        """Mean seconds of a batch of ``n`` requests."""
        return _interpolate(self.table, n)

    @classmethod
    def emulated(cls, name: str, kind: str, *, hardware: str = "gpu-small", link: str = "pcie3-x16") -> ModelSpec:
        """A model of architecture ``kind`` on an emulated device (default: the T4 of ``gpu-small``)."""
        if kind not in WEIGHTS:
            raise FlowserveError(f"no weight size for emulated architecture '{kind}' (known: {', '.join(WEIGHTS)})",
                                 kind=ErrorKind.INVALID_TOPOLOGY)
        if link not in BANDWIDTH:
            raise FlowserveError(f"unknown link '{link}' (links: {', '.join(BANDWIDTH)})",
                                 kind=ErrorKind.INVALID_SETTINGS)
        size = WEIGHTS[kind]
        return cls(name, size, size / BANDWIDTH[link], hw.latency_table(kind, hardware), kind)


class Catalogue:
    """The models of a stage, by name, in a fixed order (model ``i`` of a workload is ``catalogue[i]``)."""

    def __init__(self, specs: Sequence[ModelSpec]) -> None:
        self.specs = tuple(specs)
        self.by_name = {s.name: s for s in self.specs}
        if len(self.by_name) != len(self.specs):
            dup = next(s.name for s in self.specs if sum(t.name == s.name for t in self.specs) > 1)
            raise FlowserveError(f"model '{dup}' is listed twice in the catalogue", kind=ErrorKind.INVALID_TOPOLOGY)

    def __len__(self) -> int:
        return len(self.specs)

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self.specs)

    def __getitem__(self, i: int) -> ModelSpec:
        return self.specs[i]

    def spec(self, name: str) -> ModelSpec:
        try:
            return self.by_name[name]
        except KeyError:
            raise FlowserveError(f"no model '{name}' in the catalogue ({len(self.specs)} models)",
                                 kind=ErrorKind.INVALID_INPUT) from None

    @property
    def total_bytes(self) -> int:
        return sum(s.size_bytes for s in self.specs)

    @classmethod
    def emulated(cls, count: int, *, hardware: str = "gpu-small", link: str = "pcie3-x16") -> Catalogue:
        """``count`` emulated models named ``m-00000`` ..., architectures in :data:`MIX`'s proportions,
        interleaved deterministically (model ``i`` takes the kind whose share is furthest behind)."""
        return cls([ModelSpec.emulated(f"m-{i:05d}", kind, hardware=hardware, link=link)
                    for i, kind in enumerate(mixed(count))])

    @classmethod
    def declared(cls, spec: ModelsSpec, *, node: str = "") -> Catalogue:
        """The catalogue a node's ``models:`` section declares: each model's kind (``mix``: :data:`MIX`'s
        order), its size (``size_mb``, else its kind's weights), its table (``latency_ms``, else its
        kind's table on ``hardware``) and its load time (``load_ms``, else its size over ``link``)."""
        if spec.link not in BANDWIDTH:
            raise FlowserveError(f"node '{node}': unknown link '{spec.link}' (links: {', '.join(BANDWIDTH)})",
                                 kind=ErrorKind.INVALID_TOPOLOGY)
        entries = spec.entries()
        kinds = mixed(len(entries)) if spec.kind == "mix" else [spec.kind] * len(entries)
        specs = []
        for entry, default in zip(entries, kinds, strict=True):
            kind = entry.kind or default
            size_mb = entry.size_mb or spec.size_mb
            table_ms = entry.latency_ms or spec.latency_ms
            if (size_mb is None or table_ms is None) and kind not in WEIGHTS:
                raise FlowserveError(f"node '{node}': model '{entry.name}' has kind '{kind}', which has no "
                                     f"emulated figures (kinds: {', '.join(WEIGHTS)}); give size_mb and "
                                     "latency_ms", kind=ErrorKind.INVALID_TOPOLOGY)
            size = int(size_mb * 1e6) if size_mb is not None else WEIGHTS[kind]
            table = ({n: ms / 1000 for n, ms in table_ms.items()} if table_ms is not None
                     else hw.latency_table(kind, spec.hardware))
            load_ms = entry.load_ms if entry.load_ms is not None else spec.load_ms
            load_s = load_ms / 1000 if load_ms is not None else size / BANDWIDTH[spec.link]
            specs.append(ModelSpec(entry.name, size, load_s, table, kind))
        return cls(specs)


def mixed(count: int) -> list[str]:
    """``count`` architectures in :data:`MIX`'s proportions, interleaved deterministically (model ``i``
    takes the kind whose share is furthest behind)."""
    kinds = [k for k, _ in MIX]
    shares = [w for _, w in MIX]
    taken = [0] * len(kinds)
    out = []
    for i in range(count):
        j = max(range(len(kinds)), key=lambda k: shares[k] * (i + 1) - taken[k])
        taken[j] += 1
        out.append(kinds[j])
    return out
