"""Columnar decoding of a fetched batch: one ``frombuffer`` for many records instead of one per record.

A stage's input records usually share one frame layout (same tensor, datatype and shape; only the bytes
of the payload differ). When they do, the payloads are joined and decoded once, and each request's
tensor is a row-slice view of that array. Anything unusual falls back to the per-record path.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from flowserve.errors import WireError
from flowserve.wire.tensors import decode_tensors


def decode_column(values: Sequence[bytes]) -> tuple[str, np.ndarray, int] | None:
    """``(tensor name, stacked array, rows per record)`` when every value is a single-tensor frame of one
    fixed-width layout; None otherwise (the caller then decodes record by record)."""
    if not values:
        return None
    first = values[0]
    if type(first) is not bytes:
        return None
    try:
        decoded = decode_tensors(first)
    except WireError:
        return None
    if len(decoded) != 1:
        return None
    ((name, array),) = decoded.items()
    # BOOL payloads are value-checked per frame; BYTES are variable length.
    if array.dtype.kind in "Ob" or array.ndim == 0:
        return None
    size = len(first)
    hlen = size - array.nbytes
    head = first[:hlen]
    for v in values:
        if type(v) is not bytes or len(v) != size or not v.startswith(head):
            return None
    rows = array.shape[0]
    payload = b"".join([v[hlen:] for v in values])
    stacked = np.frombuffer(payload, dtype=array.dtype).reshape((len(values) * rows, *array.shape[1:]))
    return name, stacked, rows
