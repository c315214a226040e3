"""Admission of a parsed V2 request: its tensors must fit the topology's input ports exactly.

Checked in the gateway before anything is produced, so a caller's mistake is a 400 naming the input,
not an error result from deep inside the pipeline. (Parsing itself is :mod:`flowserve.wire.v2`.)
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from flowserve.component import Port
from flowserve.errors import WireError
from flowserve.wire.tensors import datatype_of


def check_inputs(tensors: Mapping[str, np.ndarray], ports: Mapping[str, Port]) -> None:
    """Raise :class:`WireError` naming the input unless ``tensors`` match ``ports`` exactly."""
    for name in tensors:
        if name not in ports:
            raise WireError(f"input '{name}' is not an input of this model (inputs: {', '.join(ports)})")
    for name, port in ports.items():
        array = tensors.get(name)
        if array is None:
            raise WireError(f"input '{name}' is missing ({port.datatype} {list(port.shape)})")
        datatype = datatype_of(array)
        if datatype != port.datatype:
            raise WireError(f"input '{name}': datatype {datatype} does not match the model's {port.datatype}")
        if array.ndim != len(port.shape) or any(w != -1 and g != w for g, w in zip(array.shape, port.shape,
                                                                                        strict=True)):
            raise WireError(f"input '{name}': shape {list(array.shape)} does not fit the model's "
                            f"{list(port.shape)} (-1 = any size)")
        if not port.allow_nan and array.dtype.kind == "f" and not np.isfinite(array).all():
            raise WireError(f"input '{name}' does not accept NaN or infinite values")
    rows = {a.shape[0] for a in tensors.values() if a.ndim}
    if len(rows) > 1:
        raise WireError(f"inputs disagree on the batch dimension ({', '.join(map(str, sorted(rows)))} rows)")
