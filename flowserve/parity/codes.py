"""Parity encoders: how the inputs of a group's k requests become one parity query (ParM, section 4).

- ``sum``: the query is the sum of the k inputs. General (any fixed-shape floating-point input), and what
  the parity model learns to map to the sum of the k outputs.
- ``concat``: for images. The k inputs are shrunk by averaging pixel blocks and laid out row by row in a
  grid of ``ceil(k / c)`` x ``c`` tiles (``c = ceil(sqrt(k))``; empty slots are zero), so the query has the
  size of one input: k = 2 puts two half-width images side by side. The parity model sees each member's
  picture, smaller, rather than a superposition of them.

The decoder is the same for both: the missing output is the parity output minus the outputs present.
Training (``flowserve parity train``) encodes with the same function, so serving and training agree.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from flowserve.topology.parity import concat_layout

Encoding = Literal["sum", "concat"]


def encode(encoding: Encoding, stacked: np.ndarray, *, image: tuple[int, int] | None = None) -> np.ndarray:
    """The parity query of k members: ``stacked`` is ``[rows, k, *features]`` (member j's rows at ``[:, j]``),
    the result ``[rows, *features]`` in ``stacked``'s dtype. Arithmetic is in float64, so the query does
    not depend on the members' rounding order."""
    wide = stacked.astype(np.float64)
    if encoding == "sum":
        return wide.sum(axis=1).astype(stacked.dtype)
    rows, k, *features = stacked.shape
    size = math.prod(features)
    layout = concat_layout(k, size, image)
    gr, gc, c, h, w = layout.rows, layout.cols, layout.channels, layout.height, layout.width
    th, tw = h // gr, w // gc
    # [rows, k, c, th, gr, tw, gc] -> average each gr x gc block -> [rows, k, c, th, tw]
    tiles = wide.reshape(rows, k, c, th, gr, tw, gc).mean(axis=(4, 6))
    slots = np.zeros((rows, gr * gc, c, th, tw))
    slots[:, :k] = tiles
    # slot s sits at grid row s // gc, column s % gc: [rows, gr, gc, c, th, tw] -> [rows, c, gr, th, gc, tw]
    canvas = slots.reshape(rows, gr, gc, c, th, tw).transpose(0, 3, 1, 4, 2, 5)
    return canvas.reshape(rows, *features).astype(stacked.dtype)
