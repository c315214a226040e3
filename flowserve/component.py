"""The component contract: declared ports, typed parameters, a lifecycle, a vectorised ``process``.

A component is written once and wired into any number of topologies::

    from flowserve import Component, Port

    class Normalize(Component):
        inputs = {"pixels": Port("FP32", [-1, 64])}
        outputs = {"x": Port("FP32", [-1, 64])}

        def process(self, batch):
            return {"x": batch["pixels"] / 16.0}

``process`` sees the tensors of many requests concatenated along the leading dimension and returns
arrays with the same leading dimension. It may return a :class:`Result` to emit on only some ports for
some items (conditional routing) or to fail single items without failing the batch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar, TypeVar, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from flowserve.errors import ComponentError, ErrorKind, WireError
from flowserve.wire.tensors import DATATYPES

C = TypeVar("C")


@dataclass(frozen=True, slots=True)
class Port:
    """A tensor port: V2 datatype and shape (-1 for a variable dimension; the first is the batch).

    ``allow_nan=False``: floating-point values must be finite (no NaN, no infinity; a JSON number too large
    for the datatype, such as ``1e400``, arrives as infinity).
    """

    datatype: str
    shape: tuple[int, ...] | list[int] = (-1,)
    allow_nan: bool = True
    doc: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.datatype not in DATATYPES:
            raise ComponentError(f"port datatype {self.datatype!r} is not one of {', '.join(DATATYPES)}")
        object.__setattr__(self, "shape", tuple(self.shape))
        if not self.shape or any(not isinstance(d, int) or d < -1 for d in self.shape):
            raise ComponentError(f"port shape {list(self.shape)} must be a non-empty list of ints >= -1")

    def compatible(self, other: Port) -> str | None:
        """Why a tensor of this port cannot feed ``other``, or None when it can."""
        if self.datatype != other.datatype:
            return f"datatype {self.datatype} does not match {other.datatype}"
        if len(self.shape) != len(other.shape):
            return f"shape {list(self.shape)} has rank {len(self.shape)}, expected {list(other.shape)}"
        for a, b in zip(self.shape, other.shape, strict=True):
            if a != -1 and b != -1 and a != b:
                return f"shape {list(self.shape)} does not fit {list(other.shape)}"
        return None

    def check(self, name: str, array: np.ndarray) -> None:
        """Raise :class:`WireError` unless ``array`` fits this port."""
        expected = DATATYPES[self.datatype]
        actual_kind_ok = array.dtype == expected or (self.datatype == "BYTES" and array.dtype.kind in "OSU")
        if not actual_kind_ok:
            raise WireError(f"port '{name}' takes {self.datatype}, got {array.dtype.name}")
        if array.ndim != len(self.shape):
            raise WireError(f"port '{name}' takes shape {list(self.shape)}, got {list(array.shape)}")
        for got, want in zip(array.shape, self.shape, strict=True):
            if want != -1 and got != want:
                raise WireError(f"port '{name}' takes shape {list(self.shape)}, got {list(array.shape)}")
        if not self.allow_nan and array.dtype.kind == "f" and not np.isfinite(array).all():
            raise WireError(f"port '{name}' does not accept NaN or infinite values")

    def to_metadata(self, name: str) -> dict[str, Any]:
        return {"name": name, "datatype": self.datatype, "shape": list(self.shape)}


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(slots=True)
class Result:
    """What ``process`` returns when not every item goes to every port.

    ``outputs``: arrays by port, leading dimension = items in the batch.
    ``mask``: per port, a boolean array saying which items are emitted there (absent = all).
    ``errors``: item index -> reason; the request holding that item fails, the rest of the batch goes on.
    """

    outputs: dict[str, np.ndarray]
    mask: dict[str, np.ndarray] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)


class Batch(Mapping[str, np.ndarray]):
    """The tensors of several requests, concatenated along axis 0, with each request's row count.

    ``request_ids`` and ``headers`` have one entry per request (``headers``: its Kafka headers, names
    lower-case as written by flowserve and callers' ``X-`` headers; empty where the host has none).
    ``masks`` flags, per input port, the rows whose input is present; a port without one is present on
    every row. Only a node behind a ``deadline`` join gets absent rows (zero-filled), and only when its
    component declares ``accepts_absent``.
    """

    __slots__ = ("_masks", "_tensors", "headers", "request_ids", "sizes")

    def __init__(self, tensors: dict[str, np.ndarray], sizes: list[int], request_ids: list[str],
                 headers: Sequence[Mapping[str, bytes]] = (), masks: Mapping[str, np.ndarray] | None = None
                 ) -> None:
        self._tensors = tensors
        self.sizes = sizes
        self.request_ids = request_ids
        self.headers = headers
        self._masks = masks or {}

    def present(self, port: str) -> np.ndarray:
        """Per row, whether input ``port`` arrived (False: the row holds zeros in its place).

        >>> b = Batch({"a": np.zeros((2, 1))}, [1, 1], ["r0", "r1"], masks={"a": np.array([True, False])})
        >>> b.present("a").tolist(), b.present("b").tolist()
        ([True, False], [True, True])
        """
        mask = self._masks.get(port)
        return mask if mask is not None else np.ones(self.rows, dtype=bool)

    def __getitem__(self, key: str) -> np.ndarray:
        return self._tensors[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    @property
    def rows(self) -> int:
        """Total rows in the batch (the leading dimension of every tensor)."""
        return sum(self.sizes)

    def starts(self) -> np.ndarray:
        """Row index where each request begins; handy with ``np.minimum.reduceat``."""
        return np.cumsum([0, *self.sizes], dtype=np.intp)[:-1]

    def header(self, name: str) -> list[bytes | None]:
        """Per request, the value of header ``name`` (None where a request has none).

        >>> Batch({}, [1, 1], ["a", "b"], [{"x-user": b"ann"}, {}]).header("x-user")
        [b'ann', None]
        """
        if not self.headers:
            return [None] * len(self.sizes)
        return [h.get(name) for h in self.headers]


class Component:
    """Base class of every component. Subclasses declare ``inputs``, ``outputs`` and ``Params``.

    The base holds what every component has: ports, params, a lifecycle, ``process`` and ``describe``, and
    the flags that declare optional capabilities. The methods of a capability are a ``Protocol`` in the
    feature package that calls them, checked once where it attaches (:func:`require`).
    """

    inputs: ClassVar[dict[str, Port]] = {}
    outputs: ClassVar[dict[str, Port]] = {}
    Params: ClassVar[type[BaseModel]] = NoParams
    #: Largest batch (in requests) this component wants in one ``process`` call.
    max_batch: ClassVar[int] = 1024
    #: Run ``process`` in a thread so fetching continues meanwhile (heavy, GIL-releasing work: torch).
    offload: ClassVar[bool] = False
    #: Side reports: a component that files them (a drift detector's window results) names their topic
    #: ``<prefix>.<topology>.<side_output>`` here and implements ``flowserve.capture.FilesReports``.
    side_output: ClassVar[str | None] = None
    #: ``process`` copes with absent inputs (zero-filled rows, flagged by ``Batch.present``): what a node
    #: behind a ``deadline`` join (an ensemble's combiner) must declare.
    accepts_absent: ClassVar[bool] = False
    #: sha256 of the loaded weights, once ``setup`` has loaded them (recorded in lineage).
    weights_hash: str | None = None
    #: Continual learning (``flowserve learn``, :mod:`flowserve.learning`): the component fine-tunes itself
    #: on feedback; it must implement ``flowserve.learning.Retrainable`` (``retrain``, ``load_weights``).
    retrainable: ClassVar[bool] = False
    #: the registered version of the loaded weights (None: the weights its params name); recorded in lineage.
    model_version: str | None = None
    #: The param that picks the hardware kind a replica runs on, for a plan to set (None: not selectable).
    hardware_param: ClassVar[str | None] = None
    #: Learns from feedback (a bandit selector): it must implement ``flowserve.selection.LearnsFromFeedback``;
    #: the selection feature writes its decisions to ``<base>.<node>.decisions`` and its state to
    #: ``<base>.<node>.state``.
    learns: ClassVar[bool] = False
    #: State that spans batches (a detector's open window): it must implement
    #: ``flowserve.learning.HoldsState``, and the worker commits no input offset past the oldest request
    #: that state still needs, so a restarted worker re-reads it and rebuilds the state (the input topic is
    #: the changelog, as for joins).
    keeps_state: ClassVar[bool] = False

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        self.params = params if params is not None else self.Params()
        self.node = node
        self.device = "cpu"

    @classmethod
    def configure(cls, raw: Mapping[str, Any] | None, *, node: str = "") -> Component:
        """Validate ``raw`` parameters against ``Params`` and build the component."""
        try:
            params = cls.Params(**dict(raw or {}))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'params'}: {e['msg']}" for e in exc.errors()
            )
            raise ComponentError(f"bad params for {cls.__name__}: {problems}") from None
        try:
            return cls(params, node=node)
        except ComponentError:
            raise
        except Exception as exc:  # noqa: BLE001 - any constructor failure is a configuration error here
            raise ComponentError(f"{cls.__name__}({params!r}) failed: {exc!r}") from None

    def prepare(self) -> None:
        """Once per deployment, before workers start: e.g. train or fetch-from-cache a model."""

    def setup(self) -> None:
        """Load models and other heavy state, once per worker. Picks CUDA when present."""

    def close(self) -> None:
        """Release what ``setup`` took."""

    def process(self, batch: Batch) -> Mapping[str, np.ndarray] | Result:
        raise NotImplementedError(f"{type(self).__name__}.process")

    def describe(self) -> str:
        """A short, stable string that identifies the component and its parameters (for lineage)."""
        return f"{type(self).__module__}:{type(self).__qualname__}"


def require(component: Component, capability: Callable[..., C], feature: str, fix: str = "") -> C:
    """``component`` as ``capability``, a ``runtime_checkable`` Protocol that a feature package defines for
    the optional methods it calls (``flowserve.learning.Retrainable``, ...); checked once, where the feature
    attaches. Raises :class:`ComponentError` (kind ``invalid_topology``: the topology asks ``feature`` of a
    component that lacks it) naming the node, the class and the missing methods; ``fix`` says what to do.
    """
    # a Protocol class, typed as what calling it would give so that mypy accepts one (it is never called)
    proto = cast(type, capability)
    if isinstance(component, proto):
        return cast(C, component)
    missing = [n for n in vars(proto) if not n.startswith("_") and not callable(getattr(component, n, None))]
    raise ComponentError(f"node '{component.node}': {type(component).__name__} cannot {feature}: it lacks "
                         f"{', '.join(missing) or proto.__name__} ({proto.__module__}.{proto.__name__})"
                         + (f"; {fix}" if fix else ""), kind=ErrorKind.INVALID_TOPOLOGY)


def read_result(component: Component, result: Mapping[str, np.ndarray] | Result, rows: int, *, node: str
                ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[int, str]]:
    """``process``'s result as its host reads it: outputs on declared ports only, one row per input row, in
    the declared dtypes; masks of one flag per row; errors that name a row (others match no row: dropped).

    A worker and a fused chain read results alike, so a component behaves the same in both. Raises
    :class:`ComponentError` naming ``node`` for a result that breaks the component's declaration.
    """
    if isinstance(result, Result):
        raw, mask, errs = dict(result.outputs), dict(result.mask), dict(result.errors)
    elif isinstance(result, Mapping):
        raw, mask, errs = dict(result), {}, {}
    else:
        raise ComponentError(f"node '{node}': process returned {type(result).__name__}, expected a dict of "
                             "arrays or a Result")
    errs = {int(i): why for i, why in errs.items() if 0 <= int(i) < rows}
    outputs: dict[str, np.ndarray] = {}
    for port, array in raw.items():
        want = component.outputs.get(port)
        if want is None:
            raise ComponentError(f"node '{node}': process returned undeclared output port '{port}'")
        array = np.asarray(array)
        if array.ndim == 0 or array.shape[0] != rows:
            raise ComponentError(f"node '{node}': output '{port}' has leading dimension {array.shape[:1]}, "
                                 f"expected {rows}")
        if want.datatype != "BYTES" and array.dtype != DATATYPES[want.datatype]:
            array = array.astype(DATATYPES[want.datatype])
        outputs[port] = array
    masks = {p: np.asarray(m, dtype=bool) for p, m in mask.items()}
    for port, m in masks.items():
        if m.shape != (rows,):
            raise ComponentError(f"node '{node}': mask of '{port}' has shape {list(m.shape)}, expected [{rows}]")
    return outputs, masks, errs


def pick_device() -> str:
    """``cuda`` when torch sees a GPU, else ``cpu``. Imports torch, so only call it from ``setup``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_threads(n: int) -> None:
    """Run torch's CPU ops in the calling thread on ``n`` threads. Call it where the work runs.

    Under OpenMP, torch's thread count is per OS thread. ``setup`` runs in a helper thread, so setting it
    there leaves the thread that runs ``process`` at its default, one thread per core: each op then runs
    as a team whose idle member spins at the barrier after it, at two to four times the CPU per request.
    The call costs a fraction of a microsecond when nothing changes, so it can run every batch.
    """
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


#: The component library's import name: its own distribution (``components/`` in a checkout).
LIBRARY = "flowserve_components"


def _library_missing(exc: BaseException) -> str:
    """How to install the component library when ``exc`` is its import failing; "" for any other error."""
    if isinstance(exc, ImportError) and (exc.name or "").partition(".")[0] == LIBRARY:
        return (f"the component library ({LIBRARY}) is not installed: pip install -e ./components from a "
                "flowserve checkout, or install the flowserve-components wheel")
    return ""


def import_library(module: str) -> ModuleType:
    """Import ``module`` of the component library, for a command that needs it (``flowserve train``).

    The core never imports the library at module import time: it is a separate distribution that brings
    torch and scikit-learn. Raises :class:`ComponentError` saying how to install it when it is missing.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        fix = _library_missing(exc)
        if not fix:
            raise
        raise ComponentError(f"cannot import {module}: {fix}") from None


def load_component_class(ref: str) -> type[Component]:
    """Import ``module.path:ClassName`` and check it is a :class:`Component`."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ComponentError(f"component '{ref}' must look like 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except (ImportError, TypeError) as exc:  # TypeError: a relative name such as '.mod'
        fix = _library_missing(exc) or "check the module path and that its package is installed"
        raise ComponentError(f"cannot import module '{module_name}' for component '{ref}': {exc}; {fix}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise ComponentError(f"module '{module_name}' has no '{attr}' (component '{ref}'); check the class name")
    if not (isinstance(cls, type) and issubclass(cls, Component)):
        raise ComponentError(f"'{ref}' is not a flowserve Component subclass; name a class derived from Component")
    return cls
