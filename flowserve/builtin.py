"""Built-in plumbing components for wiring, gateway and fault tests: pass-through, failing and slow stages.

They need only numpy, so they work with the core alone (the model stages are in ``flowserve_components``).
Their ports come from params, so one class fits any tensor::

    echo:
      component: flowserve.builtin:Identity
      params: {ports: {image: {datatype: UINT8, shape: [-1, 28, 28]}}}
      inputs: {image: input.image}

:func:`sample` makes requests for ``topologies/echo.yaml`` (``flowserve run echo.yaml --sample 20``).

**Emulated accelerators** hold a device for a batch's service time without burning CPU. A planner
needs stages whose service time depends on the batch size and the hardware, as a model's on a GPU
does, and a 2-core machine hosts few such models for real. :class:`Accelerator` passes its inputs
through after holding its replica's device (one batch at a time per worker) for the time the model's
latency table gives on the configured hardware kind, times a seeded random jitter; it sleeps in the
worker's offload thread, so a machine can host many "GPU" replicas and still show queueing, batching
and scaling honestly. :class:`Split` sends a seeded, fixed share of requests to a second port (a
cascade's "unsure" branch). Tables and prices: :mod:`flowserve.runtime.hardware`.

The API is two components and their params::

    classify:
      component: flowserve.builtin:Accelerator
      params: {model: resnet50, hardware: gpu-small, ports: {x: {datatype: FP32, shape: [-1, 4]}}}
      inputs: {x: pre.x}

``topologies/image-processing.yaml`` and ``topologies/cascade-emulated.yaml`` are built from them;
:func:`emulated_sample` makes their requests.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from typing import ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from flowserve.component import Batch, Component, Port, Result
from flowserve.errors import ComponentError, FlowserveError
from flowserve.runtime import hardware as hw
from flowserve.topology.spec import ID_PATTERN
from flowserve.wire.tensors import DATATYPES


class PortParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    datatype: str
    shape: list[int] = Field(default_factory=lambda: [-1])
    allow_nan: bool = True

    def port(self) -> Port:
        return Port(self.datatype, self.shape, self.allow_nan)


class IdentityParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ports: dict[str, PortParams] = Field(
        default_factory=lambda: {"x": PortParams(datatype="FP32", shape=[-1])},
        description="port name -> {datatype, shape}; each is both an input and an output",
    )

    @field_validator("ports")
    @classmethod
    def _valid_ports(cls, ports: dict[str, PortParams]) -> dict[str, PortParams]:
        if not ports:
            raise ValueError("declare at least one port")
        for name, spec in ports.items():
            if not re.match(ID_PATTERN, name):  # port names end up in topic names
                raise ValueError(f"port name '{name}' must match {ID_PATTERN}")
            try:
                spec.port()
            except ComponentError as exc:
                raise ValueError(f"port '{name}': {exc}") from None
        return ports


class _PassThrough(Component):
    """A component whose ports, declared in params, are each both an input and an output."""

    Params: ClassVar[type[BaseModel]] = IdentityParams

    params: IdentityParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        ports = {name: spec.port() for name, spec in self.params.ports.items()}
        # Instance attributes shadow the class-level declarations; the graph reads them from the instance.
        self.inputs = ports  # type: ignore[misc]
        self.outputs = dict(ports)  # type: ignore[misc]


class Identity(_PassThrough):
    """Emit every input unchanged (the very same arrays) on the output port of the same name."""

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        return dict(batch)


class FailParams(IdentityParams):
    port: str = Field("x", description="the port whose values are compared with 'value'")
    value: float | str = Field(-1.0, description="a row holding this value fails (str matches BYTES)")
    mode: Literal["item", "raise"] = Field(
        "item", description="item: fail only the matching requests; raise: fail the whole batch"
    )

    @model_validator(mode="after")
    def _port_exists(self) -> FailParams:
        if self.port not in self.ports:
            raise ValueError(f"port '{self.port}' is not one of the declared ports ({', '.join(self.ports)})")
        return self


class Fail(_PassThrough):
    """Pass rows through, except that a row holding ``value`` on ``port`` fails its request.

    ``mode: raise`` raises instead, as a component crashing on a poison record would.
    """

    Params: ClassVar[type[BaseModel]] = FailParams

    params: FailParams

    def _hits(self, values: np.ndarray) -> np.ndarray:
        value = self.params.value
        if values.dtype.kind in "OSU":
            target: object = str(value).encode() if values.dtype == object else str(value)
        elif isinstance(value, str):
            return np.zeros(len(values), dtype=bool)  # text never matches a number
        else:
            target = value
        return np.asarray(np.asarray(values == target).reshape(len(values), -1).any(axis=1))

    def process(self, batch: Batch) -> Result:
        bad = np.flatnonzero(self._hits(batch[self.params.port]))
        if len(bad) and self.params.mode == "raise":
            raise RuntimeError(f"Fail: {len(bad)} row(s) hold {self.params.value!r} on '{self.params.port}'")
        errors = {int(i): f"row {int(i)} holds {self.params.value!r} on '{self.params.port}'" for i in bad}
        return Result(outputs=dict(batch), errors=errors)


class SleepParams(IdentityParams):
    ms: float = Field(10.0, ge=0, le=600_000, description="sleep per process() call")
    per_item_ms: float = Field(0.0, ge=0, le=60_000, description="extra sleep per row in the batch")


class Sleep(_PassThrough):
    """Pass inputs through after sleeping ``ms + per_item_ms * rows``: a stand-in for a slow model."""

    Params: ClassVar[type[BaseModel]] = SleepParams
    #: Sleep in a thread, as a real model would compute, so the worker keeps fetching meanwhile.
    offload: ClassVar[bool] = True

    params: SleepParams

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        time.sleep((self.params.ms + self.params.per_item_ms * batch.rows) / 1000.0)
        return dict(batch)


class StallParams(IdentityParams):
    """Which requests a :class:`Stall` never answers."""

    share: float = Field(0.0, ge=0, le=1, description="share of requests that stall (picked by request id hash)")
    port: str | None = Field(None, description="also stall the requests holding 'value' on this port")
    value: float = Field(-1.0, description="with 'port': a row holding this value stalls its request")


class Stall(_PassThrough):
    """Pass inputs through, except that some requests never get an answer: a member stalled past any
    deadline (an ensemble's straggler). Which ones: a seeded ``share`` by request id, and with ``port``
    those whose row holds ``value``. Their rows are masked out, so nothing is written for them.
    """

    Params: ClassVar[type[BaseModel]] = StallParams

    params: StallParams

    def process(self, batch: Batch) -> Result:
        stalled = np.array([_unit(rid) < self.params.share for rid in batch.request_ids], dtype=bool)
        port = self.params.port
        if port is not None and port in batch and batch.rows:
            hits = (batch[port].reshape(batch.rows, -1) == self.params.value).any(axis=1)
            stalled |= np.maximum.reduceat(hits, batch.starts()).astype(bool)  # the whole request stalls
        rows = np.repeat(stalled, batch.sizes)
        return Result(outputs=dict(batch), mask={name: ~rows for name in self.outputs})


def sample(n: int, seed: int = 0) -> tuple[list[dict[str, np.ndarray]], list[None]]:
    """``n`` requests holding one ``[1, 3]`` tensor of every V2 datatype, on ports named ``t_<datatype>``.

    The ports of ``topologies/echo.yaml``; there is nothing to predict, so every label is ``None``.

    >>> requests, labels = sample(2)
    >>> requests[0]["t_fp32"].shape, requests[0]["t_bytes"].dtype, labels
    ((1, 3), dtype('O'), [None, None])
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, not {n}")
    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(n):
        values = rng.integers(0, 100, size=(1, 3))
        requests.append({
            f"t_{name.lower()}": (np.array([[str(v).encode() for v in values[0]]], dtype=object)
                                  if name == "BYTES" else values.astype(dtype))
            for name, dtype in DATATYPES.items()
        })
    return requests, [None] * n


# -- emulated accelerators -------------------------------------------------------------------------

_DEFAULT_PORTS = {"x": PortParams(datatype="FP32", shape=[-1, 4])}


class AcceleratorParams(IdentityParams):
    ports: dict[str, PortParams] = Field(default_factory=lambda: dict(_DEFAULT_PORTS),
                                         description="port name -> {datatype, shape}; passed through")
    model: str = Field(description="a model of flowserve.runtime.hardware.MODELS")
    hardware: str = Field("gpu-small", description="hardware kind (cpu, gpu-small, gpu-large)")
    #: coefficient of variation of the multiplicative jitter on each batch's service time.
    jitter: float = Field(0.05, ge=0, le=1)
    seed: int = Field(0, description="jitter seed (mixed with the node id and process id)")

    @model_validator(mode="after")
    def _known(self) -> AcceleratorParams:
        try:
            hw.batch_seconds(self.model, self.hardware, 1)
        except FlowserveError as exc:  # its message names the models and kinds there are
            raise ValueError(str(exc)) from None
        return self


class Accelerator(_PassThrough):
    """Pass rows through after holding the emulated device for ``table(rows) * jitter`` seconds."""

    Params: ClassVar[type[BaseModel]] = AcceleratorParams
    offload: ClassVar[bool] = True
    hardware_param: ClassVar[str | None] = "hardware"
    #: a GPU's batches beyond 64 gain nothing in these tables; keep queues short.
    max_batch: ClassVar[int] = 64

    params: AcceleratorParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        self._device = threading.Lock()  # one batch in flight per replica, as on a GPU
        self._rng = np.random.default_rng(self.params.seed)

    def setup(self) -> None:
        # Each worker process jitters differently, reproducibly for a given node and seed.
        digest = hashlib.blake2b(f"{self.node}:{threading.get_native_id()}".encode(), digest_size=8).digest()
        self._rng = np.random.default_rng([self.params.seed, int.from_bytes(digest, "big")])

    def service_seconds(self, rows: int) -> float:
        """One draw of the service time of a batch of ``rows`` (mean: the table's figure)."""
        mean = hw.batch_seconds(self.params.model, self.params.hardware, rows)
        cv = self.params.jitter
        if cv <= 0:
            return mean
        shape = 1.0 / (cv * cv)  # gamma with mean 1 and the given CV: positive, right-skewed like real runs
        return mean * float(self._rng.gamma(shape, 1.0 / shape))

    def latency_table(self, hardware: str | None = None) -> dict[int, float] | None:
        kind = hardware or self.params.hardware
        if kind not in hw.MODELS[self.params.model]:
            return None
        return hw.latency_table(self.params.model, kind)

    def process(self, batch: Batch) -> dict[str, np.ndarray]:
        seconds = self.service_seconds(max(1, batch.rows))
        with self._device:
            time.sleep(seconds)
        return dict(batch)


class SplitParams(IdentityParams):
    ports: dict[str, PortParams] = Field(default_factory=lambda: dict(_DEFAULT_PORTS))
    #: share of requests sent to the ``unsure_<port>`` outputs; the rest go to ``sure_<port>``.
    unsure: float = Field(0.3, ge=0, le=1)


class Split(_PassThrough):
    """Route each request to ``sure_<port>`` or ``unsure_<port>``, a share ``unsure`` of them to the latter.

    The choice hashes the request id, so it is the same on every replica and every redelivery.
    """

    Params: ClassVar[type[BaseModel]] = SplitParams

    params: SplitParams

    def __init__(self, params: BaseModel | None = None, *, node: str = "") -> None:
        super().__init__(params, node=node)
        ports = dict(self.inputs)
        self.outputs = {f"{side}_{name}": port for name, port in ports.items()  # type: ignore[misc]
                        for side in ("sure", "unsure")}

    def route_fractions(self) -> dict[str, float]:
        u = self.params.unsure
        return {f"{side}_{name}": (u if side == "unsure" else 1.0 - u)
                for name in self.inputs for side in ("sure", "unsure")}

    def process(self, batch: Batch) -> Result:
        unsure_req = np.array([_unit(rid) < self.params.unsure for rid in batch.request_ids], dtype=bool)
        rows = np.repeat(unsure_req, batch.sizes)
        outputs, mask = {}, {}
        for name in self.inputs:
            outputs[f"sure_{name}"] = outputs[f"unsure_{name}"] = batch[name]
            mask[f"sure_{name}"], mask[f"unsure_{name}"] = ~rows, rows
        return Result(outputs=outputs, mask=mask)


def _unit(request_id: str) -> float:
    """A request id hashed onto [0, 1)."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def emulated_sample(n: int, seed: int = 0) -> tuple[list[dict[str, np.ndarray]], list[None]]:
    """``n`` requests of one ``[1, 4]`` FP32 tensor ``x`` (what the emulated topologies take).

    >>> requests, labels = emulated_sample(2)
    >>> requests[0]["x"].shape, labels
    ((1, 4), [None, None])
    """
    rng = np.random.default_rng(seed)
    return [{"x": rng.random((1, 4), dtype=np.float32)} for _ in range(n)], [None] * n
