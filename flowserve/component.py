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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from flowserve.errors import ComponentError, WireError
from flowserve.wire.tensors import DATATYPES


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


@dataclass(frozen=True, slots=True)
class Retrained:
    """What :meth:`Component.retrain` produced: the new weights (a self-contained blob the component's
    :meth:`~Component.load_weights` reads back) and what training measured (JSON-able numbers)."""

    weights: bytes
    metrics: dict[str, float] = field(default_factory=dict)


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


@dataclass(frozen=True, slots=True)
class Joined:
    """Feedback joined to what a learning component did for that request (see ``Component.learns``).

    ``decision``: the component's own decision record, as :meth:`Component.drain_decisions` gave it;
    ``answer``: the outputs of the port the decision names as its answer (``{}`` when it names none or
    they were not found in the join window); ``truth``: the feedback's true outputs; ``context``: the
    feedback's context, else the decision's.
    """

    request_id: str
    context: str | None
    decision: Mapping[str, Any]
    answer: Mapping[str, np.ndarray]
    truth: Mapping[str, np.ndarray]


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
    """Base class of every component. Subclasses declare ``inputs``, ``outputs`` and ``Params``."""

    inputs: ClassVar[dict[str, Port]] = {}
    outputs: ClassVar[dict[str, Port]] = {}
    Params: ClassVar[type[BaseModel]] = NoParams
    #: Largest batch (in requests) this component wants in one ``process`` call.
    max_batch: ClassVar[int] = 1024
    #: Run ``process`` in a thread so fetching continues meanwhile (heavy, GIL-releasing work: torch).
    offload: ClassVar[bool] = False
    #: Side reports: a component that files them (a drift detector's window results) names their topic
    #: ``<prefix>.<topology>.<side_output>`` here and returns them from :meth:`drain_reports`.
    side_output: ClassVar[str | None] = None
    #: ``process`` copes with absent inputs (zero-filled rows, flagged by ``Batch.present``): what a node
    #: behind a ``deadline`` join (an ensemble's combiner) must declare.
    accepts_absent: ClassVar[bool] = False
    #: sha256 of the loaded weights, once ``setup`` has loaded them (recorded in lineage).
    weights_hash: str | None = None
    #: Continual learning (``flowserve learn``, :mod:`flowserve.learning`): the component fine-tunes itself
    #: on feedback (:meth:`retrain`), loads registered versions of its weights (:meth:`load_weights`) and
    #: scores its outputs against the truth (:meth:`score`). Components that set it override the three.
    retrainable: ClassVar[bool] = False
    #: the registered version of the loaded weights (None: the weights its params name); recorded in lineage.
    model_version: str | None = None

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

    #: The param that picks the hardware kind a replica runs on, for a plan to set (None: not selectable).
    hardware_param: ClassVar[str | None] = None

    def latency_table(self, hardware: str | None = None) -> dict[int, float] | None:
        """Declared seconds per batch size on ``hardware`` (None: as configured), for the planner and the
        simulator; None when the component declares none (then a measured profile is used) or cannot run
        on that hardware."""
        return None

    def route_fractions(self) -> dict[str, float]:
        """Expected share of rows emitted on each output port (a port absent here gets every row).

        A routing component declares it so that the simulator and planner see how traffic divides.
        """
        return {}

    def train_parity(self, k: int, encoding: str = "sum") -> dict[str, Any]:
        """Train this component's parity model for groups of ``k`` (ParM, ``flowserve parity train``): a model
        of the same architecture mapping the encoded k inputs (``encoding``: ``sum`` or ``concat``, see
        ``flowserve.parity.codes``) to the sum of the k outputs, saved where a ``parity:`` section can load
        it. Prints what it measured; returns it (JSON-able). Components that can, override this; the default
        says it cannot."""
        raise ComponentError(f"{type(self).__name__} cannot train a parity model; give 'parity: {{params: ...}}' "
                             "pointing at one trained elsewhere")

    #: Learns from feedback (a bandit selector). Then the selection feature (``flowserve.selection``) writes
    #: what :meth:`drain_decisions` gives to ``<base>.<node>.decisions``, joins the topology's feedback to
    #: those decisions (and to the outputs each decision names as its answer) by request id, hands the
    #: joined records to :meth:`learn`, and keeps :meth:`learned_state` in ``<base>.<node>.state``.
    learns: ClassVar[bool] = False

    def drain_decisions(self) -> list[dict[str, Any]]:
        """Decisions taken since the last call, one JSON-able dict per request: ``id`` (the request id),
        ``context`` (str or None), ``answer`` (the ``node.port`` whose output is the request's answer, or
        None) and whatever the component needs to learn from it later."""
        return []

    def answer_refs(self) -> list[str]:
        """Every ``node.port`` a decision may name as its answer (the join reads their topics)."""
        return []

    def learn(self, joined: Sequence[Joined]) -> set[str]:
        """Learn from feedback joined to this component's decisions; returns the contexts whose state changed."""
        return set()

    def learned_state(self, context: str) -> dict[str, Any]:
        """What was learned for ``context`` (JSON-able), to be restored by :meth:`restore_learned`."""
        return {}

    def restore_learned(self, context: str, state: Mapping[str, Any]) -> None:
        """Take back state that :meth:`learned_state` gave (a restarted or added worker resumes it)."""

    def retrain(self, inputs: Mapping[str, np.ndarray], targets: Mapping[str, np.ndarray]) -> Retrained:
        """New weights fine-tuned from the loaded ones (``setup`` ran; maybe a version was loaded) on
        ``inputs`` (arrays by input port, one row per example) and ``targets`` (the true outputs from
        feedback, by the topology's output names, same rows). Only for ``retrainable`` components."""
        raise ComponentError(f"{type(self).__name__} cannot retrain itself (it does not declare 'retrainable')")

    def load_weights(self, data: bytes, version: str | None = None) -> None:
        """Swap in weights that :meth:`retrain` produced (a registered ``version``), between batches; sets
        ``weights_hash`` and ``model_version``. Must refuse anything but plain weights (no pickle)."""
        raise ComponentError(f"{type(self).__name__} cannot load registered weights (it is not 'retrainable')")

    def score(self, outputs: Mapping[str, np.ndarray], targets: Mapping[str, np.ndarray]) -> np.ndarray:
        """Per row, whether this component's ``outputs`` got ``targets`` (feedback) right: a bool array.

        The default compares outputs and targets of the same name, row by row; a classifier emitting
        logits for a ``label`` target overrides it.
        """
        common = [n for n in outputs if n in targets]
        if not common:
            raise ComponentError(f"{type(self).__name__}.score: no output named like a feedback target "
                                 f"(outputs {', '.join(outputs)}; targets {', '.join(targets)})")
        rows = len(next(iter(outputs.values())))
        right = np.ones(rows, dtype=bool)
        for name in common:
            a, b = np.asarray(outputs[name]).reshape(rows, -1), np.asarray(targets[name]).reshape(rows, -1)
            right &= (a == b).all(axis=1)
        return right

    #: State that spans batches (a detector's open window): the worker then asks :meth:`oldest_held` after
    #: each batch and commits no input offset past that request, so a restarted worker re-reads what the
    #: state still needed and rebuilds it (the input topic is the changelog, as for joins).
    keeps_state: ClassVar[bool] = False

    def oldest_held(self) -> str | None:
        """The request id of the oldest request whose rows the state still needs (None: it needs none).

        Asked only when ``keeps_state`` is True. Rows whose side reports are written (see
        :meth:`drain_reports`) are no longer needed once those reports have been drained.
        """
        return None

    def drain_reports(self) -> list[dict[str, Any]]:
        """Side reports finished since the last call (JSON-able dicts; ``key`` picks their partition).

        Called by the worker's loop, also between batches, so reports that finish off the loop (in a
        detector's own thread) still leave. Only components that declare ``side_output`` are asked.
        """
        return []


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
