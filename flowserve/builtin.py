"""Built-in plumbing components for wiring, gateway and fault tests: pass-through, failing and slow stages.

They need only numpy, so they work with the core alone (the model stages are in ``flowserve_components``).
Their ports come from params, so one class fits any tensor::

    echo:
      component: flowserve.builtin:Identity
      params: {ports: {image: {datatype: UINT8, shape: [-1, 28, 28]}}}
      inputs: {image: input.image}

:func:`sample` makes requests for ``topologies/echo.yaml`` (``flowserve run echo.yaml --sample 20``).
"""

from __future__ import annotations

import re
import time
from typing import ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from flowserve.component import Batch, Component, Port, Result
from flowserve.errors import ComponentError
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
