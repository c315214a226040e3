"""Compact binary tensor frames, safe to decode from untrusted bytes.

A frame is ``b"FST1"``, a u16 tensor count, then per tensor: u8 name length, the UTF-8 name,
u8 datatype code, u8 rank, ``rank`` little-endian i64 dimensions, u64 payload length, payload.
Fixed-width payloads are the row-major little-endian array; a BYTES payload is, per element,
a u32 length and the bytes (the layout of the V2 binary extension).

Every length is checked against the buffer before it is used, so a hostile frame can only produce
a :class:`~flowserve.errors.WireError`, never a huge allocation or an out-of-bounds read.
No pickle anywhere: object arrays only ever hold ``bytes``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Final

import numpy as np

from flowserve.errors import WireError

MAGIC: Final = b"FST1"
MAX_RANK: Final = 16

#: V2 datatype name -> numpy dtype (little-endian). BYTES maps to object arrays of ``bytes``.
DATATYPES: Final[dict[str, np.dtype]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
_CODES: Final = {name: i for i, name in enumerate(DATATYPES)}
_NAMES: Final = list(DATATYPES)
_HEAD = struct.Struct("<4sH")
_DIM = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


_BY_DTYPE: Final = {dtype: name for name, dtype in DATATYPES.items() if name != "BYTES"}
_BY_DTYPE.update({dtype.newbyteorder(">"): name for dtype, name in list(_BY_DTYPE.items())})


def datatype_of(array: np.ndarray) -> str:
    """The V2 datatype name of a numpy array (``BYTES`` for object/str/bytes arrays)."""
    name = _BY_DTYPE.get(array.dtype)
    if name is not None:
        return name
    if array.dtype.kind in "OSU":
        return "BYTES"
    raise WireError(f"numpy dtype {array.dtype} has no V2 datatype")


def as_bytes_array(array: np.ndarray) -> np.ndarray:
    """Normalise str/bytes arrays to an object array of ``bytes`` (the BYTES representation)."""
    if array.dtype == object and all(isinstance(v, bytes) for v in array.flat):
        return array
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for i, v in enumerate(array.reshape(-1)):
        if isinstance(v, bytes):
            flat[i] = v
        elif isinstance(v, str):
            flat[i] = v.encode()
        else:
            raise WireError(f"BYTES tensor holds a {type(v).__name__}, expected bytes or str")
    return out


def _encode_bytes_payload(array: np.ndarray) -> bytes:
    parts: list[bytes] = []
    for v in as_bytes_array(array).reshape(-1):
        parts.append(_U32.pack(len(v)))
        parts.append(v)
    return b"".join(parts)


def encode_payload(array: np.ndarray, datatype: str | None = None) -> bytes:
    """One tensor's payload: row-major little-endian values; for BYTES a u32 length before each element.

    This is also the raw layout of the V2 binary tensor data extension (:func:`flowserve.wire.v2.encode_raw`).
    """
    datatype = datatype or datatype_of(array)
    if datatype == "BYTES":
        return _encode_bytes_payload(array)
    return array.astype(DATATYPES[datatype], copy=False).tobytes()


_PREFIXES: dict[tuple[str, str, int], bytes] = {}


def _prefix(name: str, datatype: str, rank: int) -> bytes:
    # name, code and rank bytes of a tensor header; cached since a worker encodes the same ports forever.
    key = (name, datatype, rank)
    prefix = _PREFIXES.get(key)
    if prefix is None:
        raw_name = name.encode()
        if len(raw_name) > 255:
            raise WireError(f"tensor name '{name[:40]}...' is longer than 255 bytes")
        if rank > MAX_RANK:
            raise WireError(f"tensor '{name}' has rank {rank}, more than {MAX_RANK}")
        prefix = bytes((len(raw_name),)) + raw_name + bytes((_CODES[datatype], rank))
        if len(_PREFIXES) < 4096:
            _PREFIXES[key] = prefix
    return prefix


def encode_tensors(tensors: Mapping[str, np.ndarray]) -> bytes:
    """Encode named arrays into one frame."""
    if len(tensors) > 0xFFFF:
        raise WireError(f"{len(tensors)} tensors do not fit one frame (at most {0xFFFF})")
    parts = [_HEAD.pack(MAGIC, len(tensors))]
    for name, array in tensors.items():
        datatype = datatype_of(array)
        prefix = _prefix(name, datatype, array.ndim)
        payload = encode_payload(array, datatype)
        parts.append(prefix)
        parts.append(struct.pack(f"<{array.ndim}qQ", *array.shape, len(payload)))
        parts.append(payload)
    return b"".join(parts)


def _decode_bytes_payload(buf: memoryview, count: int, name: str) -> np.ndarray:
    out = np.empty(count, dtype=object)
    pos, end = 0, len(buf)
    for i in range(count):
        if pos + 4 > end:
            raise WireError(f"tensor '{name}': BYTES element {i} runs past the payload")
        (n,) = _U32.unpack_from(buf, pos)
        pos += 4
        if pos + n > end:
            raise WireError(f"tensor '{name}': BYTES element {i} of {n} bytes runs past the payload")
        out[i] = bytes(buf[pos : pos + n])
        pos += n
    if pos != end:
        raise WireError(f"tensor '{name}': {end - pos} stray bytes after {count} BYTES elements")
    return out


#: Validated single-tensor headers -> (name, dtype, shape, payload bytes). A stage sees the same few
#: layouts millions of times; a byte-exact header match skips re-parsing (the header was checked once).
_LAYOUTS: dict[bytes, tuple[str, np.dtype, tuple[int, ...], int]] = {}


def _cached_single(data: bytes) -> dict[str, np.ndarray] | None:
    if len(data) < 10 or data[4:6] != b"\x01\x00":
        return None
    name_len = data[6]
    rank_at = 8 + name_len
    if rank_at >= len(data):
        return None
    hlen = rank_at + 1 + 8 * data[rank_at] + 8
    layout = _LAYOUTS.get(data[:hlen])
    if layout is None or len(data) != hlen + layout[3]:
        return None
    name, dtype, shape, _ = layout
    return {name: np.frombuffer(data, dtype=dtype, offset=hlen).reshape(shape)}


def decode_tensors(data: bytes | bytearray | memoryview) -> dict[str, np.ndarray]:
    """Decode a frame into named arrays. Fixed-width arrays are read-only views of ``data``."""
    if type(data) is bytes:
        cached = _cached_single(data)
        if cached is not None:
            return cached
        out = _decode(data)
        if len(out) == 1:
            (name, array), = out.items()
            # BOOL payloads are value-checked on every decode, so they never take the cached path.
            if array.dtype.kind not in "Ob" and len(_LAYOUTS) < 4096:
                hlen = len(data) - array.nbytes
                _LAYOUTS[data[:hlen]] = (name, array.dtype, array.shape, array.nbytes)
        return out
    return _decode(data)


def _decode(data: bytes | bytearray | memoryview) -> dict[str, np.ndarray]:
    buf = memoryview(data)
    end = len(buf)
    if end < _HEAD.size:
        raise WireError(f"frame of {end} bytes is too short to be a tensor frame")
    magic, count = _HEAD.unpack_from(buf, 0)
    if magic != MAGIC:
        raise WireError(f"not a flowserve tensor frame (starts with {bytes(buf[:4])!r})")
    pos = _HEAD.size
    out: dict[str, np.ndarray] = {}
    for _ in range(count):
        if pos >= end:
            raise WireError("frame ends before all its tensors")
        name_len = buf[pos]
        pos += 1
        if pos + name_len + 2 > end:
            raise WireError("frame ends inside a tensor name")
        try:
            name = bytes(buf[pos : pos + name_len]).decode()
        except UnicodeDecodeError as exc:
            raise WireError("tensor name is not UTF-8") from exc
        pos += name_len
        code, rank = buf[pos], buf[pos + 1]
        pos += 2
        if code >= len(_NAMES):
            raise WireError(f"tensor '{name}': unknown datatype code {code}")
        if rank > MAX_RANK:
            raise WireError(f"tensor '{name}': rank {rank} is more than {MAX_RANK}")
        if pos + 8 * rank + 8 > end:
            raise WireError(f"tensor '{name}': frame ends inside its shape")
        shape = struct.unpack_from(f"<{rank}q", buf, pos)
        pos += 8 * rank
        (nbytes,) = _U64.unpack_from(buf, pos)
        pos += 8
        if any(d < 0 for d in shape):
            raise WireError(f"tensor '{name}': negative dimension in shape {list(shape)}")
        if pos + nbytes > end:
            raise WireError(f"tensor '{name}': payload of {nbytes} bytes runs past the frame")
        payload = buf[pos : pos + nbytes]
        pos += nbytes
        datatype = _NAMES[code]
        count_elems = 1
        for d in shape:
            count_elems *= d
        if datatype == "BYTES":
            if count_elems * 4 > nbytes:  # every element needs its u32 length: check before allocating
                raise WireError(
                    f"tensor '{name}': shape {list(shape)} of BYTES needs at least {count_elems * 4} bytes, "
                    f"payload has {nbytes}"
                )
            flat = _decode_bytes_payload(payload, count_elems, name)
        else:
            dtype = DATATYPES[datatype]
            if count_elems * dtype.itemsize != nbytes:
                raise WireError(
                    f"tensor '{name}': shape {list(shape)} of {datatype} needs "
                    f"{count_elems * dtype.itemsize} bytes, payload has {nbytes}"
                )
            if datatype == "BOOL" and bytes(payload).translate(None, b"\x00\x01"):
                raise WireError(f"tensor '{name}': BOOL payload holds bytes other than 0 and 1")
            flat = np.frombuffer(payload, dtype=dtype)
        try:
            array = flat.reshape(shape)
        except ValueError as exc:  # e.g. [0, 2**62, 2**62]: no elements, but numpy refuses the shape
            raise WireError(f"tensor '{name}': shape {list(shape)} is not a valid array shape: {exc}") from None
        if name in out:
            raise WireError(f"tensor '{name}' appears twice in one frame")
        out[name] = array
    if pos != end:
        raise WireError(f"{end - pos} stray bytes after the last tensor")
    return out


def encode_split(name: str, array: np.ndarray, parts: int) -> list[bytes] | None:
    """Frames of one tensor each for ``parts`` equal slices of ``array`` along axis 0, or None.

    The batch-native encoder: one header and one ``tobytes`` for the whole batch, then a byte slice per
    request. Returns None where it does not apply (BYTES, or rows not divisible into equal parts).
    """
    datatype = datatype_of(array)
    if datatype == "BYTES" or parts <= 0 or array.ndim == 0 or array.shape[0] % parts:
        return None
    rows = array.shape[0] // parts
    buf = array.astype(DATATYPES[datatype], copy=False).tobytes()
    chunk = len(buf) // parts
    head = (_HEAD.pack(MAGIC, 1) + _prefix(name, datatype, array.ndim)
            + struct.pack(f"<{array.ndim}qQ", rows, *array.shape[1:], chunk))
    return [head + buf[i * chunk : (i + 1) * chunk] for i in range(parts)]
